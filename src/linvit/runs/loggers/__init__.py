"""Live curves: where a training run's numbers go while it trains (`run.loggers`).

Every logger takes named scalars at a global step, the optimizer updates so far: each step's
training loss and learning rate (`train/loss`, `train/lr`), and at the update that ends an epoch
that epoch's record of train.jsonl (`epoch/<key>`, the distillation's per-layer errors among them).
A resumed run first drops what the interrupted one logged after its last checkpoint, so that the
curves and train.jsonl hold the same epochs. Only the main process logs.

Adding a logger is one file with `open_logger(folder, name, config, start_step)` and one line here.
"""
from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from linvit.registry import Registry

log = logging.getLogger("linvit")


class Logger(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LoggerEntry:
    name: str
    folder: str          # inside the run folder: linvit's to replace with the run
    module: str          # imported only when a run asks for it
    package: str         # the pip package it needs
    imports: str         # the top-level module that package installs

    def check(self, where: str) -> None:
        """Before any compute: the package is installed (found, not imported)."""
        import importlib.util

        if importlib.util.find_spec(self.imports) is None:
            from linvit.errors import ConfigError
            raise ConfigError(f"{where}: {self.name} needs the package {self.package} (not "
                              f"installed); pip install {self.package}, or leave it out")

    def open(self, run_dir: Path, run_name: str, config: dict, start_step: int) -> Logger:
        try:
            module = importlib.import_module(self.module)
        except ImportError as e:
            from linvit.errors import ConfigError
            raise ConfigError(f"run.loggers: {self.name} needs the package {self.package} "
                              f"({e}); pip install {self.package}, or leave it out") from None
        return module.open_logger(Path(run_dir) / self.folder, run_name, config, start_step)


LOGGERS: Registry[LoggerEntry] = Registry.by_name(
    "logger",
    LoggerEntry("tensorboard", "tensorboard", "linvit.runs.loggers.tensorboard", "tensorboard",
                "tensorboard"),
    LoggerEntry("wandb", "wandb", "linvit.runs.loggers.wandb_logger", "wandb", "wandb"),
    LoggerEntry("mlflow", "mlruns", "linvit.runs.loggers.mlflow_logger", "mlflow-skinny",
                "mlflow"),
)


def scalars_of(record: dict, prefix: str) -> dict[str, float]:
    """The finite numbers of a record, nested keys joined by '/' (a list's items by index)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[name] = float(value)
        elif isinstance(value, dict):
            out.update(scalars_of(value, f"{name}/"))
        elif isinstance(value, list):
            out.update(scalars_of(dict(enumerate(value)), f"{name}/"))
    return out


class Loggers:
    """The run's loggers as one; per-step values are held as tensors and read every `every`
    steps (one device sync per flush, not per step)."""

    def __init__(self, loggers: list[Logger], every: int = 25):
        self.loggers, self.every, self._steps = loggers, every, []

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def step(self, update: int, loss, lr: float) -> None:
        if self.loggers:
            self._steps.append((update, loss.detach().float(), lr))
            if len(self._steps) >= self.every:
                self.flush()

    def flush(self) -> None:
        if not self._steps:
            return
        import torch

        losses = torch.stack([loss for _, loss, _ in self._steps]).tolist()   # one transfer
        for (update, _, lr), loss in zip(self._steps, losses):
            self.log({"train/loss": loss, "train/lr": lr}, update)
        self._steps = []

    def epoch(self, record: dict, update: int) -> None:
        self.flush()
        self.log(scalars_of(record, "epoch/"), update)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(scalars, step)

    def close(self) -> None:
        self.flush()
        for logger in self.loggers:
            logger.close()


def open_loggers(names: list[str], run_dir: Path, config: dict, start_step: int,
                 is_main: bool = True) -> Loggers:
    """The loggers `names` of the run in `run_dir`, which resumes after `start_step` updates."""
    if not is_main:
        return Loggers([])
    name = Path(run_dir).resolve().name
    return Loggers([LOGGERS[n].open(Path(run_dir), name, config, start_step) for n in names])


def tracking_uri(folder: Path) -> str:
    """MLflow's store: $MLFLOW_TRACKING_URI, else offline in `folder`, MLflow's file store (kept,
    in maintenance mode; a database store needs SQLAlchemy, which mlflow-skinny leaves out)."""
    import os

    if uri := os.environ.get("MLFLOW_TRACKING_URI"):
        return uri
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return Path(folder).resolve().as_uri()
