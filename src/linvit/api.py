"""linvit from Python, for a notebook: convert a softmax teacher in memory, or run the distillation
and fine-tuning loops on a model and loaders of your own. docs/api.md has a runnable example.

    student = linvit.convert("teacher/model.safetensors", operator="gla",
                             strategy="copy_mlp+distill", data="fashion_mnist",
                             distill={"epochs": 5}, finetune={"epochs": 10})

These call the same loops as `linvit distill` and `linvit finetune` (linvit.transfer.loops), with
no run folder: nothing is written, checkpointed or resumed. Options are the stages' own fields
(`linvit distill --print-config`), checked as a config is, before any compute: a `distill` dict
takes the fields of the `distill` and `optim` sections, a `finetune` dict those of `optim` and
`kd`. Loaders are linvit's or any torch DataLoader of (images, labels) batches.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from linvit.attention import OPERATORS
from linvit.config import DataCfg, OptimCfg, RunCfg, build, check_spec, one_of
from linvit.errors import ConfigError
from linvit.transfer.config import (
    DistillCfg,
    DistillConfig,
    FinetuneConfig,
    InitCfg,
    KDCfg,
    check_e2e_epochs,
    check_map_losses,
)

# The schedules' defaults as the stages have them (distillation's optim differs from OptimCfg's)
_DISTILL_OPTIM = dataclasses.asdict(DistillConfig().optim)
_FINETUNE_OPTIM = dataclasses.asdict(FinetuneConfig().optim)


class TorchBatches:
    """A torch DataLoader (or any sized iterable of (images, labels)) as the loops read loaders:
    `batches(epoch)`, telling a DistributedSampler which epoch it is."""

    def __init__(self, loader):
        self.loader = loader
        self.summary = f"{type(loader).__name__} of {len(loader)} batches"

    def __len__(self) -> int:
        return len(self.loader)

    def batches(self, epoch: int):
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        return iter(self.loader)


def as_loader(loader):
    """linvit's loaders as they are; anything else wrapped (TorchBatches)."""
    return loader if hasattr(loader, "batches") else TorchBatches(loader)


def runtime(device: str = "auto", amp: str = "float32", seed: int = 0, progress: bool = False):
    """Where the loops run: linvit's Runtime for one process (run.device, run.amp's words)."""
    from linvit.runs.runtime import setup_runtime

    return setup_runtime(_section(RunCfg, {"device": device, "amp": amp, "seed": seed,
                                           "progress": progress, "loggers": []}, "run"))


def _section(cls, values: dict, what: str):
    """`cls` built from `values` and validated as the config loader does, errors named
    `what.<field>`."""
    obj = build(cls, values, f"{what}.")
    obj.validate(what)
    return obj


def _split(options: dict | None, sections: dict, what: str) -> dict:
    """A flat options dict sorted into the sections whose field each key names."""
    out = {name: {} for name in sections}
    for key, value in (options or {}).items():
        owners = [n for n, (cls, _) in sections.items()
                  if key in {f.name for f in dataclasses.fields(cls)}]
        if not owners:
            allowed = sorted(f.name for cls, _ in sections.values()
                             for f in dataclasses.fields(cls))
            raise ConfigError(f"{what}.{key}: unknown option; allowed: {', '.join(allowed)}")
        out[owners[0]][key] = value
    return {name: _section(cls, {**defaults, **out[name]}, what)
            for name, (cls, defaults) in sections.items()}


def distill_settings(options: dict | None = None) -> tuple[DistillCfg, OptimCfg]:
    """The `distill` and `optim` sections of `linvit distill` from one flat dict."""
    s = _split(options, {"distill": (DistillCfg, {}), "optim": (OptimCfg, _DISTILL_OPTIM)},
               "distill")
    check_e2e_epochs(s["distill"], s["optim"].epochs)
    return s["distill"], s["optim"]


