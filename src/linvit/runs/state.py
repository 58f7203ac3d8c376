"""Training checkpoints in safetensors: model, optimizer and scheduler state, epoch and history.

Tensors go in as tensors (model.*, optim.<param>.<key>); everything else (param groups, scheduler
state, the per-epoch history) goes in the metadata as JSON, so loading never unpickles anything.
At an epoch's end random state needs no saving: every epoch reseeds from (seed, epoch, rank), see
runtime.epoch_seed. A checkpoint taken inside an epoch (a preemption, linvit.runs.preempt) also
holds its `position`: the step, the epoch's running sums and the generators' states.
The file carries a checksum of its tensors (linvit.models.checkpoint), verified before a resume.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from linvit.errors import CheckpointError
from linvit.models.checkpoint import load_strict
from linvit.models.tensor_files import load_tensors, save_tensors

FORMAT = "linvit-train-state-2"       # 2: with a tensor checksum


def save_state(path: str | Path, model: nn.Module, optimizer, scheduler, epoch: int,
               history: list[dict], info: dict, ema: nn.Module | None = None,
               position: dict | None = None) -> None:
    """`ema`: the model's exponential moving average (timm's ModelEmaV3), saved beside it.
    `position`: inside epoch `epoch` (0-based, unfinished), {"step", "sums", "count", "rng"},
    "rng" a list of every process's generators (linvit.runs.preempt.rng_states), rank order."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if ema is not None:
        tensors.update({f"ema.{k}": v.detach().cpu().contiguous()
                        for k, v in ema.module.state_dict().items()})
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
    if position is not None:            # "rng": per process, in rank order
        tensors.update({f"position.sums.{k}": v.detach().cpu().reshape(1)
                        for k, v in position["sums"].items()})
        tensors["position.count"] = position["count"].detach().cpu().reshape(1)
        for rank, (rng_tensors, _) in enumerate(position["rng"]):
            tensors.update({f"position.rng.{rank}.{k}": v for k, v in rng_tensors.items()})
        meta["position"] = json.dumps({"step": position["step"],
                                       "rng": [m for _, m in position["rng"]]})
    save_tensors(path, tensors, meta)


def read_state(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A training checkpoint's tensors and metadata, its checksum verified."""
    tensors, meta = load_tensors(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a linvit training checkpoint of this version "
                              f"(format {meta.get('format')!r}, expected {FORMAT!r})")
    return tensors, meta


def started_precision(path: str | Path) -> str | None:
    """The precision the run of this training checkpoint trained in (None: not recorded). Read
    from the header alone; load_state verifies the whole file when it resumes."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    return json.loads(meta.get("info", "{}")).get("precision")


def check_identity(path: str | Path, meta: dict[str, str], identity: dict) -> None:
    """CheckpointError unless the checkpoint was written by the run of this identity: its config
    and, where `identity` names one, the precision its training step ran in (run.amp=auto decides
    that by the machine, so a run moved to another machine may not continue in another precision
    unnoticed)."""
    saved, want = json.loads(meta["info"]), json.loads(json.dumps(identity, sort_keys=True))
    if "precision" not in saved:
        raise CheckpointError(f"{path}: written before linvit recorded the training precision; "
                              "not continued in a precision it may not have had")
    if "precision" not in want:         # the run folder's check, before there is a runtime
        saved = _without_precision(saved)
    if saved == want:
        return
    if _without_precision(saved) == _without_precision(want):
        raise CheckpointError(
            f"{path}: trained in {saved['precision']}; this "
            f"process would continue in {want.get('precision')}: not continued in another "
            "precision (--rerun starts it over)")
    raise CheckpointError(f"{path}: belongs to another run (written under another config)")


def _without_precision(identity: dict) -> dict:
    return {k: v for k, v in identity.items() if k != "precision"}


def load_state(path: str | Path, model: nn.Module, optimizer, scheduler,
               expect_info: dict, ema: nn.Module | None = None,
               positions: list | None = None) -> tuple[int, list[dict]]:
    """Restore in place; returns (epochs done, history). Fails if the run's identity differs.
    A checkpoint taken inside an epoch appends its position to `positions` (save_state's
    `position`, its sums and states as tensors and JSON), the epoch then being the one it
    stopped in."""
    tensors, meta = read_state(path)
    check_identity(path, meta, expect_info)
    load_strict(model, {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, str(path))
    if ema is not None:
        load_strict(ema.module, {k[4:]: v for k, v in tensors.items() if k.startswith("ema.")},
                    f"{path} (its EMA)")
    state: dict = {}
    for name, value in tensors.items():
        if name.startswith("optim."):                     # (model.* and ema.* read above)
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = value
    for pid, scalars in json.loads(meta["optim_scalars"]).items():
        state.setdefault(int(pid), {}).update(scalars)
    optimizer.load_state_dict({"state": state, "param_groups": json.loads(meta["optim_groups"])})
    scheduler.load_state_dict(json.loads(meta["scheduler"]))
    if "position" in meta and positions is not None:
        where = json.loads(meta["position"])
        part = {k.removeprefix("position."): v for k, v in tensors.items()
                if k.startswith("position.")}
        positions.append({
            "step": where["step"], "count": part["count"][0],
            "sums": {k.removeprefix("sums."): v[0] for k, v in part.items()
                     if k.startswith("sums.")},
            "rng": _rng_of_ranks(part, where["rng"])})
    return json.loads(meta["epoch"]), json.loads(meta["history"])


def _rng_of_ranks(part: dict[str, torch.Tensor], meta) -> list[tuple[dict, dict]]:
    """Each process's generators of a position (tensors rng.<rank>.<name>); a checkpoint from
    before they were kept per process holds the main process's alone (rng.<name>, one dict)."""
    if isinstance(meta, dict):             # rank None: whichever process count resumes it
        return [({k.removeprefix("rng."): v for k, v in part.items()
                  if k.startswith("rng.")}, {**meta, "rank": None})]
    return [({k.removeprefix(f"rng.{rank}."): v for k, v in part.items()
              if k.startswith(f"rng.{rank}.")}, of_rank) for rank, of_rank in enumerate(meta)]
