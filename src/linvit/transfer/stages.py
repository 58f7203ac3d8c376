"""Stage entry points of the transfer: `linvit distill`, `linvit init`, `linvit finetune`.

Every output folder holds the common run files (see linvit.runs.rundir). init and finetune add
    copied.json         the init record: every student tensor's group and source (checked)
distill adds
    student_init.json   which tensors the distillation student took from the teacher
    trained.json        per tensor: trainable or frozen, and the share of entries that received
                        a non-zero gradient (what the chosen losses could actually train)
model.safetensors is the whole distilled student; init strategies take groups from it.
"""
from __future__ import annotations

import logging

import torch

from linvit.errors import ConfigError
from linvit.io import read_json, write_json
from linvit.models import ModelSpec, create_vit, save_model
from linvit.models.attention_copy import MAPS_KEY
from linvit.models.checkpoint import ModelFile
from linvit.models.tensor_files import HEAD_KEY
from linvit.runs.evaluation import evaluate, make_loaders
from linvit.runs.stage import completed_metrics, start_run
from linvit.train.common import evaluate_init, finish_training
from linvit.train.recipe import make_ema, training_loaders
from linvit.transfer.config import DistillConfig, FinetuneConfig
from linvit.transfer.distill import DistillObjective, teacher_forced_errors
from linvit.transfer.groups import GROUPS, group_of
from linvit.transfer.init import apply_init
from linvit.transfer.loops import distill_loop, distill_objective, finetune_loop, phase_at
from linvit.transfer.quality import attention_moved, free_running, scoring
from linvit.transfer.strategies import InitStrategy

log = logging.getLogger("linvit")


def student_spec(cfg, teacher_spec: ModelSpec, info) -> ModelSpec:
    """The student's shape: the teacher's size, the configured operator, the dataset's shape."""
    size = cfg.model.size or teacher_spec.size
    if size != teacher_spec.size:
        raise ConfigError(f"model.size: {size!r} differs from the teacher's {teacher_spec.size!r}")
    return teacher_spec.derive(operator=cfg.model.operator, num_classes=info.num_classes,
                               img_size=info.img_size, in_chans=info.in_chans,
                               operator_options=dict(cfg.model.operator_options),
                               drop_path=cfg.model.drop_path)


def check_distilled(distilled: ModelFile, spec: ModelSpec) -> None:
    d = distilled.spec
    theirs = (d.size, d.operator, d.operator_options)
    ours = (spec.size, spec.operator, spec.operator_options)
    if theirs != ours:
        raise ConfigError(f"distilled: {distilled} holds (size, operator, options) {theirs}, "
                          f"the student is {ours}")


def check_kd_teacher(teacher: ModelFile, info, what: str) -> None:
    """Logit KD compares the student's logits with the teacher's: the teacher needs a trained
    head (not a self-supervised backbone's missing or new one), on the dataset's classes."""
    head = teacher.head
    if head != "trained":
        raise ConfigError(f"{what}: the teacher {teacher} has "
                          f"{'no head' if head == 'none' else 'an untrained, new head'} "
                          "(imported from a checkpoint without a classifier), so it has no "
                          "logits to distil; train its head first (linvit probe), or set the "
                          "weight to 0")
    teacher_classes = teacher.spec.num_classes
    if teacher_classes != info.num_classes:
        raise ConfigError(f"{what}: the teacher has {teacher_classes} classes, the dataset "
                          f"{info.num_classes}; logit KD needs the same classes (set the weight "
                          "to 0, or use a teacher trained on this dataset)")


def distill_student_strategy(attn_init: str) -> InitStrategy:
    """The teacher with its attention swapped: copy every group, attention only if asked."""
    copied = set(GROUPS) if attn_init == "teacher" else set(GROUPS) - {"attn"}
    return InitStrategy(f"distill-student(attn={attn_init})", frozenset(copied))


