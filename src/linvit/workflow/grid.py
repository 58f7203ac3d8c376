"""The ablation grid: which teacher, distillation and fine-tuning jobs a workflow config asks for,
where each writes, and the exact CLI overrides each job gets. The Snakefile only wires this.

A cell is one fine-tuned student: (dataset, teacher, size, operator, init strategy, loss design,
seed). Cells share work: one teacher model per (dataset, teacher, size), one distillation per
(dataset, teacher, size, operator, loss design). Strategies that take nothing from a distilled
student get loss "none".

Teachers are named (config `teachers`; default one, "pretrain", trained here at every size). A
teacher is made at its own size (pretrained, or imported from timm weights and, if configured,
given a head by `linvit probe`); for each smaller student size it serves, weight selection
(`linvit select`) cuts a teacher of that size out of it: the teacher size -> student size axis.
"""
from __future__ import annotations

import itertools
import json
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from linvit import found_files
from linvit.transfer.strategies import get_strategy
from linvit.trees import deep_merge, flatten
from linvit.workflow import memo

NO_LOSS = "none"


@dataclass(frozen=True)
class Cell:
    dataset: str
    teacher: str
    size: str
    operator: str
    init: str
    loss: str
    seed: int

    @property
    def needs_distill(self) -> bool:
        return get_strategy(self.init).needs_distilled

    def as_dict(self) -> dict:
        return asdict(self)


# --- teachers: named, each made at its own size and selected down to smaller student sizes -----
DEFAULT_TEACHERS = {"pretrain": {"source": "pretrain"}}


def teacher_specs(config: dict) -> dict[str, dict]:
    """name -> how the teacher is made (config `teachers`; default: pretrained at every size)."""
    return config.get("teachers") or DEFAULT_TEACHERS


def made_size(spec: dict, student_size: str) -> str:
    """The size a teacher is made at: its `size`, or (pretrained without one) the student's."""
    return spec.get("size") or student_size


def student_sizes(config: dict, spec: dict) -> list[str]:
    """The student sizes a teacher serves: `students`, else its own size, else (a pretrained
    teacher without a size) every size of the grid."""
    if spec.get("students"):
        return list(spec["students"])
    return [spec["size"]] if spec.get("size") else list(config["sizes"])


def teacher_students(config: dict) -> list[tuple[str, str]]:
    """(teacher, student size) pairs, in the order of `sizes` then of `teachers`."""
    pairs = [(t, s) for t, spec in teacher_specs(config).items()
             for s in student_sizes(config, spec)]
    return sorted(pairs, key=lambda p: config["sizes"].index(p[1]) if p[1] in config["sizes"]
                  else len(config["sizes"]))


def teacher_dir(results: str, dataset: str, teacher: str, size: str) -> str:
    return f"{results}/teachers/{dataset}/{teacher}/{size}"


def import_dir(results: str, dataset: str, teacher: str, size: str) -> str:
    """An imported teacher's weights before `linvit probe` gives them a head."""
    return f"{results}/imports/{dataset}/{teacher}/{size}"


def distill_dir(results: str, dataset: str, teacher: str, size: str, operator: str,
                loss: str) -> str:
    return f"{results}/distill/{dataset}/{teacher}/{size}/{operator}/{loss}"


def cell_dir(results: str, c: Cell) -> str:
    return (f"{results}/cells/{c.dataset}/{c.teacher}/{c.size}/{c.operator}/{c.init}/{c.loss}"
            f"/seed{c.seed}")


def _cells(config: dict, operators, strategies, losses) -> list[Cell]:
    out = []
    for dataset, (teacher, size), op, init, seed in itertools.product(
            config["datasets"], teacher_students(config), operators, strategies,
            config["seeds"]):
        designs = losses if get_strategy(init).needs_distilled else [NO_LOSS]
        out += [Cell(dataset, teacher, size, op, init, loss, seed) for loss in designs]
    return out


def expand_grid(config: dict) -> list[Cell]:
    """Main grid, softmax reference cells, then the loss-design sub-grid; no duplicates."""
    cells = _cells(config, config["operators"], config["strategies"], [config["main_loss"]])
    cells += _cells(config, ["softmax"], config["reference_strategies"], [config["main_loss"]])
    sub = config.get("loss_grid") or {}
    if sub:
        cells += _cells(config, sub["operators"], sub["strategies"], sub["losses"])
    return list(dict.fromkeys(cells))


