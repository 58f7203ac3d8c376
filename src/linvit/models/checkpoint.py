"""Model files: safetensors files carrying their own ModelSpec (linvit.models.tensor_files: the
format and its checksum), strict loading with a report, the head's state, and rebuilding a model
from its file."""
from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import safe_open
from torch import nn

from linvit.errors import CheckpointError
from linvit.models.attention_copy import MAPS_KEY, drive_with_teacher
from linvit.models.spec import ModelSpec
from linvit.models.tensor_files import (
    HEAD_KEY,
    ORIGIN_KEY,
    SPEC_KEY,
    read_state_dict,
    save_tensors,
)
from linvit.models.vit import LinvitViT, create_vit


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
    return read_header(path)[0]


def read_header(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A safetensors file's metadata and its tensors as empty meta tensors of their shapes, from
    one read of its header (no tensor data, no checksum)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            shapes = {k: torch.empty(f.get_slice(k).get_shape(), device="meta")
                      for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
            return dict(f.metadata() or {}), shapes
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file, possibly truncated "
                              f"({e}); regenerate it") from None


class ModelFile:
    """One linvit model file, opened once by a stage: its header (metadata, tensor shapes) read on
    opening, its spec, head state and provenance read from that, its tensors read (and checked
    against their checksum) the first time they are asked for, then kept. A stage passes it along
    instead of the path, so that each check does not read the file again."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.metadata, self.shapes = read_header(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def _json(self, key: str):
        raw = self.metadata.get(key)
        return None if raw is None else json.loads(raw)

    @functools.cached_property
    def spec(self) -> ModelSpec:
        """The ModelSpec the file carries, checked field by field."""
        raw = self.metadata.get(SPEC_KEY)
        if raw is None:
            raise CheckpointError(f"{self.path}: no linvit model spec in its metadata; import "
                                  "foreign weights with `linvit import-teacher` first")
        try:
            spec = ModelSpec.from_dict(json.loads(raw))
            spec.check()
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{self.path}: its linvit model spec is not valid ({e})") \
                from None
        return spec

    @property
    def head(self) -> str:
        """Whether its classifier is trained: "new" or "none" for imported teachers whose
        checkpoint had no usable head (until a stage trains one), else "trained"."""
        return self._json(HEAD_KEY) or "trained"

    @property
    def maps_teacher(self) -> str | None:
        """The teacher whose attention maps drive it (attention transfer, copy mode), if any."""
        return self._json(MAPS_KEY)

    @functools.cached_property
    def state(self) -> dict[str, torch.Tensor]:
        """Its tensors, read once; NaN or infinite ones are refused here, before any stage copies,
        distils or trains from them (a copy check would otherwise fail on NaN != NaN)."""
        state = read_state_dict(self.path)
        refuse_non_finite(state, str(self.path))
        return state

    def carried(self, head: bool = True) -> dict:
        """What a model made from this one (a selection, a distillation) must say of it, for the
        stages after it to check: the state of its head (unless the stage trained its own), and
        the foreign weights it descends from, when it was imported (source, digest, layout), so
        a model's provenance travels with it through every stage."""
        origin = self._json(ORIGIN_KEY)
        return ({HEAD_KEY: self.head} if head else {}) | (
            {ORIGIN_KEY: origin} if origin else {})

    def check_teacher(self, field: str = "teacher") -> ModelSpec:
        """The one check of a teacher, for every stage that reads one: a linvit softmax model
        whose tensors are exactly a softmax model's of its spec (no extra or missing tensor),
        standing on its own (not a student driven by another teacher's maps). Returns its
        spec."""
        spec = self.spec
        if spec.operator != "softmax":
            raise CheckpointError(f"{field}: {self.path} is a {spec.operator} model; a teacher "
                                  "is a softmax ViT")
        if self.maps_teacher is not None:
            raise CheckpointError(f"{field}: {self.path} runs on its own teacher's attention "
                                  "maps (attention transfer, copy mode); it cannot teach "
                                  "attention")
        # the layout from the file's header: the stage's own load reads (and verifies) tensors
        report = mismatch_report(create_vit(spec), self.shapes)
        problems = [f"{kind}: {', '.join(keys[:5])}" for kind, keys in report.items() if keys]
        if problems:
            raise CheckpointError(f"{field}: {self.path} is not a softmax {spec.size} model "
                                  f"({'; '.join(problems)})")
        return spec

    def load(self) -> LinvitViT:
        """The model rebuilt (and, for a student trained on its teacher's attention maps, that
        teacher, which its metadata names)."""
        model = create_vit(self.spec)
        load_strict(model, self.state, str(self.path))
        teacher = self.maps_teacher
        if teacher is None:
            return model
        if not Path(teacher).is_file():
            raise CheckpointError(f"{self.path}: its attention maps come from its teacher "
                                  f"{teacher} (attention transfer, copy mode), which is not "
                                  "found; it cannot run without it")
        return drive_with_teacher(model, load_model(teacher))


def read_spec(path: str | Path) -> ModelSpec:
    """The ModelSpec a linvit model file carries (no tensor is read): ModelFile(path).spec."""
    return ModelFile(path).spec


def refuse_non_finite(state: dict, source: str) -> None:
    """NaN or infinite weights are refused by name (a model linvit reads or imports is finite)."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"{source}: non-finite weights (NaN or inf) in {len(bad)} "
                              f"tensor(s): {', '.join(bad[:5])}; a model linvit reads must be "
                              "finite")


def load_model(path: str | Path) -> LinvitViT:
    """Rebuild a model from a linvit checkpoint: ModelFile(path).load()."""
    return ModelFile(path).load()
