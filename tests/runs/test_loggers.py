"""Live curves (run.loggers): what a training run logs while it trains reads back equal to its
train.jsonl, a resumed run logs each epoch once, and every logger of the registry works offline."""
from __future__ import annotations

import pytest

from linvit.io import read_jsonl
from linvit.runs.loggers import LOGGERS, scalars_of
from linvit.stages import STAGES
from linvit.train.stages import run_pretrain

from train_runs import cut_in_epoch_2, pretrain_cfg

STEPS = 512 // 64          # the synthetic set's training images / batch size


def tensorboard_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def assert_matches_history(scalars: dict, history: list[dict]) -> None:
    """Each epoch's numbers at the update that ends it, once; every step's loss and lr."""
    for record in history:
        step = record["epoch"] * STEPS
        expected = scalars_of(record, "epoch/")
        assert len(expected) > 5
        for tag, value in expected.items():
            logged = [v for s, v in scalars[tag] if s == step]
            assert logged == [pytest.approx(value, rel=1e-6, abs=1e-6)], tag
    epochs = len(history)
    assert [s for s, _ in scalars["train/loss"]] == list(range(1, epochs * STEPS + 1))
    assert scalars["train/lr"][-1][1] == pytest.approx(history[-1]["lr"], rel=1e-6)


def test_tensorboard_events_read_back_equal_to_train_jsonl(mnist_root, tmp_path):
    out = tmp_path / "run"
    run_pretrain(pretrain_cfg(mnist_root), out)       # run.loggers: its default, tensorboard
    history = read_jsonl(out / "train.jsonl")
    assert len(history) == 3 and "test_top1" in history[-1]
    assert_matches_history(tensorboard_scalars(out / "tensorboard"), history)


def test_a_resumed_run_logs_each_epoch_once(mnist_root, tmp_path, monkeypatch):
    out, cfg = tmp_path / "run", pretrain_cfg(mnist_root)
    cut_in_epoch_2(run_pretrain, cfg, out, monkeypatch)
    run_pretrain(cfg, out)
    assert_matches_history(tensorboard_scalars(out / "tensorboard"), read_jsonl(out /
                                                                                "train.jsonl"))


def test_no_logger_writes_no_curves(mnist_root, tmp_path):
    out = tmp_path / "run"
    run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=1", "optim.warmup_epochs=0",
                              "run.loggers=[]"), out)
    assert not any((out / entry.folder).exists() for entry in LOGGERS.values())


@pytest.mark.parametrize("name", list(LOGGERS))
def test_each_loggers_folder_is_the_training_runs_own(name):
    for stage in ("pretrain", "distill", "finetune", "probe", "segment", "detect"):
        assert LOGGERS[name].folder in STAGES[stage].scratch, stage


def test_mlflow_offline_reads_back_equal_to_train_jsonl(mnist_root, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "run"
    run_pretrain(pretrain_cfg(mnist_root, "run.loggers=[mlflow]"), out)
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("linvit").experiment_id])
    history = read_jsonl(out / "train.jsonl")
    scalars = {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
               for key in {k for r in history for k in scalars_of(r, "epoch/")}
               | {"train/loss", "train/lr"}}
    assert_matches_history(scalars, history)


def test_wandb_offline_writes_the_history_into_the_run_folder(mnist_root, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "run"
    run_pretrain(pretrain_cfg(mnist_root, "optim.epochs=1", "optim.warmup_epochs=0",
                              "run.loggers=[wandb]"), out)
    (record,) = read_jsonl(out / "train.jsonl")
    (log,) = (out / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    data = log.read_bytes()
    for key in ("epoch/test_top1", "epoch/train_loss", "train/lr"):
        assert key.encode() in data, key
    assert repr(record["test_top1"]).encode() in data


def test_a_logger_that_is_not_installed_is_refused_before_any_compute(monkeypatch):
    import importlib.util

    from linvit.config import load_config
    from linvit.errors import ConfigError
    from linvit.train.config import PretrainConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"run.loggers: wandb needs the package wandb"):
        load_config(PretrainConfig, None, ["run.loggers=[wandb]"])
    with pytest.raises(ConfigError, match=r"run.loggers: 'tb' is not one of: tensorboard"):
        load_config(PretrainConfig, None, ["run.loggers=[tb]"])
