"""Model checkpoints: safetensors files carrying their own ModelSpec, strict loading with a report.

Nothing here unpickles arbitrary objects: safetensors holds only tensors, and foreign .pth/.bin
files are read with torch.load(weights_only=True).

Every file linvit writes carries a SHA-256 of its tensors (names, dtypes, shapes, bytes) in its
metadata, checked on every read: a truncated, zeroed or otherwise changed tensor is refused, never
trained on or reported. Foreign safetensors files (no linvit metadata) load unchecked.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

from linvit.errors import CheckpointError
from linvit.io import write_atomic
from linvit.models.attention_copy import MAPS_KEY, drive_with_teacher
from linvit.models.spec import ModelSpec
from linvit.models.vit import LinvitViT, create_vit

SPEC_KEY = "linvit_spec"
DIGEST_KEY = "linvit_tensors_sha256"
FORMAT_KEY = "format"                 # training checkpoints (linvit.runs.state) set it
HEAD_KEY = "linvit_head"              # imported teachers: "trained", "new" or "none" (headless)
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt")
# Wrappers that training scripts (DeiT, MAE, timm's train.py, Lightning) put around a state dict.
WRAPPER_KEYS = ("model", "state_dict", "model_ema", "state_dict_ema", "module")



def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    """Atomically write tensors with their digest; metadata values must be strings."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta = {**metadata, DIGEST_KEY: tensor_digest(tensors)}
    write_atomic(path, lambda p: save_file(tensors, str(p), metadata=meta))


def load_tensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and raw metadata of a safetensors file, its digest verified when it has one
    (every file linvit writes does: a linvit file without one is refused)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file, possibly truncated "
                              f"({e}); regenerate it") from None
    expected = meta.get(DIGEST_KEY)
    linvit_file = SPEC_KEY in meta or str(meta.get(FORMAT_KEY, "")).startswith("linvit-")
    if expected is None and linvit_file:          # (huggingface writes format=pt: not ours)
        raise CheckpointError(f"{path}: a linvit file without a tensor checksum (written by an "
                              "older linvit, or edited); regenerate it")
    if expected is not None and tensor_digest(tensors) != expected:
        raise CheckpointError(f"{path}: its tensors do not match the checksum written with them "
                              "(the file is corrupted or was changed); regenerate it")
    return tensors, meta


