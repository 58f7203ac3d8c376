"""Grid configs the workflow tests share: the shipped default and a teacher-axis grid."""
from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def default_config() -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config.setdefault("teachers", {})
    return config


def teacher_axis_config(tmp_path) -> dict:
    """The default grid with three teachers: pretrained at the student size, pretrained wider and
    selected down, and imported timm weights given a head by a linear probe."""
    weights = tmp_path / "deit.safetensors"
    weights.write_bytes(b"")
    config = {**default_config(), "operators": ["linear"], "loss_grid": None, "dense": None,
              "teachers": {"pretrain": {"source": "pretrain"},
                           "wide": {"source": "pretrain", "size": "cpu192",
                                    "students": ["cpu96"]},
                           "deit": {"source": "timm", "size": "cpu96", "file": str(weights),
                                    "headless": True, "layout": "mocov3",
                                    "probe": {"mode": "linear",
                                              "optim": {"epochs": 1, "warmup_epochs": 0}}}}}
    return {k: v for k, v in config.items() if v is not None}
