"""Fine-tuning settings chosen on a validation split before the grid (config `selection`):

    selection:
      val_size: 500               # images held out of each dataset's training split (val_seed)
      seed: 0                     # the one seed every candidate runs on
      operators: [linear]         # optional: the operators candidates run on (default: all)
      candidates:                 # every combination is a candidate: here 2 x 2
        optim.lr: [5.0e-4, 1.0e-3]
        optim.warmup_epochs: [0, 1]

Each strategy of the grid, `random` and the copied ones alike, and the softmax reference, runs
every candidate on one seed, trained without the validation images and scored on them; per
(dataset, teacher, size, config axes, strategy) the candidate with the best validation top-1
(the mean over the grid's operators, or over `operators` where the section names some: fewer
candidate runs, the choice applied to every operator; the first candidate on a tie) is chosen
(linvit.report.selection) and the grid's cells of that strategy fine-tune with it, also without
the validation images: the test split gives the final numbers only. The report names what each
strategy got and what the selection cost.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

from linvit.errors import ConfigError
from linvit.workflow.axes import GRID_FIELDS

SOFTMAX = "softmax"
STUDENTS, REFERENCE = "students", "reference"      # the linear operators, or the softmax one


class Choice(NamedTuple):
    """One choice: the cells of one strategy (of the linear operators, or the softmax
    reference) of one teacher model at one combination of the config axes."""
    dataset: str
    teacher: str
    size: str
    init: str
    family: str                    # STUDENTS or REFERENCE
    axes: tuple = ()


def section(config: dict) -> dict:
    return config.get("selection") or {}


def candidates(config: dict) -> list[tuple[str, dict]]:
    """(label, {field: value}) of every combination of the candidates' values: c0, c1, ..."""
    fields = section(config).get("candidates") or {}
    combos = itertools.product(*fields.values())
    return [(f"c{i}", dict(zip(fields, values))) for i, values in enumerate(combos)]


def check(config: dict) -> None:
    """What the schema cannot say: fields the grid sets itself, or that an axis also varies."""
    fields = section(config).get("candidates") or {}
    if section(config) and not fields:
        raise ConfigError("selection.candidates: name at least one field and its values")
    bad = [op for op in section(config).get("operators") or [] if op not in config["operators"]]
    if bad:
        raise ConfigError(f"selection.operators: {bad[0]!r} is not one of the grid's operators "
                          f"({', '.join(config['operators'])})")
    axes = config.get("axes") or {}
    for field in fields:
        where = f"selection.candidates.{field}"
        for own, why in GRID_FIELDS["finetune"].items():
            if field == own or own.startswith(field + ".") or field.startswith(own + "."):
                raise ConfigError(f"{where}: set by the grid in finetune jobs ({why})")
        if field.startswith("data."):
            raise ConfigError(f"{where}: the data fields stay the same for every candidate")
        for name, axis in axes.items():
            if axis.get("stage") == "finetune" and axis.get("field") == field:
                raise ConfigError(f"{where}: also varied by axes.{name}: choose it or sweep it")


def runs_on(config: dict, operator: str) -> bool:
    """Whether the candidates run on `operator`'s cells: the softmax reference always (its own
    choice), a linear operator where `operators` names it or is absent."""
    chosen_on = section(config).get("operators")
    return operator == SOFTMAX or not chosen_on or operator in chosen_on


def choice_of(cell) -> Choice:
    return Choice(cell.dataset, cell.teacher, cell.size, cell.init,
                  REFERENCE if cell.operator == SOFTMAX else STUDENTS, cell.axes)


def held_out(config: dict) -> dict:
    """The data fields of every fine-tuning when selection is on: the validation images held
    out ({} when it is off)."""
    s = section(config)
    if not s:
        return {}
    return {"data": {"val_size": s["val_size"], "val_seed": s.get("val_seed", 0)}}


def selection_seed(config: dict) -> int:
    return section(config).get("seed", config["seeds"][0])
