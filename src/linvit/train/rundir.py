"""A run's output folder: resolved config, log, per-epoch JSONL, checkpoint, final metrics.

    config.yaml             the resolved config (written first; a rerun must match it)
    run.log                 the log of every attempt
    train.jsonl             one JSON line per finished epoch (rewritten from the checkpoint)
    checkpoint.safetensors  training state after the last finished epoch (removed when done)
    model.safetensors       final weights with their ModelSpec
    metrics.json            final metrics, written last: its presence means the run is complete
"""
from __future__ import annotations

import json
import logging
import platform
import shutil
import sys
from pathlib import Path

import yaml

from linvit.io import write_json, write_text, write_yaml

# Fields that do not change results, so a rerun may differ in them.
VOLATILE = {("run", "progress"), ("run", "threads"), ("data", "workers")}

log = logging.getLogger("linvit")


def _identity(config: dict) -> dict:
    return {k: ({kk: vv for kk, vv in v.items() if (k, kk) not in VOLATILE}
                if isinstance(v, dict) else v) for k, v in config.items()}


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


class RunDir:
    def __init__(self, out: str | Path, stage: str, config: dict, replace: bool = False):
        self.path = Path(out)
        self.replace = replace
        self.stage = stage
        self.config = config
        self.checkpoint = self.path / "checkpoint.safetensors"
        self.model = self.path / "model.safetensors"
        self.metrics = self.path / "metrics.json"
        self.train_log = self.path / "train.jsonl"
        self.config_file = self.path / "config.yaml"

    def complete(self) -> bool:
        return self.metrics.is_file()

    def check(self) -> None:
        """Refuse to mix two configs in one folder (writes nothing). With `replace` set (the
        workflow decided this job must run), a finished run or one of another config is
        deleted instead, and only an unfinished run of the same config is resumed."""
        if not self.config_file.is_file():
            return
        old = yaml.safe_load(self.config_file.read_text()) or {}
        changes = _diff(_identity(old.get("config", {})), _identity(self.config))
        if self.replace and (changes or self.complete()):
            log.info("replacing the previous run in %s", self.path)
            shutil.rmtree(self.path)
        elif changes:
            raise ValueError(f"{self.path} holds a {old.get('stage')} run with another "
                             f"config ({'; '.join(changes[:5])}); use another output folder "
                             "or delete this one")

    def open(self, is_main: bool = True, *notes: str) -> None:
        """Create the folder, write the resolved config, start logging to run.log."""
        self.check()
        if is_main:
            self.path.mkdir(parents=True, exist_ok=True)
            write_yaml(self.config_file, {"stage": self.stage, "config": self.config})
            _log_to(self.path / "run.log")
            log.info("%s run in %s", self.stage, self.path)
            for note in notes:
                log.info("%s", note)

    def write_history(self, history: list[dict]) -> None:
        write_text(self.train_log, "".join(json.dumps(r, sort_keys=True) + "\n" for r in history))

    def finish(self, metrics: dict) -> dict:
        metrics = {**metrics, "stage": self.stage, "env": environment()}
        write_json(self.metrics, metrics)
        self.checkpoint.unlink(missing_ok=True)
        log.info("finished: %s", self.metrics)
        return metrics


def environment() -> dict:
    import timm
    import torch

    return {"python": sys.version.split()[0], "torch": torch.__version__, "timm": timm.__version__,
            "platform": platform.platform(), "cuda": torch.cuda.is_available()}


def _log_to(path: Path) -> None:
    root = logging.getLogger("linvit")
    root.setLevel(logging.INFO)
    for h in list(root.handlers):
        if isinstance(h, logging.FileHandler):
            root.removeHandler(h)
            h.close()
    fh = logging.FileHandler(path)
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root.addHandler(fh)
    if not any(type(h) is logging.StreamHandler for h in root.handlers):
        sh = logging.StreamHandler()
        sh.setFormatter(logging.Formatter("[linvit] %(message)s"))
        root.addHandler(sh)