def read_state_dict(path: str | Path, wrappers: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """A file's tensors: safetensors, or a torch file read with weights_only (no pickled code),
    its state dict found under `wrappers`, then WRAPPER_KEYS, with `module.` removed."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        return load_tensors(path)[0]
    if path.suffix not in TORCH_SUFFIXES:
        raise CheckpointError(f"{path}: unknown checkpoint format {path.suffix!r}; expected "
                              f".safetensors or one of {', '.join(TORCH_SUFFIXES)}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError and friends
        raise CheckpointError(f"{path}: cannot be read with weights_only=True (it may hold "
                              f"pickled code, which linvit refuses to run): "
                              f"{_unpickler_reason(e)}") from None
    return _unwrap(obj, path, wrappers + WRAPPER_KEYS)


def _unpickler_reason(error: Exception) -> str:
    """The line of torch's long weights-only message that names what was refused."""
    text = str(error)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation")[0]
    return " ".join(text.split())[:300] or type(error).__name__


def _unwrap(obj, path: Path, wrappers: tuple[str, ...]) -> dict[str, torch.Tensor]:
    while isinstance(obj, dict):
        inner = next((obj[k] for k in wrappers if isinstance(obj.get(k), dict)), None)
        if inner is None:
            break
        obj = inner
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{path}: holds no state dict")
    bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: entries that are not tensors: {bad[:5]}")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def mismatch_report(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, list]:
    own = model.state_dict()
    return {
        "missing": sorted(set(own) - set(state_dict)),
        "unexpected": sorted(set(state_dict) - set(own)),
        "shape": sorted(f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
                        for k, v in own.items()
                        if k in state_dict and state_dict[k].shape != v.shape),
    }


def load_strict(model: nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Load every tensor or fail naming each missing, unexpected and mis-shaped key."""
    report = mismatch_report(model, state_dict)
    problems = [f"{kind} ({len(keys)}): {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                for kind, keys in report.items() if keys]
    if problems:
        raise CheckpointError(f"{source} does not fit the model:\n  " + "\n  ".join(problems))
    model.load_state_dict(state_dict, strict=True)


def save_model(model: LinvitViT, path: str | Path, metadata: dict | None = None) -> None:
    if not isinstance(model, LinvitViT):
        raise TypeError(f"save_model takes a model built by create_vit, got {type(model).__name__}")
    spec = model.spec
    meta = {SPEC_KEY: json.dumps(spec.as_dict(), sort_keys=True)}
    meta.update({k: json.dumps(v, sort_keys=True) for k, v in (metadata or {}).items()})
    save_tensors(path, model.state_dict(), meta)


def read_metadata(path: str | Path) -> dict:
    """The metadata of a safetensors file (values as strings; no tensor is read)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            return dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file, possibly truncated "
                              f"({e}); regenerate it") from None


def head_state(path: str | Path) -> str:
    """Whether a model file's classifier is trained: "new" or "none" for imported teachers whose
    checkpoint had no usable head (until a stage trains one), else "trained"."""
    raw = read_metadata(path).get(HEAD_KEY)
    return json.loads(raw) if raw else "trained"


def read_spec(path: str | Path) -> ModelSpec:
    """The ModelSpec a linvit model file carries, checked field by field (no tensor is read)."""
    raw = read_metadata(path).get(SPEC_KEY)
    if raw is None:
        raise CheckpointError(f"{path}: no linvit model spec in its metadata; import foreign "
                              "weights with `linvit import-teacher` first")
    try:
        spec = ModelSpec.from_dict(json.loads(raw))
        spec.check()
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: its linvit model spec is not valid ({e})") from None
    return spec


def load_model(path: str | Path) -> LinvitViT:
    """Rebuild a model from a linvit checkpoint (and, for a student trained on its teacher's
    attention maps, that teacher, which its metadata names)."""
    model = create_vit(read_spec(path))
    load_strict(model, read_state_dict(path), str(path))
    teacher = read_metadata(path).get(MAPS_KEY)
    if teacher is None:
        return model
    teacher = json.loads(teacher)
    if not Path(teacher).is_file():
        raise CheckpointError(f"{path}: its attention maps come from its teacher {teacher} "
                              "(attention transfer, copy mode), which is not found; it cannot "
                              "run without it")
    return drive_with_teacher(model, load_model(teacher))


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
        return loaded, {"source": f"timm-pretrained {timm_name or ''}".strip(),
                        "head": _head_state(spec, timm_name)}
    state, dropped = LAYOUTS[layout].convert(read_state_dict(file, LAYOUTS[layout].wrappers))
    state = checkpoint_filter_fn(state, model)
    report = {"source": str(file), "layout": layout, "dropped": dropped, "reset": [],
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
    return model, report


def _head_state(spec: ModelSpec, name: str | None) -> str:
    """What head timm's loader leaves: none (headless spec), trained (the pretrained classes are
    the spec's), or new (timm drops a head of another class count; self-supervised tags have
    none)."""
    import timm

    from linvit.models.sizes import get_size

    if spec.num_classes == 0:
        return "none"
    cfg = timm.models.get_pretrained_cfg(name or get_size(spec.size).timm_name)
    return "trained" if getattr(cfg, "num_classes", None) == spec.num_classes else "new"


def _timm_pretrained(spec: ModelSpec, overlay: dict | None = None,
                     name: str | None = None) -> LinvitViT:
    """timm's own loader (its cache, the hub, or overlay={'file': ...}) for `name` (default: the
    size's DeiT); timm loads strictly, except that it drops a pretrained head whose class count
    differs from spec.num_classes."""
    import timm

    from linvit.attention import operator_class
    from linvit.models.sizes import get_size

    size = get_size(spec.size)
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
