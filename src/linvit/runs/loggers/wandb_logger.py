"""Weights & Biases: offline into the run folder's wandb/ unless WANDB_MODE says otherwise
(`wandb sync` uploads an offline run later; WANDB_MODE=online logs live)."""
from __future__ import annotations

import os
from pathlib import Path

import wandb


class WandbLogger:
    def __init__(self, folder: Path, run_name: str, config: dict):
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(dir=str(folder), name=run_name, config=config,
                              project=os.environ.get("WANDB_PROJECT", "linvit"),
                              mode=os.environ.get("WANDB_MODE", "offline"),
                              reinit="create_new",
                              settings=wandb.Settings(console="off", silent=True))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def open_logger(folder: Path, run_name: str, config: dict, start_step: int) -> WandbLogger:
    return WandbLogger(folder, run_name, config)