def teachers(config: dict, cells: list[Cell]) -> list[tuple[str, str, str]]:
    """(dataset, teacher, size) of every teacher model: each one the cells use and, before a
    selected one, the teacher at its own size that it is cut out of."""
    used = models_taught(cells)
    specs = teacher_specs(config)
    made = [(d, t, made_size(specs[t], s)) for d, t, s in used]
    return list(dict.fromkeys([*made, *used]))


def models_taught(cells: list[Cell]) -> list[tuple[str, str, str]]:
    """(dataset, teacher, size) of the teacher models the cells take, in grid order."""
    return list(dict.fromkeys((c.dataset, c.teacher, c.size) for c in cells))


def imports(config: dict, cells: list[Cell]) -> list[tuple[str, str, str]]:
    """(dataset, teacher, size) of the imports a probe job then gives a head."""
    return [k for k in teachers(config, cells) if teacher_stage(config, k[1], k[2]) == "probe"]


def distillations(cells: list[Cell]) -> list[tuple[str, str, str, str, str]]:
    return list(dict.fromkeys((c.dataset, c.teacher, c.size, c.operator, c.loss)
                              for c in cells if c.needs_distill))


# --- command-line overrides -----------------------------------------------------------------
def override_words(tree: dict) -> list[str]:
    """{'optim': {'lr': 0.001}} -> ['optim.lr=0.001']; values as JSON, which the CLI reads as
    YAML (whole mappings, such as loss weights, stay one word)."""
    return [f"{key}={json.dumps(value)}" for key, value in flatten(tree).items()]


def _data(config: dict, dataset: str) -> dict:
    """The dataset entry's data fields (its `stages` are stage overrides, not data)."""
    return {"data": {k: v for k, v in config["datasets"][dataset].items() if k != "stages"}}


def _stage(config: dict, stage: str, dataset: str | None = None) -> dict:
    """The grid's overrides of a stage, then the dataset's own (datasets.<name>.stages): a
    small set needs more epochs than a large one to train as far."""
    tree = config.get("stages", {}).get(stage, {}) or {}
    if dataset is not None:
        own = (config["datasets"][dataset].get("stages") or {}).get(stage) or {}
        tree = deep_merge(tree, own)
    return tree


def _command(stage: str, out_dir: str, tree: dict) -> str:
    """`<stage> -o <dir> --rerun k=v ...`: --rerun because the workflow, not the folder, decides
    whether a job must run (an unfinished run of the same config still resumes)."""
    return shlex.join([stage, "-o", out_dir, "--rerun", *override_words(tree)])


def teacher_stage(config: dict, teacher: str, size: str) -> str:
    """The CLI stage that makes a teacher model: `select` below the teacher's own size; there,
    `pretrain`, or `import-teacher` (then `probe` when the teacher names one: the probe job makes
    the teacher model from the import)."""
    spec = teacher_specs(config)[teacher]
    if size != made_size(spec, size):
        return "select"
    if spec["source"] == "timm":
        return "probe" if spec.get("probe") is not None else "import-teacher"
    return "pretrain"


def import_args(config: dict, dataset: str, teacher: str, out_dir: str) -> str:
    spec = teacher_specs(config)[teacher]
    headless = bool(spec.get("headless"))
    tree = {"size": spec["size"], "file": spec.get("file"), "layout": spec.get("layout", "timm"),
            "timm_name": spec.get("timm_name"), "headless": headless,
            "reset_head": not headless, **_data(config, dataset)}
    return _command("import-teacher", out_dir, tree)


def teacher_args(config: dict, dataset: str, teacher: str, size: str, source_model: str | None,
                 out_dir: str) -> str:
    """The job that makes teacher model (dataset, teacher, size); source_model: what a probe or
    select job reads (the import, or the teacher at its own size)."""
    spec, stage = teacher_specs(config)[teacher], teacher_stage(config, teacher, size)
    if stage == "import-teacher":
        return import_args(config, dataset, teacher, out_dir)
    if stage == "probe":
        tree = deep_merge(_data(config, dataset), spec["probe"] or {}, {"teacher": source_model})
        return _command("probe", out_dir, tree)
    if stage == "select":
        test = {k: v for k, v in _stage(config, "teacher", dataset).get("data", {}).items()
                if k in ("test_subset", "eval_batch_size")}
        tree = deep_merge(_data(config, dataset), {"data": test},
                          {"teacher": source_model, "size": size})
        return _command("select", out_dir, tree)
    tree = deep_merge(_data(config, dataset), _stage(config, "teacher", dataset),
                      {"model": {"size": size, "operator": "softmax"},
                       "run": {"seed": config.get("teacher_seed", 0)}})
    return _command("pretrain", out_dir, tree)


