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
