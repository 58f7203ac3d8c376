"""grid.json as the report steps read it: the grid's expected cells, its config axes, the axis
orders, the main loss design and the report's tables; and what follows from them for every
table, figure and claim: the key columns, the groupings and the main-grid rows.

A config axis a job is not reached by (a strategy without distillation on a distill axis, a
teacher on a finetune axis) leaves that job the value "none" (or no value: the axis is not in
its key). Such a job's one result stands in every value of the axis: `complete` repeats its row
once per value, so that each combination of the axes' values has its teacher, its controls and
its reference, as each loss design of the sub-grid shares the cells without distillation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from linvit.errors import ResultsError

NONE = "none"
# results.csv's key columns before the config axes (a teacher has no operator, init, loss, seed)
KEY = ["kind", "task", "dataset", "teacher", "size", "operator", "init", "loss", "candidate",
       "seed"]
MODEL = ["dataset", "teacher", "size"]           # one teacher model
REQUIRED = ("cells", "main_loss", "orders", "tables")


@dataclass(frozen=True)
class Grid:
    cells: list[dict]
    main_loss: str
    orders: dict
    tables: list[str]
    axes: list[dict] = field(default_factory=list)   # {name, stage, values} in config order
    dense_columns: list = field(default_factory=list)
    margins: dict = field(default_factory=dict)      # the claims' margins (claims.margins)
    selection: dict = field(default_factory=dict)    # {"candidates": [[label, settings]]}
    combinations: list = field(default_factory=list)  # axis_groups: the design's, else all

    @property
    def axis_names(self) -> list[str]:
        return [a["name"] for a in self.axes]

    @property
    def key(self) -> list[str]:
        """results.csv's key columns: the built-in ones, then each config axis."""
        return KEY + self.axis_names

    def varying(self, stages=("teacher", "distill", "finetune")) -> list[str]:
        """The config axes of `stages` with 2 or more values: groupings of every table."""
        return [a["name"] for a in self.axes if len(a["values"]) > 1 and a["stage"] in stages]

    @property
    def group(self) -> list[str]:
        """One panel, one block of a table: a teacher model and a value of each varying axis."""
        return MODEL + self.varying()

    @property
    def student(self) -> list[str]:
        """What a claim is decided within: the group and the operator."""
        return self.group + ["operator"]

    def main(self, frame: pd.DataFrame) -> pd.DataFrame:
        """The main grid's cells: the main loss design, or none (no distillation)."""
        return frame[(frame["kind"] == "cell") & frame["loss"].isin([self.main_loss, NONE])]

    def complete(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Each row without a value of a config axis repeated once per value (module doc), into
        the design's combinations alone where the axes vary a group at a time."""
        frame = frame.reset_index(drop=True)      # rows by position (an index may repeat)
        for axis in self.axes:
            name, labels = axis["name"], list(axis["values"])
            column = frame[name] if name in frame else pd.Series(None, index=frame.index,
                                                                  dtype=object)
            absent = (column.isna() | (column.astype(str) == NONE)).to_numpy()
            repeats = [len(labels) if a else 1 for a in absent]
            out = frame.loc[frame.index.repeat(repeats)].copy()
            values = [label for a, v in zip(absent, column) for label in (labels if a else [v])]
            out[name] = values
            frame = out.reset_index(drop=True)
        if self.combinations and self.axes:       # only the design's combinations (axis_groups)
            names = self.axis_names
            design = {tuple(str(v) for v in c) for c in self.combinations}
            kept = [tuple(str(v) for v in row) in design for row in frame[names].to_numpy()]
            frame = frame[kept].reset_index(drop=True)
        return frame


def read_grid(path: str | Path) -> Grid:
    """grid.json: the expected cells, the config axes, the axis orders, the main loss design and
    the report's tables."""
    doc = json.loads(Path(path).read_text())
    lacking = [k for k in REQUIRED if k not in doc]
    if lacking:
        raise ResultsError(f"{path}: no {', '.join(lacking)} (written by an older linvit): rerun "
                         "the workflow, which rewrites it")
    return Grid(doc["cells"], doc["main_loss"], doc["orders"], doc["tables"],
                doc.get("axes", []), doc.get("dense_columns", []), doc.get("margins", {}),
                doc.get("selection", {}), doc.get("combinations", []))