def finetune_settings(options: dict | None = None) -> tuple[OptimCfg, KDCfg]:
    """The `optim` and `kd` sections of `linvit finetune` from one flat dict (kd's fields as
    kd_weight, kd_temperature)."""
    options = dict(options or {})
    kd = {k.removeprefix("kd_"): options.pop(k) for k in list(options) if k.startswith("kd_")}
    s = _split(options, {"optim": (OptimCfg, _FINETUNE_OPTIM)}, "finetune")
    return s["optim"], _section(KDCfg, kd, "finetune.kd")


def distill(student: nn.Module, teacher: nn.Module, train, *, rt=None, **options) -> list[dict]:
    """Distil `student`'s attention from `teacher`'s, layer by layer and teacher-forced, on the
    batches of `train`; returns the per-epoch history (train_<loss>/L<layer> and the rest).
    `options`: fields of `linvit distill`'s distill and optim sections (losses, layers, train,
    temperature, e2e_epochs, e2e_losses; epochs, lr, ...)."""
    d, optim = distill_settings(options)
    check_map_losses(student.spec.operator, d.losses)
    return _distil(student, teacher, as_loader(train), rt or runtime(), d, optim)


def _distil(student, teacher, train, rt, d: DistillCfg, optim: OptimCfg) -> list[dict]:
    """distill_loop on the student, which is left as it was but for what it learnt: the teacher's
    hooks removed, every tensor's requires_grad as before."""
    from linvit.transfer.loops import distill_loop, distill_objective

    flags = {n: p.requires_grad for n, p in student.named_parameters()}
    objective = distill_objective(student.to(rt.device), teacher.to(rt.device), d)
    try:
        history, _ = distill_loop(objective, train, optim, rt, d)
    finally:
        objective.remove_hooks()
        for name, p in student.named_parameters():
            p.requires_grad_(flags[name])
    return history


def finetune(model: nn.Module, train, *, teacher: nn.Module | None = None, rt=None,
             **options) -> list[dict]:
    """Fine-tune every tensor of `model` on `train` (cross-entropy, with logit KD from `teacher`
    where kd_weight > 0); returns the per-epoch history. `options`: fields of `linvit
    finetune`'s optim section (epochs, lr, warmup_epochs, ...), kd_weight and kd_temperature."""
    optim, kd = finetune_settings(options)
    return _finetune(model, as_loader(train), rt or runtime(), optim, kd, teacher)


def _finetune(model, train, rt, optim: OptimCfg, kd: KDCfg, teacher=None) -> list[dict]:
    from linvit.transfer.loops import finetune_loop

    model.requires_grad_(True)
    return finetune_loop(model.to(rt.device), train, optim, rt,
                         teacher=teacher.to(rt.device) if teacher is not None else None, kd=kd)


def evaluate(model: nn.Module, test, *, rt=None) -> dict:
    """Top-1/top-5 (%) and cross-entropy of `model` on the batches of `test`."""
    from linvit.runs.evaluation import evaluate as score

    rt = rt or runtime()
    result = score(model.to(rt.device), as_loader(test), rt, model.spec.num_classes)
    result.pop("per_class_acc", None)
    return result


def load_teacher(teacher) -> tuple[nn.Module, dict]:
    """A softmax teacher and its tensors: a linvit model file (path) or a linvit model."""
    from linvit.models.checkpoint import ModelFile

    if isinstance(teacher, (str, Path)):
        file = ModelFile(teacher)
        file.check_teacher()
        teacher = file.load()
    if not hasattr(teacher, "spec"):
        raise ConfigError(f"teacher: a linvit model or model file, got {type(teacher).__name__} "
                          "(import timm weights first: `linvit import-teacher`)")
    if teacher.spec.operator != "softmax":
        raise ConfigError(f"teacher: a softmax model, got operator {teacher.spec.operator!r}")
    return teacher, {k: v.detach().cpu() for k, v in teacher.state_dict().items()}


