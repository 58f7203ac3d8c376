"""Config axes: any field of a stage's config made an axis of the grid, by config alone.

    axes:
      distill_epochs: {stage: distill, field: optim.epochs, values: [5, 20]}
      ft_lr:          {stage: finetune, field: optim.lr, values: {low: 5.0e-4, high: 1.0e-3}}
      recipe:         {stage: finetune, values: {short: {optim.epochs: 1},
                                                 long: {optim.epochs: 5, optim.lr: 5.0e-4}}}

A value is named by its label: the value itself (5, random, 0.001) in the list form, the key in
the mapping forms (an axis that sets several fields together names each of its values). Labels
become folder names (`<axis>=<label>`) and table entries.

An axis on a stage multiplies that stage's jobs and every job downstream that takes one of them:
a teacher axis the teachers trained here and everything after; a distill axis the distillations
and the cells of strategies that take a distilled student; a finetune axis the cells and what
scores them. A job the axis does not reach (a strategy without distillation on a distill axis,
an imported teacher on a teacher axis, every teacher on a finetune axis) has the value `none`,
as such strategies have the loss design `none`; the report lets it stand in every value of the
axis (linvit.report.grid).

Axes are crossed (the full factorial) unless `axis_groups` splits them into groups varied one
group at a time: each group's axes crossed, every other axis at its first value, the baseline.

    axis_groups: [[attn_start, e2e], [d_epochs]]     # 2 x 2 + 3 - 1 = 6 combinations, not 12

The baseline is one combination of every group, so grids that would each vary one design axis
around the same baseline become one grid that computes the baseline once.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from linvit.errors import ConfigError
from linvit.trees import deep_merge, unflatten

NONE = "none"                 # the value of an axis a job is not reached by
# axis stage -> the CLI stage whose config the axis's fields belong to
STAGES = {"teacher": "pretrain", "distill": "distill", "finetune": "finetune"}
# Axis names are wildcards and results.csv columns: identifiers, none of the grid's own.
AXIS_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
BUILT_IN = ("dataset", "teacher", "size", "operator", "init", "loss", "seed", "task", "model",
            "backbone", "stage", "kind")
# Fields the grid sets itself in a stage's jobs: each has its own axis or config key.
GRID_FIELDS = {
    "teacher": {"data.dataset": "datasets", "model.size": "sizes", "model.operator": "softmax",
                "run.seed": "teacher_seed", "run.threads": "the job's threads"},
    "distill": {"data.dataset": "datasets", "teacher": "teachers", "model.operator": "operators",
                "distill.losses": "losses / main_loss", "run.seed": "teacher_seed",
                "run.threads": "the job's threads"},
    "finetune": {"data.dataset": "datasets", "teacher": "teachers", "distilled": "distillation",
                 "model.operator": "operators", "init.strategy": "strategies",
                 "run.seed": "seeds", "run.threads": "the job's threads"},
}


@dataclass(frozen=True)
class Axis:
    name: str
    stage: str
    labels: tuple[str, ...]
    settings: tuple[tuple[tuple[str, object], ...], ...]   # per label: (field, value) pairs

    def tree(self, label: str) -> dict:
        """The overrides of one value as a nested mapping ({} for `none`)."""
        if label == NONE:
            return {}
        return unflatten(dict(self.settings[self.labels.index(label)]))

    def as_dict(self) -> dict:
        """What the report reads of it (grid.json)."""
        return {"name": self.name, "stage": self.stage, "values": list(self.labels)}


Combo = tuple[tuple[str, str], ...]      # (axis name, label) pairs, in the config's order


@dataclass(frozen=True)
class Axes:
    """The config's axes, in its order, and the groups varied one at a time (default: one
    group of all axes, the full factorial)."""
    axes: tuple[Axis, ...] = ()
    groups: tuple[tuple[str, ...], ...] | None = None

    def __iter__(self):
        return iter(self.axes)

    def names(self, stages=tuple(STAGES)) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes if a.stage in stages)

    def combinations(self, reached: dict[str, bool]) -> list[Combo]:
        """Every combination of values for a job that the stages `reached` (stage -> whether
        the job takes that stage's work) reach: `none` on the axes of stages it does not."""
        out = []
        for group in self.groups or (self.names(),):
            choices = [[(a.name, label) for label in
                        ((a.labels if a.name in group else a.labels[:1])
                         if reached.get(a.stage) else (NONE,))] for a in self.axes]
            out += [tuple(c) for c in itertools.product(*choices)]
        return list(dict.fromkeys(out))

    def project(self, combo: Combo, stages) -> Combo:
        """The part of `combo` on the axes of `stages`."""
        names = set(self.names(stages))
        return tuple((n, v) for n, v in combo if n in names)

    def overrides(self, combo: Combo, stage: str) -> dict:
        """The overrides `combo` gives a job of `stage`."""
        by_name = {a.name: a for a in self.axes}
        return deep_merge(*(by_name[n].tree(v) for n, v in combo if by_name[n].stage == stage))

    def first(self, reached: dict[str, bool]) -> Combo:
        """The first combination (the attention-map figure draws one panel)."""
        return self.combinations(reached)[0]

    def describe(self, combo: Combo, stage: str) -> str:
        """" / axes.x=v, ..." for the config field of a job's errors ("" without axes)."""
        parts = [f"axes.{n}={v}" for n, v in combo if v != NONE and n in self.names([stage])]
        return f" / {', '.join(parts)}" if parts else ""


def parse(config: dict, name_pattern: str) -> Axes:
    """The config's `axes`, checked for what the schema cannot say: names of their own, labels
    usable as folder names and distinct, fields the grid does not set itself. (Field types:
    `check_types`, which imports the stages' configs.)"""
    axes = []
    for name, spec in (config.get("axes") or {}).items():
        where = f"axes.{name}"
        if not re.fullmatch(AXIS_NAME, name) or name in BUILT_IN:
            raise ConfigError(f"{where}: an axis name must be an identifier ({AXIS_NAME}) and "
                              f"not one of the grid's own: {', '.join(BUILT_IN)}")
        labels, settings = _values(where, spec)
        for label in labels:
            if label == NONE or not re.fullmatch(name_pattern, label):
                raise ConfigError(f"{where}: value label {label!r} cannot name a folder (labels "
                                  f"match {name_pattern} and are not {NONE!r}); give the values "
                                  "as a mapping, label: value")
        if len(set(labels)) < len(labels):
            twice = next(label for label in labels if labels.count(label) > 1)
            raise ConfigError(f"{where}.values: two values with the label {twice!r}")
        for fields in settings:
            for field, _ in fields:
                _check_not_set_by_grid(where, spec["stage"], field)
        axes.append(Axis(name, spec["stage"], tuple(labels), tuple(settings)))
    return Axes(tuple(axes), _groups(config, [a.name for a in axes]))


def _groups(config: dict, names: list[str]) -> tuple[tuple[str, ...], ...] | None:
    """`axis_groups`, checked: every axis in exactly one group."""
    groups = config.get("axis_groups")
    if not groups:
        return None
    seen = [n for g in groups for n in g]
    unknown = [n for n in seen if n not in names]
    if unknown:
        raise ConfigError(f"axis_groups: {unknown[0]!r} is not an axis of the grid "
                          f"(axes: {', '.join(names) or 'none'})")
    twice = [n for n in names if seen.count(n) > 1]
    if twice:
        raise ConfigError(f"axis_groups: {twice[0]!r} is in two groups")
    missing = [n for n in names if n not in seen]
    if missing:
        raise ConfigError(f"axis_groups: axis {missing[0]!r} is in no group (each axis is in "
                          "exactly one; a group of one varies that axis alone)")
    return tuple(tuple(g) for g in groups)


def _values(where: str, spec: dict) -> tuple[list[str], list[tuple]]:
    """(labels, per label its (field, value) pairs) of the three forms."""
    values, field = spec["values"], spec.get("field")
    if field is not None and isinstance(values, list):
        return [label_of(where, v) for v in values], [((field, v),) for v in values]
    if isinstance(values, dict):
        _check_label_keys(where, values)
    if field is not None:
        return [str(k) for k in values], [((field, v),) for v in values.values()]
    if not isinstance(values, dict) or not all(isinstance(v, dict) and v
                                               for v in values.values()):
        raise ConfigError(f"{where}: without `field`, values must map each label to the fields "
                          "it sets, e.g. {short: {optim.epochs: 1}}")
    return [str(k) for k in values], [tuple(v.items()) for v in values.values()]


def _check_label_keys(where: str, values: dict) -> None:
    # YAML 1.1 reads an unquoted off/on/no/yes as a boolean: the label would name folders "False"
    for key in values:
        if isinstance(key, bool):
            raise ConfigError(f"{where}.values: the label {key!r} is a boolean (YAML reads an "
                              "unquoted off, on, no, yes as one); quote it, e.g. 'off': 0")


def label_of(where: str, value) -> str:
    """A plain value's label: booleans as YAML writes them, numbers and strings as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ConfigError(f"{where}: value {value!r} has no label of its own; give the values as a "
                      "mapping, label: value")


def _check_not_set_by_grid(where: str, stage: str, field: str) -> None:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", str(field)):
        raise ConfigError(f"{where}: {field!r} is not a dotted field name (e.g. optim.lr)")
    for own, axis in GRID_FIELDS[stage].items():
        if field == own or own.startswith(field + ".") or field.startswith(own + "."):
            raise ConfigError(f"{where}: {field} is set by the grid in {stage} jobs ({axis}); "
                              "an axis varies the other fields")


def check_types(axes: Axes) -> None:
    """Each value against its stage's config types, before anything runs: a one-line error
    naming the axis, the value and the field."""
    from linvit.cli import stage_config
    from linvit.config import check_field

    for axis in axes:
        cls = stage_config(STAGES[axis.stage])
        for label, fields in zip(axis.labels, axis.settings):
            for field, value in fields:
                try:
                    check_field(cls, field, value)
                except ConfigError as e:
                    raise ConfigError(f"axes.{axis.name} (value {label}, {axis.stage} "
                                      f"stage): {e}") from None
