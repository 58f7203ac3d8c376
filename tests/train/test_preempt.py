"""Preemption (linvit.runs.preempt): SIGTERM or SIGUSR1 in the middle of an epoch saves that step's
checkpoint and exits with EXIT_PREEMPTED; the resumed run ends with the weights, history and
metrics of a run never stopped. The signal is real (os.kill of this process), sent from inside a
chosen optimizer step, so the test does not depend on timing."""
from __future__ import annotations

import os
import signal

import pytest
import torch
from safetensors.torch import load_file

from linvit import cli
from linvit.io import read_json, read_jsonl
from linvit.runs.preempt import EXIT_PREEMPTED
from linvit.train import trainer

# drop path (torch's generator) and Mixup (numpy's): the resumed steps draw what they drew
ARGS = ["optim.epochs=2", "optim.warmup_epochs=1", "data.batch_size=64",
        "data.eval_batch_size=128", "model.drop_path=0.1", "aug.mixup=0.8",
        "run.progress=false", "run.threads=1", "run.loggers=[]", "model.size=cpu64"]


class SignalAt:
    """Stands in for the live curves: sends `signum` to this process at optimizer update `at`."""

    def __init__(self, at: int, signum: int):
        self.at, self.signum = at, signum

    def __bool__(self) -> bool:
        return True

    def step(self, update, loss, lr):
        if update == self.at:
            os.kill(os.getpid(), self.signum)

    def epoch(self, record, update):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_mid_epoch_saves_that_step_and_the_resumed_run_is_the_uninterrupted_one(
        signum, mnist_root, tmp_path, monkeypatch):
    common = ["pretrain", f"data.root={mnist_root}", *ARGS]
    assert cli.main([common[0], "-o", str(tmp_path / "whole"), *common[1:]]) == 0
    steps = 512 // 64                                   # updates per epoch
    real = trainer.open_loggers
    monkeypatch.setattr(trainer, "open_loggers",
                        lambda *a, **k: SignalAt(steps + 3, signum))     # epoch 2, update 3
    cut = tmp_path / "cut"
    before = signal.getsignal(signum)
    assert cli.main([common[0], "-o", str(cut), *common[1:]]) == EXIT_PREEMPTED
    assert not (cut / "metrics.json").exists()
    saved = load_file(cut / "checkpoint.safetensors")
    assert saved["position.count"].item() == 3 * 64          # three batches of epoch 2 done
    assert len(read_jsonl(cut / "train.jsonl")) == 1
    assert signal.getsignal(signum) == before                 # handlers given back
    monkeypatch.setattr(trainer, "open_loggers", real)
    assert cli.main([common[0], "-o", str(cut), *common[1:]]) == 0
    whole, resumed = (load_file(p / "model.safetensors") for p in (tmp_path / "whole", cut))
    assert [k for k in whole if not torch.equal(whole[k], resumed[k])] == []
    keep = ("train_loss", "test_top1", "test_loss", "lr", "train_images")
    assert [{k: r[k] for k in keep} for r in read_jsonl(cut / "train.jsonl")] == \
        [{k: r[k] for k in keep} for r in read_jsonl(tmp_path / "whole" / "train.jsonl")]
    assert read_json(cut / "metrics.json")["top1"] == \
        read_json(tmp_path / "whole" / "metrics.json")["top1"]


def test_a_signal_in_an_epoch_s_last_step_stops_at_that_epoch_s_checkpoint(
        mnist_root, tmp_path, monkeypatch):
    common = ["pretrain", f"data.root={mnist_root}", *ARGS]
    assert cli.main([common[0], "-o", str(tmp_path / "whole"), *common[1:]]) == 0
    steps = 512 // 64
    real = trainer.open_loggers
    monkeypatch.setattr(trainer, "open_loggers", lambda *a, **k: SignalAt(steps, signal.SIGTERM))
    cut = tmp_path / "cut"
    assert cli.main([common[0], "-o", str(cut), *common[1:]]) == EXIT_PREEMPTED
    saved = load_file(cut / "checkpoint.safetensors")
    assert not [k for k in saved if k.startswith("position.")]     # the epoch's own checkpoint
    assert len(read_jsonl(cut / "train.jsonl")) == 1
    monkeypatch.setattr(trainer, "open_loggers", real)
    assert cli.main([common[0], "-o", str(cut), *common[1:]]) == 0
    whole, resumed = (load_file(p / "model.safetensors") for p in (tmp_path / "whole", cut))
    assert [k for k in whole if not torch.equal(whole[k], resumed[k])] == []


