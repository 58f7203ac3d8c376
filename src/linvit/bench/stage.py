"""`linvit bench -o DIR`: the operator and model benchmarks, written beside their config.

    ops.csv, models.csv     one row per measurement (times in ms, peak memory in MiB)
    ops.partial.csv, ...    the rows so far while a sweep runs: what a run stopped by a time
                            limit keeps (removed once the complete file is written)
    ratios.md               speedups over softmax, slopes, goals (also printed)
    ops_scaling.{png,pdf}   time and memory against tokens
    ops_share.{png,pdf}     each core's speedup beside its FLOP bound, and its share of it
    models_throughput.{png,pdf}
    metrics.json            the goals and the environment, written last
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path

import pandas as pd
import torch

from linvit.bench.config import BenchConfig
from linvit.bench.figures import model_throughput, operator_scaling, share_of_bound
from linvit.bench.measure import keep_freed_memory
from linvit.bench.models import sweep_models
from linvit.bench.operators import sweep_operators
from linvit.bench.ratios import goals, markdown
from linvit.io import write_atomic, write_text
from linvit.runs.runtime import cuda_wanted
from linvit.runs.stage import completed_metrics, prepare_run

log = logging.getLogger("linvit")


def bench_device(name: str) -> torch.device:
    return torch.device("cuda" if cuda_wanted(name) else "cpu")


def write_csv(rows: list[dict], path: Path) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    write_atomic(path, lambda p: frame.to_csv(p, index=False, float_format="%.6g"))
    return frame


def partial_writer(folder: Path, stem: str):
    """`on_row` of a sweep: its rows so far in STEM.partial.csv, so that a run stopped by a time
    limit (a short GPU lease) keeps what it measured. The complete STEM.csv replaces it."""
    return functools.partial(write_csv, path=_partial_path(folder, stem))


def _partial_path(folder: Path, stem: str) -> Path:
    return folder / f"{stem}.partial.csv"


def complete_csv(rows: list[dict], folder: Path, stem: str) -> pd.DataFrame:
    """STEM.csv, then the partial file this run wrote on the way is removed."""
    frame = write_csv(rows, folder / f"{stem}.csv")
    _partial_path(folder, stem).unlink(missing_ok=True)
    return frame


def run_bench(cfg: BenchConfig, out, replace: bool = False) -> dict:
    device = bench_device(cfg.run.device)
    run = prepare_run(cfg, out, "bench", replace)
    if run.finished:
        return completed_metrics(run)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    cached = device.type == "cpu" and keep_freed_memory()
    run.open(f"device {device}, {torch.get_num_threads()} threads, malloc keeps freed "
                   f"memory: {cached}")
    ops = complete_csv(sweep_operators(cfg, device, partial_writer(run.path, "ops")),
                       run.path, "ops")
    operator_scaling(ops, run.path / "ops_scaling")
    share_of_bound(ops, cfg, run.path / "ops_share")
    models = None
    if cfg.models is not None:
        models = complete_csv(sweep_models(cfg.models, device,
                                           partial_writer(run.path, "models")),
                              run.path, "models")
        model_throughput(models, run.path / "models_throughput")
    measured = goals(ops, cfg)
    text = markdown(ops, models, measured, cfg)
    write_text(run.path / "ratios.md", text)
    print(text)
    return run.finish({"goals": measured, "device": device.type,
                       "threads": torch.get_num_threads(), "malloc_keeps_freed": cached,
                       # None: no goal was measured (a softmax-only run times models only)
                       "goals_hold": (all(g["holds"] == "yes" for g in measured)
                                      if measured else None)})
