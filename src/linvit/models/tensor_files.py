"""Tensor files: the safetensors files linvit writes (each with a SHA-256 of its tensors, checked on
every read) and the foreign ones it reads (safetensors, or torch files read with
torch.load(weights_only=True): no pickled code runs).

A truncated, zeroed or otherwise changed tensor in a linvit file is refused, never trained on or
reported. Foreign safetensors files (no linvit metadata) load unchecked.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save

from linvit.errors import CheckpointError
from linvit.io import write_atomic

SPEC_KEY = "linvit_spec"
DIGEST_KEY = "linvit_tensors_sha256"
FORMAT_KEY = "format"                 # training checkpoints (linvit.runs.state) set it
HEAD_KEY = "linvit_head"              # imported teachers: "trained", "new" or "none" (headless)
ORIGIN_KEY = "linvit_origin"          # the foreign weights a model descends from (import-teacher)
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".tar")   # .pth.tar: MoCo v3, DeiT
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
    """Atomically write tensors with their digest; metadata values must be strings. The same
    tensors and metadata give the same bytes (canonical_safetensors)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta = {**metadata, DIGEST_KEY: tensor_digest(tensors)}
    data = canonical_safetensors(save(tensors, metadata=meta))
    write_atomic(path, lambda p: Path(p).write_bytes(data))


def canonical_safetensors(data: bytes) -> bytes:
    """A safetensors file with its JSON header in one fixed form (keys sorted, no spaces, padded
    to 8 bytes as the format asks): the library writes the metadata in hash order, which varies
    from process to process. The tensor bytes and their offsets are untouched."""
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8:8 + n]), sort_keys=True, separators=(",", ":"))
    header = header.encode() + b" " * (-len(header.encode()) % 8)
    return len(header).to_bytes(8, "little") + header + data[8 + n:]


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
