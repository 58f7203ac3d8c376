"""Beginning a stage's run: its folder checked (read-only) and its runtime set up, or, when the
folder already holds this finished run, that run's metrics."""
from __future__ import annotations

import dataclasses
import logging

from linvit.io import read_json
from linvit.runs.rundir import RunDir
from linvit.runs.runtime import Runtime, seed_everything, setup_runtime

log = logging.getLogger("linvit")


def prepare_run(cfg, out, stage: str, replace: bool = False) -> RunDir:
    """The run folder of `stage` for the config dataclass `cfg`, checked but not yet written:
    `run.open()` writes it once the inputs (data, checkpoints) have been found, so bad input
    leaves nothing behind."""
    run = RunDir(out, stage, dataclasses.asdict(cfg), replace=replace)
    run.check()
    return run


def start_run(cfg, out, stage: str, replace: bool = False) -> tuple[Runtime, RunDir]:
    """Runtime and checked run folder. Every process checks the same folder and so reaches the
    same decision; only the main one writes."""
    run = prepare_run(cfg, out, stage, replace)
    rt = setup_runtime(cfg.run)
    seed_everything(cfg.run.seed)
    run.is_main, run.barrier = rt.is_main, rt.barrier
    run.precision = lambda: rt.precision          # as it ends: a resume may have kept another
    log.info("%s on %s (run.amp=%s)", rt.precision, rt.device, cfg.run.amp)
    return rt, run


def completed_metrics(run: RunDir) -> dict:
    log.info("%s is complete already; nothing to do", run.path)
    return read_json(run.metrics)