def new_distill_student(spec: ModelSpec, teacher_state: dict, attn_init: str,
                        seed: int) -> tuple[torch.nn.Module, dict]:
    """A new model of `spec` seeded by `seed`, holding the teacher's tensors but its attention
    (the teacher's too with attn_init "teacher"): the distillation student, or a reference of
    its start; and apply_init's record."""
    torch.manual_seed(seed)
    student = create_vit(spec)
    return student, apply_init(student, distill_student_strategy(attn_init), teacher_state)


def run_distill(cfg: DistillConfig, out, replace: bool = False) -> dict:
    rt, run = start_run(cfg, out, "distill", replace)
    if run.finished:
        return completed_metrics(run)
    info, train_loader, test_loader, batch_aug = training_loaders(cfg, rt)
    files = {"teacher": ModelFile(cfg.teacher)}         # read once, for every check and copy
    files["teacher"].check_teacher()
    teacher = files["teacher"].load()
    for key, weights in phase_losses(cfg).items():
        if weights.get("logit_kd"):
            check_kd_teacher(files["teacher"], info, f"distill.{key}.logit_kd")
    spec = student_spec(cfg, teacher.spec, info)
    student, record = new_distill_student(spec, files["teacher"].state, cfg.distill.attn_init,
                                          cfg.run.seed)
    record["sources"] = {"teacher": cfg.teacher}
    objective = distill_objective(student, teacher, cfg.distill)
    trainable = [n for n, p in student.named_parameters() if p.requires_grad]
    run.open(train_loader.summary)
    if rt.is_main:
        write_json(run.path / "student_init.json", record)
    log.info("distilling %d tensors of groups %s with %s", len(trainable), cfg.distill.train,
             phase_losses(cfg))
    teacher.to(rt.device)
    student.to(rt.device)

    def evaluate_student() -> dict:
        result = evaluate(student, test_loader, rt, info.num_classes)
        with objective.using(cfg.distill.losses):        # the same measures in either phase
            result.update(teacher_forced_errors(objective, test_loader, rt))
        return result

    init_eval = evaluate_init(student, test_loader, rt, run, info.num_classes,
                              cfg.run.eval_every > 0 and not run.checkpoint.is_file())
    quality = start_quality(run, rt, objective, cfg, files["teacher"].state, spec, test_loader)
    ema = make_ema(student, cfg.optim)
    history, census = distill_loop(
        objective, train_loader, cfg.optim, rt, cfg.distill, run=run,
        evaluate_fn=evaluate_student, eval_every=cfg.run.eval_every, batch_aug=batch_aug,
        ema=ema, evaluate_ema=lambda m: evaluate(m, test_loader, rt, info.num_classes))
    if rt.is_main:
        write_json(run.path / "trained.json", census)
    quality["free"] = free_running(student, teacher, test_loader, rt)
    return finish_training(run, rt, student, history,
                           {"init": init_eval, "losses": cfg.distill.losses,
                            "trained_groups": cfg.distill.train, "quality": quality,
                            "e2e_epochs": cfg.distill.e2e_epochs,
                            "train_flops_per_image": distill_flops(objective, cfg)},
                           model_metadata(record, files,
                                          head_trained="head" in cfg.distill.train), ema=ema)


def phase_losses(cfg: DistillConfig) -> dict[str, dict[str, float]]:
    """The losses of each phase that trains: layer-wise ("losses"), end to end ("e2e_losses")."""
    d, epochs = cfg.distill, cfg.optim.epochs
    return {**({"losses": d.losses} if d.e2e_epochs < epochs else {}),
            **({"e2e_losses": d.e2e_losses} if d.e2e_epochs else {})}


def distill_flops(objective: DistillObjective, cfg: DistillConfig) -> float:
    """Training FLOPs per image, averaged over the schedule's epochs of both phases."""
    per_epoch = []
    for epoch in range(cfg.optim.epochs):
        with objective.using(phase_at(cfg.distill, cfg.optim.epochs, epoch)):
            per_epoch.append(objective.flops_per_image())
    return sum(per_epoch) / len(per_epoch)


