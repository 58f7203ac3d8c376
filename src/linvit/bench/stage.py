"""`linvit bench -o DIR`: the operator and model benchmarks, written beside their config.

    ops.csv, models.csv     one row per measurement (times in ms, peak memory in MiB)
    ratios.md               speedups over softmax, slopes, goals (also printed)
    ops_scaling.{png,pdf}   time and memory against tokens
    ops_share.{png,pdf}     each core's speedup beside its FLOP bound, and its share of it
    models_throughput.{png,pdf}
    metrics.json            the goals and the environment, written last
"""
from __future__ import annotations

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
    ops = write_csv(sweep_operators(cfg, device), run.path / "ops.csv")
    operator_scaling(ops, run.path / "ops_scaling")
    share_of_bound(ops, cfg, run.path / "ops_share")
    models = None
    if cfg.models is not None:
        models = write_csv(sweep_models(cfg.models, device), run.path / "models.csv")
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
