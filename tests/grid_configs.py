"""Grid configs the workflow tests share: the shipped default and a teacher-axis grid."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def default_config() -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config.setdefault("teachers", {})
    return config


def loss_grid_config() -> dict:
    """The default grid with the loss-design sub-grid of the paper config: `map` and `map+out`
    for copy_mlp+distill on linear."""
    return {**default_config(),
            "losses": {"out": {"attn_out_mse": 1.0}, "map": {"attn_map_ce": 1.0},
                       "map+out": {"attn_map_ce": 1.0, "attn_out_mse": 1.0}},
            "loss_grid": {"operators": ["linear"], "strategies": ["copy_mlp+distill"],
                          "losses": ["map", "map+out"]}}


def mocov3_backbone(path: Path) -> Path:
    """A headless cpu96 backbone for 28 px grey images in MoCo v3's layout (the encoder under
    module.base_encoder., a projection MLP as its head), as `import-teacher` reads it."""
    import torch

    from linvit.models import ModelSpec, create_vit

    backbone = create_vit(ModelSpec("cpu96", "softmax", 0, 28, 1)).state_dict()
    state = {f"module.base_encoder.{k}": v for k, v in backbone.items()}
    state["module.base_encoder.head.0.weight"] = torch.zeros(256, 96)
    torch.save({"epoch": 1, "state_dict": state}, path)
    return path


def teacher_axis_config(tmp_path) -> dict:
    """The default grid with three teachers: pretrained at the student size, pretrained wider and
    selected down, and imported timm weights given a head by a linear probe."""
    weights = mocov3_backbone(tmp_path / "deit.pth")
    config = {**default_config(), "operators": ["linear"], "loss_grid": None, "dense": None,
              "teachers": {"pretrain": {"source": "pretrain"},
                           "wide": {"source": "pretrain", "size": "cpu192",
                                    "students": ["cpu96"]},
                           "deit": {"source": "timm", "size": "cpu96", "file": str(weights),
                                    "headless": True, "layout": "mocov3",
                                    "probe": {"mode": "linear",
                                              "optim": {"epochs": 1, "warmup_epochs": 0}}}}}
    return {k: v for k, v in config.items() if v is not None}