def start_quality(run, rt, objective, cfg: DistillConfig, teacher_state: dict, spec: ModelSpec,
                  loader) -> dict:
    """The distillation's quality before its first step ("before", teacher-forced) and the two
    references in the student's operator (its attention new, "random"; the teacher's copied,
    "copied"), measured once per run: kept across a resume in init_quality.json ("before" left
    out for a run that resumed before it was measured)."""
    path = run.path / "init_quality.json"
    if path.is_file():
        return read_json(path)
    out = {} if run.checkpoint.is_file() else {"before": teacher_forced_errors(objective, loader,
                                                                                rt)}
    for name, attn_init in (("random", "random"), ("copied", "teacher")):
        # the same new tensors as the student's
        reference, _ = new_distill_student(spec, teacher_state, attn_init, cfg.run.seed)
        with scoring(objective, reference):
            out[name] = teacher_forced_errors(objective, loader, rt)
    if rt.is_main:
        write_json(path, out)
    return out


def build_student(cfg: FinetuneConfig, info) -> tuple[torch.nn.Module, dict, dict]:
    """A new student of the configured operator, initialised by the configured strategy; its
    record, and the model files it came from (source name -> ModelFile, each read once)."""
    files = {"teacher": ModelFile(cfg.teacher),
             **({"distilled": ModelFile(cfg.distilled)} if cfg.distilled else {})}
    spec = student_spec(cfg, files["teacher"].check_teacher(), info)
    if cfg.distilled:
        check_distilled(files["distilled"], spec)
    strategy = cfg.init.resolve()
    torch.manual_seed(cfg.run.seed)
    model = create_vit(spec)
    record = apply_init(model, strategy, files["teacher"].state,
                        files["distilled"].state if cfg.distilled else None)
    record["sources"] = {"teacher": cfg.teacher, "distilled": cfg.distilled}
    for mechanism in strategy.mechanisms:
        record.update(mechanism.attach(model, cfg, info))
    log.info("init %s: %s", strategy.name, record["summary"])
    return model, record, files


def model_metadata(record: dict, files: dict[str, ModelFile], head_trained: bool = False) -> dict:
    """What a student's model file must say beyond its spec, for the stages after it to check:
    the teacher whose maps drive it, the state of its head (trained here, else that of the model
    it was copied from: an imported teacher's untrained head stays untrained through a copy, else
    new), and the teacher's origin."""
    meta = {MAPS_KEY: record["teacher_maps"]} if record.get("teacher_maps") else {}
    if not head_trained:
        meta[HEAD_KEY] = _copied_head_state(record, files)
    # the foreign weights the teacher was imported from, if it was (its origin)
    return meta | files["teacher"].carried(head=False)


def _copied_head_state(record: dict, files: dict[str, ModelFile]) -> str:
    sources = {e["source"] for name, e in record["tensors"].items() if group_of(name) == "head"}
    if sources == {"new"} or not sources:
        return "new" if sources else "none"
    states = {files[s].head if s in files else "new" for s in sources}
    return states.pop() if len(states) == 1 else "new"


def run_init(cfg: FinetuneConfig, out, replace: bool = False) -> dict:
    rt, run = start_run(cfg, out, "init", replace)
    if run.finished:
        return completed_metrics(run)
    info, _, test_loader = make_loaders(cfg.data, rt)
    model, record, files = build_student(cfg, info)
    run.open(test_loader.summary)
    if rt.is_main:
        write_json(run.path / "copied.json", record)
        save_model(model, run.model, model_metadata(record, files))
    init_eval = evaluate_init(model.to(rt.device), test_loader, rt, run, info.num_classes,
                              cfg.run.eval_every > 0)
    return run.finish({"strategy": record["strategy"], "copied": record["summary"],
                       "init": init_eval, "spec": model.spec.as_dict()})