def teacher_source(results: str, config: dict, dataset: str, teacher: str,
                   size: str) -> str | None:
    """The run folder a teacher job reads (an import, or the teacher a selection cuts down)."""
    stage = teacher_stage(config, teacher, size)
    if stage == "probe":
        return import_dir(results, dataset, teacher, size)
    if stage == "select":
        return teacher_dir(results, dataset, teacher, made_size(teacher_specs(config)[teacher],
                                                                size))
    return None


def distill_args(config: dict, dataset: str, teacher: str, size: str, operator: str, loss: str,
                 teacher_model: str, out_dir: str) -> str:
    tree = deep_merge(_data(config, dataset), _stage(config, "distill", dataset),
                  {"teacher": teacher_model, "model": {"operator": operator},
                   "distill": {"losses": config["losses"][loss]},
                   "run": {"seed": config.get("teacher_seed", 0)}})
    return _command("distill", out_dir, tree)


def finetune_args(config: dict, cell: Cell, teacher_model: str, distilled_model: str | None,
                  out_dir: str) -> str:
    tree = deep_merge(_data(config, cell.dataset), _stage(config, "finetune", cell.dataset),
                  {"teacher": teacher_model, "distilled": distilled_model,
                   "model": {"operator": cell.operator}, "init": {"strategy": cell.init},
                   "run": {"seed": cell.seed}})
    return _command("finetune", out_dir, tree)


# --- attention maps: the teacher's and its distilled students' (main loss), on one panel ---------
MAPS_TEACHER = "teacher"      # the teacher's own maps; a student's are named by its operator


def attention_panel(config: dict) -> tuple[str, str, str]:
    """(dataset, teacher, size) of the attention-map figure: the first of each."""
    return (next(iter(config["datasets"])), *teacher_students(config)[0])


def attention_models(config: dict, cells: list[Cell]) -> list[str]:
    """The maps jobs of the figure: the teacher, then each operator with a main-loss student."""
    panel = attention_panel(config)
    done = distillations(cells)
    return [MAPS_TEACHER] + [op for op in config["operators"]
                             if (*panel, op, config["main_loss"]) in done]


def maps_dir(results: str, dataset: str, teacher: str, size: str, model: str) -> str:
    return f"{results}/maps/{dataset}/{teacher}/{size}/{model}"


def maps_args(config: dict, dataset: str, teacher_model: str, student_model: str | None,
              out_dir: str) -> str:
    tree = {"teacher": teacher_model,
            **({"model": student_model} if student_model else {}),
            **_data(config, dataset),
            "layers": config["figures"]["attention_layers"],
            "images": config["figures"]["attention_images"]}
    return _command("attention-maps", out_dir, tree)


# --- checks and the grid document ---------------------------------------------------------------
# Grid names become folder names, wildcards and command-line words: a letter or digit first (no
# leading '-' or '.'), then no slash, space, quote or shell character; '+' for strategies such as
# copy_mlp+distill. workflow/schemas/config.schema.yaml repeats this pattern (a test holds them
# equal).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
# The keys that make a config a grid: the schema's `required` (a test holds them equal).
GRID_KEYS = ("datasets", "sizes", "operators", "strategies", "seeds", "losses", "main_loss")


def use_shipped_grid(config: dict, configfiles: list) -> bool:
    """Whether the Snakefile loads the shipped grid (config/config.yaml): only without --configfile.

    A --configfile replaces the shipped grid rather than being merged onto it, so one that lacks
    a grid key is refused instead of silently borrowing the shipped grid's datasets or sizes.
    """
    from linvit.errors import ConfigError  # (linvit.config imports the training stack)

    if not configfiles:
        return True
    missing = [k for k in GRID_KEYS if k not in config]
    if missing:
        raise ConfigError(f"{', '.join(map(str, configfiles))}: no {', '.join(missing)} (a "
                          "--configfile replaces the shipped grid, config/config.yaml, so it "
                          "must define the whole grid)")
    return False


