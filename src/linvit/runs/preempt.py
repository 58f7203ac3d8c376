"""Preemption: SIGTERM (SLURM's preemption and time limit) or SIGUSR1 (`sbatch --signal`, ahead of
the limit) asks a training run to stop at the next optimizer step. The run then saves a
checkpoint of that step and exits with EXIT_PREEMPTED. The checkpoint holds the model, optimizer,
scheduler, EMA, the step within the epoch, the epoch's running sums and every random state of
every process (torch's CPU and CUDA ones, numpy's, Python's). Resumed, the run skips the epoch's
batches it had trained on: the loader's order is a function of (seed, epoch), so those batches
are the same ones. It then ends with the weights and metrics of a run that was never stopped,
given as many processes as it stopped with (each takes its own generators back; another count
is refused). A signal in an epoch's last steps stops the run at that epoch's own checkpoint.

Under torch.distributed, one process signalled stops them all at the same step: every
STOP_CHECK_EVERY steps they sum their flags (a collective, so not at every step, where it would
hold each step until the host reads the sum). A signal then costs at most that many steps.
`linvit --nproc N` reads the processes' exit codes back (linvit.runs.launch): a preempted run
exits EXIT_PREEMPTED, as in one process, and is requeued once.

Under SLURM (SLURM_JOB_ID set, LINVIT_SLURM_REQUEUE not 0), the preempted job also asks
`scontrol requeue` for itself. It goes back to the queue and, when it runs again, resumes from
the checkpoint (the workflow's profile submits with --requeue and --signal).
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import threading

import numpy as np
import torch

log = logging.getLogger("linvit")

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# 128 + SIGTERM: what a shell reports for a job a SIGTERM ended. The workflow's job script
# passes it on without writing a record, so the job is not taken as failed, and it resumes.
EXIT_PREEMPTED = 128 + signal.SIGTERM
STOP_CHECK_EVERY = 8        # steps between the processes' checks for a signal (distributed)


class Preempted(Exception):
    """Raised by the training loop at the step boundary after a preemption signal."""

    def __init__(self, step: int, sums: dict, count: torch.Tensor):
        super().__init__(f"preempted after step {step} of the epoch")
        self.step, self.sums, self.count = step, sums, count


class Preemption:
    """While open, SIGTERM and SIGUSR1 set `requested` instead of ending the process (main
    thread only: elsewhere, and for signals already ignored, nothing is installed)."""

    def __init__(self):
        self.requested = False
        self.signal: int | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        if not self.requested:
            log.warning("signal %s: saving a checkpoint at the next step, then stopping",
                        signal.Signals(signum).name)
        self.requested, self.signal = True, signum

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}


def rng_states() -> tuple[dict[str, torch.Tensor], dict]:
    """Every generator a step of this process draws from (torch's CPU one, the current CUDA
    device's once CUDA is in use: dropout and drop path there; numpy's and Python's: Mixup and
    random erasing), as tensors and JSON (no pickle in a checkpoint)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    tensors = {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(keys.astype(np.int64))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["cuda"] = torch.cuda.get_rng_state()
    return tensors, {"numpy": [kind, int(pos), int(has_gauss), float(gauss)],
                     "python": [version, list(internal), gauss_next]}


def set_rng_states(tensors: dict[str, torch.Tensor], meta: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda"])
    kind, pos, has_gauss, gauss = meta["numpy"]
    np.random.set_state((kind, tensors["numpy"].numpy().astype(np.uint32), pos, has_gauss,
                         gauss))
    version, internal, gauss_next = meta["python"]
    random.setstate((version, tuple(internal), gauss_next))


def requeue() -> None:
    """Under SLURM, put this job back in the queue (it resumes from its checkpoint when it runs
    again); elsewhere nothing: the next run of the workflow resumes it."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("LINVIT_SLURM_REQUEUE", "1") == "0":
        return
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        log.warning("preempted under SLURM job %s, but scontrol is not on PATH: not requeued",
                    job)
        return
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if done.returncode:
        log.warning("scontrol requeue %s failed: %s", job, done.stderr.strip())
    else:
        log.info("requeued SLURM job %s", job)
