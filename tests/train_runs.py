"""Small training runs on the synthetic Fashion-MNIST folder, shared by the training tests."""
from __future__ import annotations

import pytest

from linvit.config import load_config
from linvit.io import read_jsonl
from linvit.train import trainer
from linvit.train.config import PretrainConfig
from linvit.transfer.config import FinetuneConfig


def pretrain_cfg(root, *extra):
    return load_config(PretrainConfig, None, [
        f"data.root={root}", "data.batch_size=64", "data.eval_batch_size=128",
        "optim.epochs=3", "optim.warmup_epochs=1", "run.progress=false", "run.threads=1",
        *extra])


def finetune_cfg(root, teacher, *extra):
    return load_config(FinetuneConfig, None, [
        f"teacher={teacher}", "init.strategy=copy_mlp", "model.operator=focused",
        f"data.root={root}", "data.batch_size=64", "data.eval_batch_size=128", "optim.epochs=3",
        "optim.warmup_epochs=1", "run.progress=false", "run.threads=1", *extra])



def cut_in_epoch_2(run, cfg, out, monkeypatch, epoch=2):
    """`run` interrupted in its second (`epoch`-th) epoch: a checkpoint after the one before, no
    result."""
    real, calls = trainer.train_one_epoch, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == epoch:
            raise KeyboardInterrupt("simulated interrupt in epoch 2")
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_one_epoch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, out)
    assert (out / "checkpoint.safetensors").is_file()
    assert not (out / "metrics.json").exists()    # never taken for a result
    assert len(read_jsonl(out / "train.jsonl")) == epoch - 1
    monkeypatch.setattr(trainer, "train_one_epoch", real)
