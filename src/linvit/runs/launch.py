"""`linvit --nproc N`: N processes on this node under torch.distributed, started by torch's own
launcher (elastic_launch, what `torchrun --standalone` runs), whose exit is read back into
linvit's exit statuses.

torchrun alone exits 1 whenever a process exits non-zero, so a run its processes stopped on a
preemption signal (each exiting EXIT_PREEMPTED after the checkpoint) would read as failed and a
workflow would record it so. Here the processes' own exit codes decide: all stopped by a
preemption -> EXIT_PREEMPTED (and, under SLURM, one `scontrol requeue`, by this process, not
each worker); bad input -> 2; anything else -> 1.

Signals: SIGTERM and SIGUSR1 sent to this process are passed on to the workers (the launcher's
own handling), which stop at their next check and save; they get GRACE_S to do so before the
launcher kills them.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import uuid

from linvit.runs.preempt import EXIT_PREEMPTED, requeue

GRACE_S = 120        # a signalled worker's time to reach its next check and save
# what the launcher passes on to the workers, and then stops them with (torch's default, USR1)
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def worker_args(argv: list[str]) -> list[str]:
    """linvit's command line without --nproc (each worker runs one process)."""
    rest, skip = [], False
    for a in argv:
        if skip or a == "--nproc" or a.startswith("--nproc="):
            skip = a == "--nproc"
            continue
        rest.append(a)
    return rest


def exit_status(codes: list[int]) -> int:
    """linvit's exit status from the exit codes of the workers that failed (one the launcher
    stopped after another's exit shows as killed by SIGTERM, or SIGKILL past the grace)."""
    stopped = {EXIT_PREEMPTED, -signal.SIGTERM, -signal.SIGKILL}
    if EXIT_PREEMPTED in codes and set(codes) <= stopped:
        return EXIT_PREEMPTED
    return 2 if 2 in codes else 1


def _signal_settings() -> dict:
    """The launcher's signal settings where this torch's LaunchConfig has them (newer torch);
    older ones pass SIGTERM on with their own grace and end on SIGUSR1 (send SIGTERM there)."""
    from torch.distributed.launcher.api import LaunchConfig

    have = {f.name for f in dataclasses.fields(LaunchConfig)}
    wanted = {"signals_to_handle": SIGNALS, "shutdown_timeout": GRACE_S}
    return {k: v for k, v in wanted.items() if k in have}


def run_distributed(nproc: int, argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # torchrun's default: one OpenMP thread per process unless told (run.threads divides the
    # job's cores between the processes itself)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          run_id=str(uuid.uuid4()), rdzv_backend="c10d",
                          rdzv_endpoint="localhost:0", max_restarts=0, **_signal_settings())
    try:
        elastic_launch(config, sys.executable)("-m", "linvit.cli", *worker_args(argv))
        status = 0
    except ChildFailedError as e:
        status = exit_status([f.exitcode for f in e.failures.values()])
    except SignalException as e:
        print(f"linvit: signal {e.sigval.name}: passed on to the workers, which save and stop",
              file=sys.stderr)
        preempting = e.sigval in (signal.SIGTERM, signal.SIGUSR1)
        status = EXIT_PREEMPTED if preempting else 128 + e.sigval
    if status == EXIT_PREEMPTED:
        requeue()
    return status