def run_finetune(cfg: FinetuneConfig, out, replace: bool = False) -> dict:
    rt, run = start_run(cfg, out, "finetune", replace)
    if run.finished:
        return completed_metrics(run)
    info, train_loader, test_loader, batch_aug = training_loaders(cfg, rt)
    model, record, files = build_student(cfg, info)
    teacher = files["teacher"].load() if cfg.kd.weight else None
    if teacher is not None:
        check_kd_teacher(files["teacher"], info, "kd.weight")
    run.open(train_loader.summary)
    if rt.is_main:
        write_json(run.path / "copied.json", record)
    model.to(rt.device)
    teacher = teacher.to(rt.device) if teacher is not None else None
    init_eval = evaluate_init(model, test_loader, rt, run, info.num_classes,
                              cfg.run.eval_every > 0 and not run.checkpoint.is_file())
    score = lambda m: evaluate(m, test_loader, rt, info.num_classes)     # noqa: E731
    ema = make_ema(model, cfg.optim)
    history = finetune_loop(model, train_loader, cfg.optim, rt, teacher=teacher, kd=cfg.kd,
                            run=run, evaluate_fn=lambda: score(model),
                            eval_every=cfg.run.eval_every, batch_aug=batch_aug, ema=ema,
                            evaluate_ema=score)
    moved = moved_from_distilled(model, files, teacher, test_loader, rt)
    return finish_training(run, rt, model, history,
                           {"strategy": record["strategy"], "init": init_eval,
                            "copied": record["summary"], **moved},
                           model_metadata(record, files, head_trained=True), ema=ema)


def moved_from_distilled(model, files: dict[str, ModelFile], teacher, loader, rt) -> dict:
    """For a student that started from a distilled model, how far each layer's attention output
    moved in fine-tuning (linvit.transfer.quality.attention_moved); {} for the others."""
    if "distilled" not in files:
        return {}
    teacher = (teacher or files["teacher"].load()).to(rt.device)
    objective = DistillObjective(model, teacher, {"attn_out_mse": 1.0})
    try:
        moved = attention_moved(objective, files["distilled"].load(), loader, rt)
    finally:
        objective.remove_hooks()
    return {"attn_moved": {name.split("/")[-1]: v for name, v in moved.items()}}


def run_select(cfg, out, replace: bool = False) -> dict:
    """A softmax model of cfg.size cut out of the teacher (linvit.transfer.select), with its
    selection record (selected.json) and, on the teacher's own classes, its test accuracy as
    selected, before any training."""
    from linvit.data import get_dataset
    from linvit.models.sizes import get_size
    from linvit.runs.evaluation import make_test_loader
    from linvit.transfer.select import select_state, selection

    rt, run = start_run(cfg, out, "select", replace)
    if run.finished:
        return completed_metrics(run)
    source = ModelFile(cfg.teacher)
    teacher = source.check_teacher()
    spec = ModelSpec(cfg.size, "softmax", teacher.num_classes, teacher.img_size, teacher.in_chans)
    model = create_vit(spec)
    model.load_state_dict(select_state(source.state, teacher.model_size,
                                       list(model.state_dict()), cfg.size), strict=True)
    info = get_dataset(cfg.data.dataset).info(cfg.data.root, cfg.data.img_size)
    scored = (info.num_classes, info.img_size) == (spec.num_classes, spec.img_size)
    test = make_test_loader(cfg.data, rt) if scored else None
    run.open(f"selecting {cfg.size} from the {teacher.size} teacher {cfg.teacher}")
    index = selection(teacher.model_size, get_size(cfg.size))
    write_json(run.path / "selected.json", {"teacher": cfg.teacher, "teacher_size": teacher.size,
                                           "size": cfg.size,
                                           **{k: v.tolist() for k, v in index.items()}})
    save_model(model, run.model, source.carried())     # e.g. an untrained head
    metrics = {"params": sum(p.numel() for p in model.parameters()), "spec": spec.as_dict()}
    if test is not None:
        metrics["top1"] = evaluate(model.to(rt.device), test, rt, info.num_classes)["top1"]
    return run.finish(metrics)
