"""Teachers from timm: a local checkpoint file converted from its key layout (linvit.models.layouts)
and translated by timm's own filter, or timm's pretrained loader (cache or network)."""
from __future__ import annotations

from pathlib import Path

from linvit.errors import CheckpointError
from linvit.io import sha256_file
from linvit.models.checkpoint import load_strict, refuse_non_finite
from linvit.models.spec import ModelSpec
from linvit.models.tensor_files import read_state_dict
from linvit.models.vit import LinvitViT, create_vit


def import_timm_weights(spec: ModelSpec, file: str | Path | None = None,
                        reset_head: bool = False, layout: str = "timm",
                        timm_name: str | None = None) -> tuple[LinvitViT, dict]:
    """A softmax teacher from ViT weights: a local file in one of linvit.models.layouts, or
    timm's own pretrained loader (timm_name, default the size's).

    The layout's conversion, then timm's checkpoint_filter_fn (original DeiT/JAX names, position
    embeddings of another grid), then a strict load. A checkpoint without a classifier (self-
    supervised) needs reset_head, or spec.num_classes 0 (headless). Returns the model and an
    import report: dropped keys, reset keys and whether the head is trained ("head").
    """
    from timm.models.vision_transformer import checkpoint_filter_fn

    from linvit.models.layouts import LAYOUTS

    if spec.operator != "softmax":
        raise CheckpointError("only softmax teachers are imported from timm weights")
    model = create_vit(spec)
    if file is None:
        loaded = _timm_pretrained(spec, name=timm_name)
        refuse_non_finite(loaded.state_dict(), f"timm's {timm_name or spec.size} weights")
        return loaded, {"source": f"timm-pretrained {timm_name or ''}".strip(),
                        "head": _head_state(spec, timm_name)}
    state, dropped = LAYOUTS[layout].convert(read_state_dict(file, LAYOUTS[layout].wrappers))
    state = checkpoint_filter_fn(state, model)
    report = {"source": str(file), "sha256": sha256_file(file), "layout": layout,
              "dropped": dropped, "reset": [],
              "head": "none" if spec.num_classes == 0 else "trained"}
    own = model.state_dict()
    heads = sorted(k for k in own if k.startswith("head."))
    if heads and (reset_head or not any(k in state for k in heads)):
        if not reset_head:
            raise CheckpointError(f"{file}: no classifier head (a self-supervised backbone?); "
                                  "set reset_head=true for a new head to train (linvit probe), "
                                  "or import it headless")
        for key in heads:
            if key not in state or state[key].shape != own[key].shape:
                report["reset"].append(key)
                state[key] = own[key]
        if report["reset"]:
            report["head"] = "new"
    load_strict(model, state, str(file))
    refuse_non_finite(model.state_dict(), str(file))
    return model, report


def _head_state(spec: ModelSpec, name: str | None) -> str:
    """What head timm's loader leaves: none (headless spec), trained (the pretrained classes are
    the spec's), or new (timm drops a head of another class count; self-supervised tags have
    none)."""
    import timm

    if spec.num_classes == 0:
        return "none"
    cfg = timm.models.get_pretrained_cfg(name or spec.model_size.timm_name)
    return "trained" if getattr(cfg, "num_classes", None) == spec.num_classes else "new"


def _timm_pretrained(spec: ModelSpec, overlay: dict | None = None,
                     name: str | None = None) -> LinvitViT:
    """timm's own loader (its cache, the hub, or overlay={'file': ...}) for `name` (default: the
    size's DeiT); timm loads strictly, except that it drops a pretrained head whose class count
    differs from spec.num_classes."""
    import timm

    from linvit.attention import operator_class

    size = spec.model_size
    name = name or size.timm_name
    if name is None:
        raise CheckpointError(f"size {spec.size!r} has no timm pretrained weights; pass a file")
    try:
        loaded = timm.create_model(name, pretrained=True, num_classes=spec.num_classes,
                                  img_size=spec.img_size, in_chans=spec.in_chans,
                                  attn_layer=operator_class("softmax"),
                                  pretrained_cfg_overlay=overlay)
    except (OSError, RuntimeError, ValueError) as e:   # no network, no cache, a bad file
        raise CheckpointError(f"timm could not load pretrained weights for {name} "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}); "
                              "offline, pass file=<a local checkpoint> instead") from None
    model = create_vit(spec)             # the same tensors, in the model that carries its spec
    load_strict(model, loaded.state_dict(), name)
    return model
