"""Pieces every training stage shares: loaders from a DataCfg, the accuracy as initialised,
finishing a run."""
from __future__ import annotations

import logging
import math

from torch import nn

from linvit.data import get_dataset
from linvit.errors import ConfigError
from linvit.io import read_json, write_json
from linvit.models import save_model
from linvit.runs.rundir import RunDir
from linvit.runs.runtime import Runtime
from linvit.train.loop import evaluate

log = logging.getLogger("linvit")


def make_loaders(data_cfg, rt: Runtime):
    info = get_dataset(data_cfg.dataset).info(data_cfg.root, data_cfg.img_size)
    train = _loader(data_cfg, rt, "train")
    test = _loader(data_cfg, rt, "test")
    if len(train) == 0 or len(test) == 0:
        raise ConfigError(f"data: {data_cfg.dataset} gives {len(train)} training batches of "
                          f"{data_cfg.batch_size} and {len(test)} test batches; use a smaller "
                          "batch size or more data")
    train.summary = test.summary = (f"data {data_cfg.dataset}: {train.num_samples} train / "
                                    f"{test.num_samples} test samples, {info.num_classes} classes")
    return info, train, test


def make_test_loader(data_cfg, rt: Runtime):
    """The test split's loader alone (evaluation stages)."""
    test = _loader(data_cfg, rt, "test")
    test.summary = f"data {data_cfg.dataset}: {test.num_samples} test samples"
    return test


def _loader(data_cfg, rt: Runtime, split: str):
    train = split == "train"
    return get_dataset(data_cfg.dataset).loader(
        data_cfg.root, split, train=train, seed=rt.seed, rank=rt.rank, world=rt.world,
        img_size=data_cfg.img_size, workers=data_cfg.workers,
        batch_size=data_cfg.batch_size if train else data_cfg.eval_batch_size,
        subset=data_cfg.train_subset if train else data_cfg.test_subset)


def check_model_fits(spec, info, dataset: str) -> None:
    """A loaded model takes this dataset's images and classes, checked before any compute."""
    if (spec.num_classes, spec.img_size) != (info.num_classes, info.img_size):
        raise ConfigError(f"checkpoint: its model takes {spec.img_size} px images of "
                          f"{spec.num_classes} classes, dataset {dataset!r} has "
                          f"{info.img_size} px images of {info.num_classes} classes")


def evaluate_init(model: nn.Module, loader, rt: Runtime, run: RunDir, num_classes: int,
                  enabled: bool) -> dict | None:
    """Accuracy of the model as initialised, measured once per run (kept across resumes)."""
    path = run.path / "init_metrics.json"
    if path.is_file():                        # measured before an interrupt
        return read_json(path)
    if not enabled:
        return None
    result = evaluate(model, loader, rt, num_classes)
    result.pop("per_class_acc")
    bad = [k for k, v in result.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:                 # a diagnostic: kept as "not a number" (null), never as a value
        log.warning("non-finite %s of the model as initialised: recorded as null", bad)
        result = {k: (None if k in bad else v) for k, v in result.items()}
    if rt.is_main:
        write_json(path, result)
    return result


def finish_training(run: RunDir, rt: Runtime, model: nn.Module, history: list[dict],
                    extra: dict, model_metadata: dict | None = None) -> dict:
    from linvit.models.flops import train_flops_per_image

    final = {k.removeprefix("test_"): v for k, v in history[-1].items() if k.startswith("test_")}
    metrics = {
        **final,
        "epochs": history[-1]["epoch"],
        "train_time_s": sum(r["train_time_s"] for r in history),
        # images seen by every process together; FLOPs per image (linvit.models.flops): the
        # portable cost units of time-to-accuracy (a stage with its own count passes it in extra)
        "train_images": sum(r.get("train_images", 0) for r in history),
        "train_flops_per_image": train_flops_per_image(model.spec),
        "train_img_per_s": sum(r["train_img_per_s"] for r in history) / len(history),
        "params": sum(p.numel() for p in model.parameters()),
        "spec": model.spec.as_dict(),
        **extra,
    }
    if rt.is_main:
        save_model(model, run.model, model_metadata)
        metrics = run.finish(metrics)
    rt.barrier()
    return metrics