def test_without_a_signal_the_handlers_are_left_as_they_were(mnist_root, tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    assert cli.main(["pretrain", "-o", str(tmp_path / "run"), f"data.root={mnist_root}",
                     "optim.epochs=1", "optim.warmup_epochs=0", *ARGS[2:]]) == 0
    assert {s: signal.getsignal(s) for s in before} == before


def test_under_slurm_a_preempted_job_requeues_itself(tmp_path, monkeypatch):
    from linvit.runs.preempt import requeue

    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "scontrol"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    requeue()                                         # not under SLURM: nothing
    assert not calls.exists()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    requeue()
    assert calls.read_text().split() == ["requeue", "4242"]
    monkeypatch.setenv("LINVIT_SLURM_REQUEUE", "0")   # a site that requeues by itself
    requeue()
    assert calls.read_text().split() == ["requeue", "4242"]


# Loaded by every process of the run below (PYTHONPATH): the process of rank
# LINVIT_TEST_SIGNAL_RANK sends itself SIGTERM at optimizer update LINVIT_TEST_SIGNAL_AT.
SIGNAL_ONE_RANK = '''
import os, signal
if "RANK" in os.environ and os.environ["RANK"] == os.environ.get("LINVIT_TEST_SIGNAL_RANK"):
    from linvit.train import trainer
    at = int(os.environ["LINVIT_TEST_SIGNAL_AT"])
    class SignalAt:
        def __bool__(self): return True
        def step(self, update, loss, lr):
            if update == at:
                os.kill(os.getpid(), signal.SIGTERM)
        def epoch(self, record, update): pass
        def close(self): pass
    trainer.open_loggers = lambda *a, **k: SignalAt()
'''


@pytest.mark.slow
def test_two_processes_one_signalled_stop_together_and_resume_each_with_its_own_generators(
        mnist_root, tmp_path):
    """torch.distributed (gloo, 2 CPU processes), drop path and Mixup drawing from each
    process's own generators: SIGTERM to rank 1 alone at update 19 stops both at the next check
    (update 24, inside epoch 2), the launcher exits EXIT_PREEMPTED (not torchrun's 1), and the
    resumed run, each process back on its own generators, ends with the uninterrupted run's
    weights. Resuming with another process count is refused."""
    import subprocess
    import sys

    from linvit.runs.preempt import STOP_CHECK_EVERY

    args = ["pretrain", f"data.root={mnist_root}", "data.train_subset=512", "data.batch_size=32",
            *[a for a in ARGS if not a.startswith("data.batch_size")], "optim.epochs=3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(SIGNAL_ONE_RANK)

    def run(out, nproc=2, **extra):
        return subprocess.run([sys.executable, "-m", "linvit.cli", "--nproc", str(nproc),
                               args[0], "-o", str(out), *args[1:]], env={**env, **extra},
                              capture_output=True, text=True, timeout=600)

    whole = run(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    steps, at = 512 // 32, 16 + 3                     # updates per epoch; epoch 2, update 3
    stop = -(-at // STOP_CHECK_EVERY) * STOP_CHECK_EVERY
    assert stop < 2 * steps                           # the check falls inside epoch 2
    cut = run(tmp_path / "cut", PYTHONPATH=str(tmp_path / "hook"), LINVIT_TEST_SIGNAL_RANK="1",
              LINVIT_TEST_SIGNAL_AT=str(at))
    assert cut.returncode == EXIT_PREEMPTED, cut.stderr[-3000:]
    saved = load_file(tmp_path / "cut" / "checkpoint.safetensors")
    assert saved["position.count"].item() == (stop - steps) * 32
    ranks = [{k.split(".", 3)[3]: v for k, v in saved.items()
              if k.startswith(f"position.rng.{r}.")} for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys() >= {"torch", "numpy"}
    assert not torch.equal(ranks[0]["torch"], ranks[1]["torch"])   # each its own generator
    other = run(tmp_path / "cut", nproc=1)
    assert other.returncode == 2 and "resume it with --nproc 2" in other.stderr, other.stderr
    resumed = run(tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "cut"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    assert read_json(tmp_path / "cut" / "metrics.json")["top1"] == \
        read_json(tmp_path / "whole" / "metrics.json")["top1"]


def test_a_checkpoint_from_before_per_process_states_resumes_every_process_on_the_main_s():
    from types import SimpleNamespace

    from linvit.errors import RunDirError
    from linvit.runs.preempt import rng_states
    from linvit.runs.state import _rng_of_ranks

    tensors, meta = rng_states()
    old = _rng_of_ranks({f"rng.{k}": v for k, v in tensors.items()}, meta)   # one dict, no rank
    position = {"step": 3, "sums": {"loss": torch.ones(())}, "count": torch.ones(()),
                "rng": old}
    for rank in (0, 1):
        rt = SimpleNamespace(world=2, rank=rank, is_main=rank == 0)
        mine = trainer._mine(position, rt)
        assert torch.equal(mine["rng"][0]["torch"], tensors["torch"])
        assert mine["count"].item() == (1.0 if rank == 0 else 0.0)
    new = _rng_of_ranks({f"rng.0.{k}": v for k, v in tensors.items()}, [meta])  # 1 process
    with pytest.raises(RunDirError, match="resume it with --nproc 1"):
        trainer._mine({**position, "rng": new}, SimpleNamespace(world=2, rank=0, is_main=True))
