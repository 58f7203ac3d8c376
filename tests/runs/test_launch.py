"""`linvit --nproc N` (linvit.runs.launch): the workers' exit codes read back into linvit's exit
statuses (torchrun alone says 1 for all of them), and the workers' own command line."""
from __future__ import annotations

import signal

import pytest

from linvit.runs.launch import exit_status, worker_args
from linvit.runs.preempt import EXIT_PREEMPTED


@pytest.mark.parametrize("codes, status", [
    ([EXIT_PREEMPTED, EXIT_PREEMPTED], EXIT_PREEMPTED),     # both saved and stopped
    ([EXIT_PREEMPTED, -signal.SIGTERM], EXIT_PREEMPTED),    # the launcher stopped the other
    ([EXIT_PREEMPTED, -signal.SIGKILL], EXIT_PREEMPTED),    # ... past its grace
    ([-signal.SIGTERM], 1),                                  # killed, nothing said it saved
    ([2], 2), ([2, -signal.SIGTERM], 2),                     # bad input
    ([1], 1), ([EXIT_PREEMPTED, 1], 1),                      # a failure is a failure
])
def test_the_workers_exit_codes_decide_linvit_s(codes, status):
    assert exit_status(codes) == status


def test_the_workers_run_the_command_without_nproc():
    argv = ["--nproc", "2", "finetune", "-o", "out", "--nproc=3", "optim.epochs=1"]
    assert worker_args(argv) == ["finetune", "-o", "out", "optim.epochs=1"]
