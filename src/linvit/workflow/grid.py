"""The ablation grid: which cells, teachers and distillations a workflow config asks for, and the
linvit overrides (a config tree) each of their jobs gets. linvit.workflow.jobs makes the jobs.

A cell is one fine-tuned student: (dataset, teacher, size, operator, init strategy, loss design,
seed) and a value of each config axis (linvit.workflow.axes). Cells share work: one teacher model
per (dataset, teacher, size, teacher axes), one distillation per (dataset, teacher, size,
operator, loss design, teacher and distill axes). Strategies that take nothing from a distilled
student get loss "none", and "none" on every distill axis.

Teachers are named (config `teachers`; default one, "pretrain", trained here at every size). A
teacher is made at its own size (pretrained, or imported from timm weights and, if configured,
given a head by `linvit probe`); for each smaller student size it serves, weight selection
(`linvit select`) cuts a teacher of that size out of it: the teacher size -> student size axis.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

from linvit.errors import ConfigError
from linvit.transfer.strategies import get_strategy
from linvit.trees import deep_merge, unflatten, without
from linvit.workflow import axes as ax
from linvit.workflow import selection as sel
from linvit.workflow.axes import Axes, Combo
from linvit.workflow.schema import NAME_PATTERN

NO_LOSS = "none"
CELL_FIELDS = ("dataset", "teacher", "size", "operator", "init", "loss", "seed")


@dataclass(frozen=True)
class Cell:
    dataset: str
    teacher: str
    size: str
    operator: str
    init: str
    loss: str
    seed: int
    axes: Combo = ()                  # (config axis, value label) pairs, in the config's order

    @property
    def needs_distill(self) -> bool:
        return get_strategy(self.init).needs_distilled

    def as_dict(self) -> dict:
        """Its key: the built-in axes, then the config's, the seed last."""
        key = {f: getattr(self, f) for f in CELL_FIELDS[:-1]}
        return {**key, **dict(self.axes), "seed": self.seed}

    @classmethod
    def of(cls, key: dict) -> Cell:
        """The cell of a job's key (as_dict's inverse)."""
        return cls(*(key[f] for f in CELL_FIELDS),
                   tuple((k, v) for k, v in key.items() if k not in CELL_FIELDS))


class Model(NamedTuple):
    """One teacher model: what a teacher job makes and the cells take."""
    dataset: str
    teacher: str
    size: str
    axes: Combo = ()                  # the teacher axes' values


class Distillation(NamedTuple):
    dataset: str
    teacher: str
    size: str
    operator: str
    loss: str
    axes: Combo = ()                  # the teacher and distill axes' values
    seed: int | None = None           # its cells' seed (replicate_distillations), else None

    @property
    def model(self) -> Model:
        return Model(self.dataset, self.teacher, self.size, self.axes)


def grid_axes(config: dict) -> Axes:
    """The config's own axes (checked; linvit.workflow.axes)."""
    return ax.parse(config, NAME_PATTERN)


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


def reached(config: dict, teacher: str, init: str) -> dict[str, bool]:
    """Which stages' axes reach a cell of this teacher and strategy: a teacher axis only a
    teacher trained here, a distill axis only a strategy that takes a distilled student."""
    return {"teacher": teacher_specs(config)[teacher]["source"] == "pretrain",
            "distill": get_strategy(init).needs_distilled, "finetune": True}


def _cells(config: dict, operators, strategies, losses, seeds=None, datasets=None,
           sizes=None) -> list[Cell]:
    out, axes = [], grid_axes(config)
    pairs = [(t, s) for t, s in teacher_students(config) if sizes is None or s in sizes]
    for dataset, (teacher, size), op, init, seed in itertools.product(
            datasets or config["datasets"], pairs, operators, strategies,
            config["seeds"] if seeds is None else seeds):
        designs = losses if get_strategy(init).needs_distilled else [NO_LOSS]
        for combo in axes.combinations(reached(config, teacher, init)):
            out += [Cell(dataset, teacher, size, op, init, loss, seed, combo) for loss in designs]
    return out


def expand_grid(config: dict) -> list[Cell]:
    """Main grid, softmax reference cells, the loss-design sub-grid, then the seed sub-grids;
    no duplicates."""
    cells = _cells(config, config["operators"], config["strategies"], [config["main_loss"]])
    cells += _cells(config, ["softmax"], config["reference_strategies"], [config["main_loss"]])
    sub = config.get("loss_grid") or {}
    if sub:
        cells += _cells(config, sub["operators"], sub["strategies"], sub["losses"])
    for entry in config.get("seed_grid") or []:
        cells += _seed_cells(config, entry)
    return list(dict.fromkeys(cells))


