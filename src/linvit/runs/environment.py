"""What a run records about where it ran (metrics.json's `env`), and its log file."""
from __future__ import annotations

import logging
import os
import platform
import sys
from pathlib import Path

from linvit.machine import cpu_model


def environment() -> dict:
    import timm
    import torch

    from linvit.ops import cpp_kernels
    from linvit.runs.runtime import cpu_features

    return {"python": sys.version.split()[0], "torch": torch.__version__, "timm": timm.__version__,
            "platform": platform.platform(), "cuda": torch.cuda.is_available(),
            # the CPU model: cells of one study run on two CPU models differ by rounding alone
            "cpu": cpu_model(),
            # with run.amp, what decides whether a CPU run trained in bf16 (runtime.bf16_pays)
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            **{f"cpu_{name}": on for name, on in cpu_features().items()},
            "processes": int(os.environ.get("WORLD_SIZE", "1")),     # torch.distributed world
            "threads": torch.get_num_threads(),                      # of each process
            # which CPU path the linear operators ran (linvit's C++ kernels, or why not)
            "cpu_kernels": cpp_kernels.status(),
            # the devices and cluster job it ran in: a SLURM job's allocation, seen from inside
            "cuda_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "slurm_job": os.environ.get("SLURM_JOB_ID")}


def log_to(path: Path) -> None:
    """linvit's log into `path` (one file at a time) and, once, to the terminal."""
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