def grid_names(config: dict) -> dict[str, list]:
    """Every name that becomes a path part or a command-line word, by config field."""
    sub, dense = config.get("loss_grid") or {}, config.get("dense") or {}
    return {"datasets": list(config["datasets"]), "sizes": config["sizes"],
            "operators": config["operators"], "strategies": config["strategies"],
            "reference_strategies": config.get("reference_strategies", []),
            "losses": list(config["losses"]), "main_loss": [config["main_loss"]],
            "loss_grid.operators": sub.get("operators", []),
            "loss_grid.strategies": sub.get("strategies", []),
            "loss_grid.losses": sub.get("losses", []),
            "teachers": list(teacher_specs(config)),
            "dense.operators": dense.get("operators", []),
            "dense.strategies": dense.get("strategies", [])}


def check_names(config: dict) -> None:
    """Grid keys present, grid names safe, and a results path Snakemake can put in patterns."""
    from linvit.errors import ConfigError

    missing = [k for k in GRID_KEYS if k not in config]
    if missing:
        raise ConfigError(f"{missing[0]}: required")
    for field, values in grid_names(config).items():
        bad = [v for v in values if not (isinstance(v, str) and re.fullmatch(NAME_PATTERN, v))]
        if bad:
            raise ConfigError(f"{field}: {bad[0]!r} is not an allowed name (names become folders "
                              f"and command-line words; allowed: {NAME_PATTERN})")
    results = config.get("results", "results")
    if not isinstance(results, str) or not results or re.search(r"[{}\n]", results):
        raise ConfigError(f"results: {results!r} must be a non-empty path without braces or "
                          "newlines (Snakemake reads braces in output paths as wildcards)")


def _check_registries(config: dict) -> None:
    from linvit.attention import OPERATORS
    from linvit.data import DATASETS
    from linvit.errors import ConfigError
    from linvit.models import SIZES
    from linvit.transfer.losses import LOSSES
    from linvit.transfer.strategies import STRATEGIES

    def names(field, values, allowed):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ConfigError(f"{field}: {bad} not in: {', '.join(map(str, allowed))}")

    sub = config.get("loss_grid") or {}
    names("sizes", config["sizes"], SIZES)
    names("operators", config["operators"] + sub.get("operators", []), OPERATORS)
    names("strategies", config["strategies"] + config.get("reference_strategies", [])
          + sub.get("strategies", []), STRATEGIES)
    names("main_loss / loss_grid.losses", [config["main_loss"], *sub.get("losses", [])],
          config["losses"])
    for design, weights in config["losses"].items():
        names(f"losses.{design}", weights, LOSSES)
    for name, data in config["datasets"].items():
        names(f"datasets.{name}.dataset", [data["dataset"]], DATASETS)
    for name, spec in teacher_specs(config).items():
        names(f"teachers.{name}.size", [spec["size"]] if spec.get("size") else [], SIZES)
        names(f"teachers.{name}.students", spec.get("students") or [], config["sizes"])


def _check_teachers(config: dict) -> None:
    """Each teacher is fully described, and imported weight files exist now, not only when their
    job starts."""
    from linvit.errors import ConfigError

    for name, spec in teacher_specs(config).items():
        where = f"teachers.{name}"
        if spec["source"] == "timm" and not spec.get("size"):
            raise ConfigError(f"{where}.size: required for a timm teacher (its architecture)")
        if spec["source"] == "pretrain" and spec.get("students") and not spec.get("size"):
            raise ConfigError(f"{where}.students: needs {where}.size (the size it is trained at)")
        for key in ("file", "layout", "timm_name", "headless", "probe"):
            if spec["source"] != "timm" and spec.get(key) is not None:
                raise ConfigError(f"{where}.{key}: only for a timm teacher (source: timm)")
        file = spec.get("file")
        if file is not None and not Path(file).is_file():
            raise ConfigError(f"{where}.file: file not found: {file}")
        if file is not None:
            found_files.note_checked(file)


