"""The dense sub-grid: UperNet and Mask R-CNN on the backbones of a teacher or of chosen cells,
each with its seed, and the overrides each job gets (linvit.workflow.jobs makes the jobs)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from linvit.transfer.strategies import get_strategy
from linvit.trees import deep_merge
from linvit.workflow.grid import NO_LOSS, Cell, Model, grid_axes, models_taught, reached

TEACHER_BACKBONE = "teacher"


@dataclass(frozen=True)
class DenseRun:
    """One dense fine-tuning: a task on the backbone of a teacher model (cell None) or of a
    fine-tuned cell, with heads initialised and data shuffled by `seed` (a cell's own)."""
    task: str
    model: Model                      # the teacher model (of the cell, when there is one)
    cell: Cell | None
    seed: int

    @property
    def backbone(self) -> str:
        """The job's folder name: "teacher.seed<seed>" or "<operator>.<init>.<loss>.seed<seed>"
        (made here, never parsed back: the job's key says what it is; config axes are folder
        levels of their own)."""
        c = self.cell
        return (f"{TEACHER_BACKBONE}.seed{self.seed}" if c is None
                else f"{c.operator}.{c.init}.{c.loss}.seed{c.seed}")

    def key(self) -> dict:
        c = self.cell
        return {"task": self.task, "dataset": self.model.dataset, "teacher": self.model.teacher,
                "size": self.model.size,
                "operator": c.operator if c else "softmax",
                "init": c.init if c else TEACHER_BACKBONE, "loss": c.loss if c else NO_LOSS,
                "seed": self.seed}


def dense_runs(config: dict, cells: list[Cell]) -> list[DenseRun]:
    """The dense sub-grid: each task on each teacher model the cells use and on the backbones of
    dense.operators x dense.strategies x dense.seeds (cells of the grid, or cells made for the
    dense sub-grid alone: dense_cells), at every combination of the config axes' values that
    reaches them. The teacher's backbone is one model, trained once; it gets a job per seed all
    the same, so that its row, like the students', spreads over the heads' seeds, and each
    student's gap to it is paired by seed."""
    dense = config.get("dense") or {}
    seeds = dense.get("seeds", config["seeds"][:1])
    axes, runs = grid_axes(config), []
    for task, model in itertools.product(dense.get("tasks", []), models_taught(config, cells)):
        runs += [DenseRun(task, model, None, seed) for seed in seeds]
        for op, init, seed in itertools.product(dense["operators"], dense["strategies"], seeds):
            loss = config["main_loss"] if get_strategy(init).needs_distilled else NO_LOSS
            for combo in axes.combinations(reached(config, model.teacher, init)):
                if axes.project(combo, ["teacher"]) != model.axes:
                    continue
                cell = Cell(*model[:3], op, init, loss, seed, combo)
                runs.append(DenseRun(task, model, cell, seed))
    return runs


def dense_cells(config: dict, cells: list[Cell]) -> list[Cell]:
    """Backbone cells the dense sub-grid needs beyond the grid's own (e.g. a seed the main grid
    does not run): fine-tuned like any cell, in no table but the dense one."""
    grid_cells = set(cells)
    return [c for c in dict.fromkeys(r.cell for r in dense_runs(config, cells) if r.cell)
            if c not in grid_cells]


def scenes_overrides(config: dict) -> dict:
    return dict(config["dense"].get("scenes", {}))


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
    from linvit.report.paths import ResultsFolder

    path = ResultsFolder(results).section("dense")
    wanted = (config.get("dense") or {}).get("in_all") or Path(path).is_file()
    return [path] if config.get("dense") and wanted else []


def dense_overrides(config: dict, run: DenseRun, checkpoint: str, scenes: str) -> dict:
    dense = config["dense"]
    neck = {k: dense[k] for k in ("neck", "adapter") if k in dense}
    return deep_merge({"data": {"root": scenes}, "model": neck}, dense_stage(config, run.task),
                      {"checkpoint": checkpoint, "run": {"seed": run.seed},     # the seed axis
                       "pretrain_dataset": config["datasets"][run.model.dataset]["dataset"]})
