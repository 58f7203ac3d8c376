"""A linvit model in timm's and the Hugging Face Hub's conventions: the entrypoint that rebuilds
one from a `linvit export` folder's config.json (linvit.timm_hook registers it), its
pretrained_cfg, and the folder itself (model.safetensors and config.json as timm's save_for_hf
writes them)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from linvit.models.spec import ModelSpec
from linvit.timm_hook import ARCHITECTURE

SPEC_ARG = "linvit_spec"          # the model_args entry of config.json holding the spec


def pretrained_cfg(spec: ModelSpec, mean, std, label_names=()) -> dict:
    """timm's pretrained_cfg of a model of `spec` trained on images normalised by mean/std."""
    cfg = {"architecture": ARCHITECTURE, "num_classes": spec.num_classes,
           "input_size": (spec.in_chans, spec.img_size, spec.img_size),
           "fixed_input_size": True, "interpolation": "bicubic", "crop_pct": 1.0,
           "crop_mode": "center", "mean": tuple(mean), "std": tuple(std),
           "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit"}
    if label_names:
        cfg["label_names"] = list(label_names)
    return cfg


def build_for_timm(pretrained: bool = False, *, pretrained_cfg=None, linvit_spec=None,
                   **kwargs):
    """timm.create_model's path to a LinvitViT: the spec from config.json's model_args, the
    weights (pretrained=True) through timm's own loader (a local folder or the Hub; safetensors
    first), timm's usual overrides applied to the spec (num_classes: a new head; in_chans: the
    stem adapted; img_size; drop_path_rate)."""
    from timm.models import build_model_with_cfg

    if linvit_spec is None:
        raise ValueError(f"{ARCHITECTURE} is built from a `linvit export` folder: "
                         f"timm.create_model('local-dir:DIR') or ('hf-hub:ORG/NAME'); its "
                         f"config.json's model_args carry the spec ({SPEC_ARG})")
    spec = ModelSpec.from_dict(dict(linvit_spec))
    return build_model_with_cfg(_from_spec, ARCHITECTURE, pretrained,
                                pretrained_cfg=pretrained_cfg, spec=spec, **kwargs)


def _from_spec(spec: ModelSpec, num_classes=None, in_chans=None, img_size=None,
               drop_path_rate=None, global_pool=None, **unsupported):
    from linvit.models.vit import LinvitViT

    if unsupported:
        raise TypeError(f"{ARCHITECTURE} does not take {sorted(unsupported)}; it is built from "
                        "its linvit spec (num_classes, in_chans, img_size and drop_path_rate "
                        "may be changed)")
    changes = {"num_classes": num_classes, "in_chans": in_chans, "drop_path": drop_path_rate,
               "img_size": img_size if not isinstance(img_size, (tuple, list)) else img_size[0]}
    spec = dataclasses.replace(spec, **{k: v for k, v in changes.items() if v is not None})
    model = LinvitViT(spec)
    if global_pool is not None and global_pool != model.global_pool:
        # recorded by timm's writer for information; the spec decides the pooling
        raise TypeError(f"{ARCHITECTURE}: global_pool={global_pool!r}, but this spec pools "
                        f"{model.global_pool!r}")
    return model


def write_hf_folder(model, folder: Path, cfg: dict, metadata: dict) -> None:
    """model.safetensors (with linvit's spec in its metadata, so load_model reads it too) and
    config.json by timm's own writer, with the spec as the model_args timm passes back."""
    from timm.models import save_for_hf

    from linvit.models.checkpoint import save_model

    labels = cfg.get("label_names")
    model.pretrained_cfg = {k: v for k, v in cfg.items() if k != "label_names"}
    try:
        save_for_hf(model, str(folder), safe_serialization=True,
                    model_config={"label_names": labels} if labels else None,
                    model_args={SPEC_ARG: model.spec.as_dict()})
    finally:
        del model.pretrained_cfg
    # the same tensors again, with linvit's metadata (timm's loader reads the tensors alone)
    save_model(model, folder / "model.safetensors", metadata=metadata)