def job_arguments(config: dict, existing_file: str) -> list[tuple[str, str, str]]:
    """(config field, job folder, CLI arguments) of every job the workflow can run, built by the
    functions the rules call, with `existing_file` standing in for checkpoints not yet made and
    its folder for the dense scenes."""
    cells, x = expand_grid(config), existing_file
    jobs = [(f"teachers.{t}", import_dir("", d, t, s), import_args(config, d, t, "x"))
            for d, t, s in imports(config, cells)]
    jobs += [(_teacher_field(config, t, s), teacher_dir("", d, t, s),
              teacher_args(config, d, t, s, x, "x")) for d, t, s in teachers(config, cells)]
    trained = cells + dense_cells(config, cells)
    jobs += [(f"stages.distill / losses.{k[4]}", distill_dir("", *k),
              distill_args(config, *k, x, "x")) for k in distillations(trained)]
    jobs += [("stages.finetune", cell_dir("", c),
              finetune_args(config, c, x, x if c.needs_distill else None, "x")) for c in trained]
    panel = attention_panel(config)
    jobs += [("figures", maps_dir("", *panel, m),
              maps_args(config, panel[0], x, None if m == MAPS_TEACHER else x, "x"))
             for m in attention_models(config, cells)]
    if config.get("dense"):
        jobs.append(("dense.scenes", "scenes", scenes_args(config, "x")))
        jobs += [(f"dense.stages.{j.task}", dense_dir("", j),
                  dense_args(config, j, x, str(Path(x).parent), "x"))
                 for j in dense_jobs(config, cells)]
    if config.get("bench"):
        jobs.append(("bench", "bench", bench_args(config, "x")))
    if robustness_section(config):
        jobs += [("robustness.corruptions", corrupt_dir("", d), corrupt_args(config, d, "x"))
                 for d in corrupt_datasets(config)]
        corrupted = x if corrupt_datasets(config) else None
        jobs += [("robustness", robustness_dir("", *t, c), robustness_args(config, t[0], x,
                                                                         corrupted, "x"))
                 for *t, c in robustness_targets(config, cells)]
    return [(field, where.lstrip("/"), args) for field, where, args in jobs]


def _teacher_field(config: dict, teacher: str, size: str) -> str:
    """The config field a teacher job's arguments come from, for error messages."""
    if teacher_stage(config, teacher, size) == "pretrain" and not config.get("teachers"):
        return "stages.teacher"
    return f"teachers.{teacher}"


def check_config(config: dict, existing_file: str, memo_dir: Path | None = None) -> None:
    """Names, registries, cross-references and every job's resolved linvit config, before any job
    runs: each job's exact overrides are built into its stage's config (the paper grid's ~400
    jobs take about a second). With `memo_dir`, a verdict stored there for the same config, code
    and environment is reused while the files it found are still there (linvit.workflow.memo): no
    torch import, no rebuild."""
    if memo_dir is None:
        return _check_config(config, existing_file)
    key = memo.key_of({"config": config, "existing_file": existing_file,
                       "environment": memo.environment()})
    found = memo.load(memo_dir, "config_check", key) or {}
    if memo.all_still_files(found.get("files")):
        return
    with found_files.recording() as files:
        _check_config(config, existing_file)
    memo.store(memo_dir, "config_check", key, {"files": sorted(set(files))})


def _check_config(config: dict, existing_file: str) -> None:
    from linvit.cli import stage_config
    from linvit.config import load_config
    from linvit.errors import ConfigError

    check_names(config)
    _check_registries(config)
    _check_teachers(config)
    jobs = job_arguments(config, existing_file)
    built = {}
    for field, where, args in jobs:
        stage, _, _, _, *overrides = shlex.split(args)     # <stage> -o <dir> --rerun k=v ...
        # run.threads: what the shell line of every job but the scenes adds (RUN_AND_RECORD)
        threads = [] if stage == "make-scenes" else ["run.threads=1"]
        try:
            built[where] = load_config(stage_config(stage), None, [*overrides, *threads])
        except ConfigError as e:
            raise ConfigError(f"{field} (job {where}): {e}") from None
    _check_dense_necks(config, built)


def _check_dense_necks(config: dict, built: dict) -> None:
    """ViT-Adapter's interactions and heads against each dense backbone's depth and width (a
    stage config alone does not know its backbone's size). `built`: job folder -> config."""
    from linvit.dense.stages import check_adapter
    from linvit.errors import ConfigError
    from linvit.models import SIZES

    for job in dense_jobs(config, expand_grid(config)) if config.get("dense") else []:
        where = dense_dir("", job).lstrip("/")
        cfg = built[where]
        if cfg.model.neck == "adapter":
            try:
                check_adapter(cfg.model.adapter, SIZES[job.size])
            except ConfigError as e:
                raise ConfigError(f"dense.adapter (job {where}): {e}") from None