def load_data(data, rt, data_options: dict | None = None):
    """(num_classes, img_size, in_chans) or None, train and test loaders: from a dataset name of
    the registry (`linvit list`; data_options: the data section's fields), or a (train, test)
    pair of loaders (the shape then is the teacher's)."""
    from linvit.runs.evaluation import make_loaders

    if isinstance(data, str):
        info, train, test = make_loaders(_section(DataCfg, {"dataset": data,
                                                            **(data_options or {})}, "data"), rt)
        return (info.num_classes, info.img_size, info.in_chans), train, test
    if isinstance(data, (tuple, list)) and len(data) == 2:
        if data_options:
            raise ConfigError("data_options: only for a dataset named by the registry")
        return None, as_loader(data[0]), as_loader(data[1])
    raise ConfigError(f"data: a dataset name (`linvit list`) or a (train, test) pair of "
                      f"loaders, got {type(data).__name__}")


def convert(teacher, operator: str = "linear", strategy: str = "copy_mlp+distill",
            data="mnist5k", *, distill: dict | None = None, finetune: dict | None = None,
            operator_options: dict | None = None, data_options: dict | None = None,
            seed: int = 0, device: str = "auto", amp: str = "float32",
            progress: bool = False) -> nn.Module:
    """A linear-attention student of `teacher` (a linvit softmax model or its file): `operator`'s
    attention (`linvit list`), initialised by `strategy` (distilling first where it takes
    distilled attention, with the `distill` options), then fine-tuned on `data` with the
    `finetune` options (None: not fine-tuned). Returns the model; `model.conversion` holds the
    init record (which tensor came from where) and each loop's history."""
    rt = runtime(device, amp, seed, progress)
    teacher, state = load_teacher(teacher)
    plan = _section(InitCfg, {"strategy": strategy}, "strategy").resolve()
    from linvit.transfer.mechanisms import Mechanism

    if attached := [m.name for m in plan.mechanisms if type(m).attach is not Mechanism.attach]:
        raise ConfigError(f"strategy: {strategy!r} attaches {attached} to the student, which "
                          "reads the teacher's file; run it as a stage (`linvit finetune`)")
    one_of("operator", operator, OPERATORS)
    settings = distill_settings(distill) if plan.needs_distilled else None
    if settings:
        check_map_losses(operator, settings[0].losses)
    ft = finetune_settings(finetune) if finetune is not None else None
    shape, train, test = load_data(data, rt, data_options)
    spec = _student_spec(teacher.spec, operator, operator_options, shape)
    record = {"distill": None, "finetune": None}
    distilled = None
    if settings:
        distilled, record["distill"] = _distilled(teacher, state, spec, train, rt, *settings)
    torch.manual_seed(seed)
    from linvit.models import create_vit
    from linvit.transfer.init import apply_init

    model = create_vit(spec)
    record["init"] = apply_init(model, plan, state, distilled)
    if ft is not None:
        record["finetune"] = _finetune(model, train, rt, *ft, teacher)
    model.conversion = record
    return model


def _student_spec(teacher_spec, operator: str, options: dict | None, shape):
    """The teacher's architecture with `operator`'s attention, on the data's classes and
    images (a pair of loaders: the teacher's)."""
    classes, img_size, in_chans = shape or (teacher_spec.num_classes, teacher_spec.img_size,
                                            teacher_spec.in_chans)
    spec = teacher_spec.derive(operator=operator, operator_options=dict(options or {}),
                               num_classes=classes, img_size=img_size, in_chans=in_chans)
    check_spec("operator", spec)
    return spec


def _distilled(teacher, state, spec, train, rt, d: DistillCfg, optim: OptimCfg):
    """The distillation student (the teacher with `spec`'s attention, new or copied as
    d.attn_init says), distilled on `train`: its tensors and the loop's history."""
    from linvit.transfer.stages import new_distill_student

    student, _ = new_distill_student(spec, state, d.attn_init, rt.seed)
    history = _distil(student, teacher, train, rt, d, optim)
    return {k: v.detach().cpu() for k, v in student.state_dict().items()}, history