def _seed_cells(config: dict, entry: dict) -> list[Cell]:
    """One `seed_grid` entry's cells: its seeds on its part of the main grid (the softmax
    operator takes the reference strategies among its strategies)."""
    ops = entry.get("operators") or [*config["operators"], "softmax"]
    strategies = entry.get("strategies") or [*config["strategies"],
                                             *config["reference_strategies"]]
    where = dict(seeds=entry["seeds"], datasets=entry.get("datasets"), sizes=entry.get("sizes"))
    out = []
    for op in ops:
        own = config["reference_strategies"] if op == "softmax" else config["strategies"]
        out += _cells(config, [op], [s for s in strategies if s in own],
                      [config["main_loss"]], **where)
    return out


def check_seed_grid(config: dict) -> None:
    """Each `seed_grid` entry names the grid's own datasets, sizes, operators and strategies
    (what the schema cannot say), and adds at least one cell."""
    allowed = {"datasets": list(config["datasets"]), "sizes": config["sizes"],
               "operators": [*config["operators"], "softmax"],
               "strategies": [*config["strategies"], *config["reference_strategies"]]}
    for i, entry in enumerate(config.get("seed_grid") or []):
        for field, names in allowed.items():
            bad = [n for n in entry.get(field) or [] if n not in names]
            if bad:
                raise ConfigError(f"seed_grid[{i}].{field}: {bad[0]!r} is not one of the "
                                  f"grid's {field} ({', '.join(map(str, names))})")
        if not _seed_cells(config, entry):
            raise ConfigError(f"seed_grid[{i}]: adds no cell (its strategies are none of its "
                              "operators': softmax takes the reference strategies)")


def teachers(config: dict, cells: list[Cell]) -> list[Model]:
    """Every teacher model: each one the cells use and, before a selected one, the teacher at
    its own size that it is cut out of."""
    used = models_taught(config, cells)
    specs = teacher_specs(config)
    made = [m._replace(size=made_size(specs[m.teacher], m.size)) for m in used]
    return list(dict.fromkeys([*made, *used]))


def model_of(config: dict, cell: Cell) -> Model:
    return Model(cell.dataset, cell.teacher, cell.size,
                 grid_axes(config).project(cell.axes, ["teacher"]))


def models_taught(config: dict, cells: list[Cell]) -> list[Model]:
    """The teacher models the cells take, in grid order."""
    return list(dict.fromkeys(model_of(config, c) for c in cells))


def imports(config: dict, cells: list[Cell]) -> list[tuple[str, str, str]]:
    """(dataset, teacher, size) of the imports a probe job then gives a head (a teacher axis
    does not reach imported teachers: one import each)."""
    return list(dict.fromkeys(m[:3] for m in teachers(config, cells)
                              if teacher_stage(config, m.teacher, m.size) == "probe"))


def replicated(config: dict) -> bool:
    """Whether each seed's cells take a distillation made with that seed (its variance then in
    the cells' intervals), or every seed the one made with teacher_seed."""
    return bool(config.get("replicate_distillations"))


def distillation_of(config: dict, cell: Cell) -> Distillation:
    return Distillation(cell.dataset, cell.teacher, cell.size, cell.operator, cell.loss,
                        grid_axes(config).project(cell.axes, ["teacher", "distill"]),
                        cell.seed if replicated(config) else None)


def distillations(config: dict, cells: list[Cell]) -> list[Distillation]:
    return list(dict.fromkeys(distillation_of(config, c) for c in cells if c.needs_distill))


# --- each job's overrides: a tree, flattened to `key=value` words only by linvit.workflow.jobs ---
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


def import_overrides(config: dict, dataset: str, teacher: str) -> dict:
    spec = teacher_specs(config)[teacher]
    headless = bool(spec.get("headless"))
    return {"size": spec["size"], "file": spec.get("file"), "layout": spec.get("layout", "timm"),
            "timm_name": spec.get("timm_name"), "headless": headless,
            "reset_head": not headless, **_data(config, dataset)}


