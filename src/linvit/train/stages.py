"""Stage entry points that train or evaluate a classifier from scratch: pretrain, evaluate, import.

Each takes a validated config and an output folder and leaves config.yaml, run.log, train.jsonl,
model.safetensors and metrics.json there (see linvit.runs.rundir).
"""
from __future__ import annotations

import logging
from pathlib import Path

from linvit.data import get_dataset
from linvit.errors import ConfigError
from linvit.models import ModelSpec, create_vit, load_model, save_model
from linvit.runs.evaluation import check_model_fits, evaluate, make_test_loader
from linvit.runs.stage import completed_metrics, prepare_run, start_run
from linvit.train.common import finish_training
from linvit.train.config import EvaluateConfig, ImportConfig, PretrainConfig, import_size
from linvit.train.objectives import ClassificationObjective
from linvit.train.recipe import make_ema, training_loaders
from linvit.train.trainer import fit

log = logging.getLogger("linvit")


def run_pretrain(cfg: PretrainConfig, out, replace: bool = False) -> dict:
    rt, run = start_run(cfg, out, "pretrain", replace)
    if run.finished:
        return completed_metrics(run)
    info, train_loader, test_loader, batch_aug = training_loaders(cfg, rt)
    spec = ModelSpec(cfg.model.size, cfg.model.operator, info.num_classes, info.img_size,
                     info.in_chans, dict(cfg.model.operator_options), cfg.model.drop_path)
    model = create_vit(spec).to(rt.device)
    run.open(train_loader.summary)
    objective = ClassificationObjective(model, cfg.optim.label_smoothing)
    score = lambda m: evaluate(m, test_loader, rt, info.num_classes)     # noqa: E731
    ema = make_ema(model, cfg.optim)
    history = fit(objective, model, train_loader, cfg.optim, run, rt,
                  evaluate_fn=lambda: score(model), eval_every=cfg.run.eval_every,
                  batch_aug=batch_aug, ema=ema, evaluate_ema=score)
    return finish_training(run, rt, model, history, {}, ema=ema)


def run_evaluate(cfg: EvaluateConfig, out, replace: bool = False) -> dict:
    rt, run = start_run(cfg, out, "evaluate", replace)
    if run.finished:
        return completed_metrics(run)
    info = get_dataset(cfg.data.dataset).info(cfg.data.root, cfg.data.img_size)
    model = load_model(cfg.checkpoint).to(rt.device)
    spec = model.spec
    check_model_fits(spec, info, cfg.data.dataset)
    test_loader = make_test_loader(cfg.data, rt)
    run.open(test_loader.summary)
    metrics = evaluate(model, test_loader, rt, info.num_classes)
    return run.finish({**metrics, "checkpoint": cfg.checkpoint, "spec": spec.as_dict()})


def run_import(cfg: ImportConfig, out, replace: bool = False) -> dict:
    """Turn timm weights (a local file, or timm's pretrained loader) into a linvit teacher."""
    from linvit.models.tensor_files import HEAD_KEY as HEAD
    from linvit.models.tensor_files import ORIGIN_KEY as ORIGIN
    from linvit.models.timm_import import import_timm_weights

    run = prepare_run(cfg, out, "import-teacher", replace)
    if run.finished:
        return completed_metrics(run)
    info = get_dataset(cfg.data.dataset).info(cfg.data.root, cfg.data.img_size)
    classes = 0 if cfg.headless else info.num_classes
    spec = ModelSpec(cfg.size, "softmax", classes, info.img_size, info.in_chans,
                     architecture=import_size(cfg.size))
    model, report = import_timm_weights(spec, cfg.file, cfg.reset_head, cfg.layout,
                                        cfg.timm_name)
    run.open()
    if report.get("dropped"):
        log.info("dropped from the checkpoint (%s layout): %s", cfg.layout,
                 ", ".join(report["dropped"][:10]))
    # its origin travels to every model made from it (models.checkpoint.ModelFile.carried)
    origin = {"source": Path(cfg.file).name if cfg.file else report["source"],
              **{k: report[k] for k in ("sha256", "layout") if k in report}}
    save_model(model, run.model, metadata={HEAD: report["head"], ORIGIN: origin})
    return run.finish({"import": report, "spec": spec.as_dict()})


def run_probe(cfg, out, replace: bool = False) -> dict:
    """The teacher's backbone with a new head for the dataset's classes, trained alone (linear
    probe: every other tensor frozen) or with the rest (fine-tune). Its model file's head counts
    as trained, so logit KD may use it."""
    from linvit.models.checkpoint import ModelFile, mismatch_report

    rt, run = start_run(cfg, out, "probe", replace)
    if run.finished:
        return completed_metrics(run)
    info, train_loader, test_loader, batch_aug = training_loaders(cfg, rt)
    source = ModelFile(cfg.teacher)
    teacher = source.spec
    spec = teacher.derive(num_classes=info.num_classes, img_size=info.img_size,
                          in_chans=info.in_chans)
    check_model_fits(spec, info, cfg.data.dataset)
    model = create_vit(spec)
    backbone = {k: v for k, v in source.state.items()
                if not k.startswith("head.")}
    report = mismatch_report(model, backbone)
    report["missing"] = [k for k in report["missing"] if not k.startswith("head.")]
    if any(report.values()):
        raise ConfigError(f"teacher: {cfg.teacher} does not fit a {teacher.size} backbone "
                          f"({ {k: v[:5] for k, v in report.items() if v} })")
    model.load_state_dict(backbone, strict=False)                 # all but the new head
    if cfg.mode == "linear":
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("head."))
    model.to(rt.device)
    run.open(train_loader.summary)
    score = lambda m: evaluate(m, test_loader, rt, info.num_classes)     # noqa: E731
    ema = make_ema(model, cfg.optim)
    history = fit(ClassificationObjective(model, cfg.optim.label_smoothing), model, train_loader,
                  cfg.optim, run, rt, evaluate_fn=lambda: score(model),
                  eval_every=cfg.run.eval_every, batch_aug=batch_aug, ema=ema,
                  evaluate_ema=score)
    return finish_training(run, rt, model, history, {"mode": cfg.mode, "teacher": cfg.teacher},
                           source.carried(head=False), ema=ema)
