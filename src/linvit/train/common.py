"""Pieces every training stage shares: loaders from a DataCfg, the accuracy as initialised,
finishing a run."""
from __future__ import annotations

import logging

from torch import nn

from linvit.io import read_json, write_json
from linvit.models import save_model
from linvit.runs.evaluation import evaluate
from linvit.runs.rundir import RunDir
from linvit.runs.runtime import Runtime
from linvit.trees import non_finite

log = logging.getLogger("linvit")


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
    if bad := non_finite(result):  # a diagnostic: kept as "not a number" (null), never a value
        log.warning("non-finite %s of the model as initialised: recorded as null", bad)
        names = {b.split("=")[0] for b in bad}
        result = {k: (None if k in names else v) for k, v in result.items()}
    if rt.is_main:
        write_json(path, result)
    return result


def finish_training(run: RunDir, rt: Runtime, model: nn.Module, history: list[dict],
                    extra: dict, model_metadata: dict | None = None, ema=None) -> dict:
    """metrics.json and the model file (and, with an EMA, model_ema.safetensors beside it: a
    model file like the other, which a later stage may read instead)."""
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
        if ema is not None:
            save_model(ema.module, run.path / "model_ema.safetensors", model_metadata)
        metrics = run.finish(metrics)
    rt.barrier()
    return metrics