def teacher_overrides(config: dict, model: Model, source_model: str | None) -> dict:
    """The job that makes a teacher model; source_model: what a probe or select job reads (the
    import, or the teacher at its own size)."""
    dataset, teacher, size = model[:3]
    spec, stage = teacher_specs(config)[teacher], teacher_stage(config, teacher, size)
    if stage == "import-teacher":
        return import_overrides(config, dataset, teacher)
    if stage == "probe":
        return deep_merge(_data(config, dataset), spec["probe"] or {}, {"teacher": source_model})
    if stage == "select":
        test = {k: v for k, v in _stage(config, "teacher", dataset).get("data", {}).items()
                if k in ("test_subset", "eval_batch_size")}
        return deep_merge(_data(config, dataset), {"data": test},
                          {"teacher": source_model, "size": size})
    return deep_merge(_data(config, dataset), _stage(config, "teacher", dataset),
                      grid_axes(config).overrides(model.axes, "teacher"),
                      {"model": {"size": size, "operator": "softmax"},
                       "run": {"seed": config.get("teacher_seed", 0)}})


def distill_overrides(config: dict, distillation: Distillation, teacher_model: str) -> dict:
    d = distillation
    return deep_merge(_data(config, d.dataset), _stage(config, "distill", d.dataset),
                      grid_axes(config).overrides(d.axes, "distill"),
                      {"teacher": teacher_model, "model": {"operator": d.operator},
                       "distill": {"losses": config["losses"][d.loss]},
                       "run": {"seed": config.get("teacher_seed", 0) if d.seed is None
                               else d.seed}})


def finetune_overrides(config: dict, cell: Cell, teacher_model: str,
                       distilled_model: str | None, candidate: dict | None = None) -> dict:
    """A cell's overrides; with a `selection`, the validation images held out and the fields
    it chooses left to the chosen candidate (its file) or set to `candidate` (a candidate's
    own job, scored on the validation images)."""
    stage = _stage(config, "finetune", cell.dataset)
    chosen = sel.section(config).get("candidates") or {}
    tree = deep_merge(_data(config, cell.dataset), without(stage, chosen),
                      sel.held_out(config), grid_axes(config).overrides(cell.axes, "finetune"),
                      {"teacher": teacher_model, "distilled": distilled_model,
                       "model": {"operator": cell.operator}, "init": {"strategy": cell.init},
                       "run": {"seed": cell.seed}})
    if candidate is not None:
        # scored on every validation image (test_subset subsets the test split)
        tree = deep_merge(tree, unflatten(candidate),
                          {"data": {"evaluate_on": "val", "test_subset": None}})
    return tree


# --- attention maps: the teacher's and its distilled students' (main loss), on one panel ---------
MAPS_TEACHER = "teacher"      # the teacher's own maps; a student's are named by its operator


def attention_panel(config: dict) -> Model:
    """The teacher model of the attention-map figure: the first dataset, teacher and size, and
    the first value of each teacher axis."""
    teacher, size = teacher_students(config)[0]
    axes = grid_axes(config)
    combo = axes.first(reached(config, teacher, "distill"))
    return Model(next(iter(config["datasets"])), teacher, size, axes.project(combo, ["teacher"]))


def attention_students(config: dict, cells: list[Cell]) -> list[Distillation]:
    """The students of the figure: each operator's main-loss distillation of the panel's
    teacher (the first value of each distill axis) that the grid makes."""
    panel, axes = attention_panel(config), grid_axes(config)
    combo = axes.first(reached(config, panel.teacher, "distill"))
    seed = config["seeds"][0] if replicated(config) else None
    students = [Distillation(*panel[:3], op, config["main_loss"],
                             axes.project(combo, ["teacher", "distill"]), seed)
                for op in config["operators"]]
    done = set(distillations(config, cells))
    return [d for d in students if d in done]


def maps_overrides(config: dict, dataset: str, teacher_model: str,
                   student_model: str | None) -> dict:
    return {"teacher": teacher_model,
            **({"model": student_model} if student_model else {}),
            **_data(config, dataset),
            "layers": config["figures"]["attention_layers"],
            "images": config["figures"]["attention_images"]}


def axis_tables(config: dict, cells: list[Cell]) -> dict[str, str]:
    """by_<axis> -> axis, for each axis (dataset, teacher, size and the config's) with 2 or more
    values among the cells (with one value it would repeat the main table)."""
    values = {name: {getattr(c, name) for c in cells} for name in ("dataset", "teacher", "size")}
    values.update({a.name: {dict(c.axes)[a.name] for c in cells} - {ax.NONE}
                   for a in grid_axes(config)})
    return {f"by_{name}": name for name, found in values.items() if len(found) > 1}


def report_tables(config: dict, cells: list[Cell]) -> list[str]:
    """The tables the grid's report has: the axis tables (axis_tables), the loss design only
    with a loss sub-grid."""
    names = ["main", "claims", "time_to_target"] + (["loss_design"] if config.get("loss_grid")
                                                    else [])
    quality = ["distill_quality"] if any(c.needs_distill for c in cells) else []
    chosen = ["selection"] if sel.section(config) else []
    return names + quality + chosen + list(axis_tables(config, cells))


