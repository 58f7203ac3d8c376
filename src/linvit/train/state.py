"""Training checkpoints in safetensors: model, optimizer and scheduler state, epoch and history.

Tensors go in as tensors (model.*, optim.<param>.<key>); everything else (param groups, scheduler
state, the per-epoch history) goes in the metadata as JSON, so loading never unpickles anything.
Random state needs no saving: every epoch reseeds from (seed, epoch, rank), see runtime.epoch_seed.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

from linvit.io import write_atomic
from linvit.models.checkpoint import CheckpointError, load_strict

FORMAT = "linvit-train-state-1"


def save_state(path: str | Path, model: nn.Module, optimizer, scheduler, epoch: int,
               history: list[dict], info: dict) -> None:
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    opt = optimizer.state_dict()
    scalars: dict = {}
    for pid, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = value
    meta = {
        "format": FORMAT,
        "epoch": json.dumps(epoch),
        "optim_groups": json.dumps(opt["param_groups"]),
        "optim_scalars": json.dumps(scalars),
        "scheduler": json.dumps(scheduler.state_dict()),
        "history": json.dumps(history),
        "info": json.dumps(info, sort_keys=True),
        "rng": "reseeded each epoch from (seed, epoch, rank)",
    }
    write_atomic(path, lambda p: save_file(tensors, str(p), metadata=meta))


def load_state(path: str | Path, model: nn.Module, optimizer, scheduler,
               expect_info: dict) -> tuple[int, list[dict]]:
    """Restore in place; returns (epochs done, history). Fails if the run's identity differs."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a linvit training checkpoint")
    info = json.loads(meta["info"])
    if info != json.loads(json.dumps(expect_info, sort_keys=True)):
        raise CheckpointError(f"{path}: belongs to another run ({info}); remove it to restart")
    tensors = load_file(str(path))
    load_strict(model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, str(path))
    state: dict = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = value
    for pid, scalars in json.loads(meta["optim_scalars"]).items():
        state.setdefault(int(pid), {}).update(scalars)
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(meta["optim_groups"])})
    scheduler.load_state_dict(json.loads(meta["scheduler"]))
    return json.loads(meta["epoch"]), json.loads(meta["history"])