AXIS_TABLES = {"by_dataset": "dataset", "by_teacher": "teacher", "by_size": "size"}


def report_tables(config: dict, cells: list[Cell]) -> list[str]:
    """The tables the grid's report has: an axis table only where its axis has 2 or more values
    among the cells (with one value it repeats the main table), the loss design only with a
    loss sub-grid."""
    names = ["main", "claims", "time_to_target"] + (["loss_design"] if config.get("loss_grid")
                                                    else [])
    return names + [name for name, axis in AXIS_TABLES.items()
                    if len({getattr(c, axis) for c in cells}) > 1]


def grid_document(config: dict, cells: list[Cell]) -> dict:
    """What the report steps need to know about the grid: expected cells, axis orders and the
    tables its report has."""
    sub = config.get("loss_grid") or {}
    return {
        "cells": [c.as_dict() for c in cells],
        "main_loss": config["main_loss"],
        "tables": report_tables(config, cells),
        "orders": {
            "init": list(dict.fromkeys(config["strategies"] + config["reference_strategies"]
                                       + sub.get("strategies", []))),
            "operator": list(dict.fromkeys(config["operators"] + sub.get("operators", [])
                                           + ["softmax"])),
            "loss": [NO_LOSS, config["main_loss"], *sub.get("losses", [])],
            "dataset": list(config["datasets"]),
            "teacher": list(teacher_specs(config)),
            "size": list(dict.fromkeys([*config["sizes"],
                                        *(s for _, _, s in teachers(config, cells))])),
        },
    }


# --- dense tasks ------------------------------------------------------------------------------
TEACHER_BACKBONE = "teacher"


@dataclass(frozen=True)
class DenseJob:
    """One dense fine-tuning: a task on the backbone of a teacher or of a fine-tuned cell, with
    heads initialised and data shuffled by the job's seed (a cell's seed; a teacher's own)."""
    task: str
    dataset: str
    teacher: str
    size: str
    backbone: str            # "teacher.seed<seed>" or "<operator>.<init>.<loss>.seed<seed>"

    @property
    def cell(self) -> Cell | None:
        if self.backbone.split(".")[0] == TEACHER_BACKBONE:
            return None
        # operators and strategies are registry names without dots; loss design names may have
        op, init, rest = self.backbone.split(".", 2)
        return Cell(self.dataset, self.teacher, self.size, op, init, rest.rsplit(".", 1)[0],
                    self.seed)

    @property
    def seed(self) -> int:
        return int(self.backbone.rsplit(".", 1)[1].removeprefix("seed"))

    def key(self) -> dict:
        c = self.cell
        return {"task": self.task, "dataset": self.dataset, "teacher": self.teacher,
                "size": self.size,
                "operator": c.operator if c else "softmax",
                "init": c.init if c else TEACHER_BACKBONE, "loss": c.loss if c else NO_LOSS,
                "seed": self.seed}


def backbone_label(cell: Cell) -> str:
    return f"{cell.operator}.{cell.init}.{cell.loss}.seed{cell.seed}"


def dense_jobs(config: dict, cells: list[Cell]) -> list[DenseJob]:
    """The dense sub-grid: each task on each teacher model the cells use and on the backbones of
    dense.operators x dense.strategies x dense.seeds (cells of the grid, or cells made for the
    dense sub-grid alone: dense_cells). The teacher's backbone is one model, trained once; it
    gets a job per seed all the same, so that its row, like the students', spreads over the
    heads' seeds, and each student's gap to it is paired by seed."""
    dense = config.get("dense") or {}
    seeds = dense.get("seeds", config["seeds"][:1])
    jobs = []
    for task, (dataset, teacher, size) in itertools.product(dense.get("tasks", []),
                                                            models_taught(cells)):
        jobs += [DenseJob(task, dataset, teacher, size, f"{TEACHER_BACKBONE}.seed{seed}")
                 for seed in seeds]
        for op, init, seed in itertools.product(dense["operators"], dense["strategies"], seeds):
            loss = config["main_loss"] if get_strategy(init).needs_distilled else NO_LOSS
            cell = Cell(dataset, teacher, size, op, init, loss, seed)
            jobs.append(DenseJob(task, dataset, teacher, size, backbone_label(cell)))
    return jobs