def grid_document(config: dict, cells: list[Cell]) -> dict:
    """What the report steps need to know about the grid: expected cells, its config axes, axis
    orders and the tables its report has."""
    sub = config.get("loss_grid") or {}
    axes = grid_axes(config)
    document = {
        "cells": [c.as_dict() for c in cells],
        "main_loss": config["main_loss"],
        "tables": report_tables(config, cells),
        "axes": [a.as_dict() for a in axes],
        # axes varied a group at a time: the combinations of the design, which alone the
        # tables fill in for a job an axis does not reach (linvit.report.grid)
        **({"combinations": [[label for _, label in combo] for combo in axes.combinations(
            {"teacher": True, "distill": True, "finetune": True})]} if axes.groups else {}),
        "margins": dict((config.get("claims") or {}).get("margins") or {}),
        **({"selection": {"candidates": [list(c) for c in sel.candidates(config)]}}
           if sel.section(config) else {}),
        "orders": {
            "init": list(dict.fromkeys(config["strategies"] + config["reference_strategies"]
                                       + sub.get("strategies", []))),
            "operator": list(dict.fromkeys(config["operators"] + sub.get("operators", [])
                                           + ["softmax"])),
            "loss": [NO_LOSS, config["main_loss"], *sub.get("losses", [])],
            "dataset": list(config["datasets"]),
            "teacher": list(teacher_specs(config)),
            "size": list(dict.fromkeys([*config["sizes"],
                                        *(m.size for m in teachers(config, cells))])),
            **{a.name: list(a.labels) for a in axes},
        },
    }
    if config.get("dense"):              # the dense table's columns: each task's headline
        from linvit.dense.tasks import TASKS

        document["dense_columns"] = [[task, metric] for task in config["dense"]["tasks"]
                                     for metric in TASKS[task].headline]
    return document


def bench_overrides(config: dict) -> dict:
    return dict(config.get("bench") or {})


# --- export: chosen cells as timm / Hub folders (target `export`) -----------------------------
def export_section(config: dict) -> dict:
    """The config's `export` section ({} when absent or null: no export jobs)."""
    return config.get("export") or {}


def export_cells(config: dict, cells: list[Cell]) -> list[Cell]:
    """The grid's cells of export.operators x export.strategies (main loss), at export.seeds
    (default: every seed) and export.datasets (default: every dataset); an operator or strategy
    that names no cell of the grid is refused, so a typo exports nothing silently."""
    section = export_section(config)
    wanted = {"operator": section.get("operators") or [], "init": section.get("strategies") or [],
              "seed": section.get("seeds") or config["seeds"],
              "dataset": section.get("datasets") or list(config["datasets"])}
    chosen = [c for c in cells if all(getattr(c, f) in v for f, v in wanted.items())
              and c.loss in (config["main_loss"], NO_LOSS)]
    for field, name in (("operator", "operators"), ("init", "strategies")):
        missing = sorted(set(wanted[field]) - {getattr(c, field) for c in chosen})
        if missing:
            raise ConfigError(f"export.{name}: {missing[0]!r} names no cell of this grid at "
                              "the chosen seeds and datasets")
    return chosen


def export_overrides(config: dict, source: str) -> dict:
    """`linvit export` fields of a chosen cell: its run folder, then export.stage's."""
    return {**(export_section(config).get("stage") or {}), "source": source}


# --- robustness: corrupted copies made once per dataset, every teacher and cell scored ---------
def robustness_section(config: dict) -> dict:
    """The config's `robustness` section ({} when absent or null: no robustness jobs)."""
    return config.get("robustness") or {}


def corrupt_datasets(config: dict) -> list[str]:
    return list(config["datasets"]) if robustness_section(config).get("corruptions") else []


def _robustness_data(config: dict, dataset: str) -> dict:
    """The dataset's entry with the section's data fields (batch size, workers, test_subset)."""
    return deep_merge(_data(config, dataset), {"data": robustness_section(config).get("data")
                                               or {}})


def corrupt_overrides(config: dict, dataset: str) -> dict:
    return {**_robustness_data(config, dataset),
            "corruptions": robustness_section(config)["corruptions"]}


def robustness_overrides(config: dict, dataset: str, checkpoint: str,
                         corrupted: str | None) -> dict:
    section = robustness_section(config)
    partial = {"partial_shifts": True} if section.get("partial_shifts") else {}
    return {**_robustness_data(config, dataset), "checkpoint": checkpoint,
            "corrupted": corrupted, "shifts": section.get("shifts") or {}, **partial}