def dense_cells(config: dict, cells: list[Cell]) -> list[Cell]:
    """Backbone cells the dense sub-grid needs beyond the grid's own (e.g. a seed the main grid
    does not run): fine-tuned like any cell, in no table but the dense one."""
    grid_cells = set(cells)
    return [c for c in dict.fromkeys(j.cell for j in dense_jobs(config, cells) if j.cell)
            if c not in grid_cells]


def bench_args(config: dict, out_dir: str) -> str:
    return _command("bench", out_dir, dict(config.get("bench") or {}))


def dense_dir(results: str, job: DenseJob) -> str:
    return f"{results}/dense/{job.task}/{job.dataset}/{job.teacher}/{job.size}/{job.backbone}"


def scenes_args(config: dict, out_dir: str) -> str:
    return _command("make-scenes", out_dir, dict(config["dense"].get("scenes", {})))


def dense_stage(config: dict, task: str) -> dict:
    """`dense.stages.<task>`: the task's linvit fields ({} when absent)."""
    return (config["dense"].get("stages") or {}).get(task) or {}


def dense_uses_scenes(config: dict, task: str) -> bool:
    """Whether the task trains on the embedded scenes (else on the real folder its data names)."""
    return dense_stage(config, task).get("data", {}).get("kind", "scenes") == "scenes"


def dense_in_report(config: dict, results: str) -> list[str]:
    """dense.md as a section of report.md: when `dense.in_all` asks for it (then `all` runs the
    dense sub-grid too), or when the sub-grid has been run (`snakemake dense`), so that the
    report keeps its dense results current."""
    path = f"{results}/dense.md"
    wanted = (config.get("dense") or {}).get("in_all") or Path(path).is_file()
    return [path] if config.get("dense") and wanted else []


def dense_args(config: dict, job: DenseJob, checkpoint: str, scenes: str, out_dir: str) -> str:
    dense = config["dense"]
    neck = {k: dense[k] for k in ("neck", "adapter") if k in dense}
    tree = deep_merge({"data": {"root": scenes}, "model": neck}, dense_stage(config, job.task),
                      {"checkpoint": checkpoint, "run": {"seed": job.seed},     # the seed axis
                       "pretrain_dataset": config["datasets"][job.dataset]["dataset"]})
    return _command(job.task, out_dir, tree)


# --- robustness: corrupted copies made once per dataset, every teacher and cell scored ---------
def robustness_section(config: dict) -> dict:
    """The config's `robustness` section ({} when absent or null: no robustness jobs)."""
    return config.get("robustness") or {}


def corrupt_datasets(config: dict) -> list[str]:
    return list(config["datasets"]) if robustness_section(config).get("corruptions") else []


def robustness_targets(config: dict, cells: list[Cell]) -> list[tuple[str, str, str,
                                                                      Cell | None]]:
    """(dataset, teacher, size, cell) of every model scored: each teacher model (cell None),
    then each cell."""
    return ([(d, t, s, None) for d, t, s in teachers(config, cells)]
            + [(c.dataset, c.teacher, c.size, c) for c in cells])


def corrupt_dir(results: str, dataset: str) -> str:
    return f"{results}/robustness/corrupted/{dataset}"


def robustness_dir(results: str, dataset: str, teacher: str, size: str,
                   cell: Cell | None = None) -> str:
    """A cell's robustness run, or its teacher model's (cell None)."""
    if cell is None:
        return f"{results}/robustness/teachers/{dataset}/{teacher}/{size}"
    return f"{results}/robustness{cell_dir('', cell)}"            # .../robustness/cells/...


def _robustness_data(config: dict, dataset: str) -> dict:
    """The dataset's entry with the section's data fields (batch size, workers, test_subset)."""
    return deep_merge(_data(config, dataset), {"data": robustness_section(config).get("data")
                                               or {}})


def corrupt_args(config: dict, dataset: str, out_dir: str) -> str:
    tree = {**_robustness_data(config, dataset),
            "corruptions": robustness_section(config)["corruptions"]}
    return _command("corrupt", out_dir, tree)


def robustness_args(config: dict, dataset: str, checkpoint: str, corrupted: str | None,
                    out_dir: str) -> str:
    tree = {**_robustness_data(config, dataset), "checkpoint": checkpoint,
            "corrupted": corrupted, "shifts": robustness_section(config).get("shifts") or {}}
    return _command("robustness", out_dir, tree)
