"""`plan(config)`: the grid expanded once into every job the workflow can run
(linvit.workflow.jobs), in the order teachers, distillations, cells, attention maps,
robustness, dense, bench. The Snakefile, the config check and the tests all read this one list."""
from __future__ import annotations

from dataclasses import dataclass, field

from linvit.errors import ConfigError
from linvit.workflow import dense_jobs as dj
from linvit.workflow import grid as g
from linvit.workflow import selection as sel
from linvit.workflow.axes import NONE, Axes
from linvit.workflow.grid import Cell, Distillation, Model
from linvit.workflow.jobs import KINDS, Job, JobKind

SOFTMAX = "softmax"


@dataclass
class Plan:
    results: str
    cells: list[Cell]                 # the grid's cells (the tables'), without dense-only ones
    jobs: list[Job]
    axes: Axes = Axes()
    kinds: dict[str, JobKind] = field(default_factory=dict)   # KINDS bound to the grid's axes
    distilled: list[Distillation] = field(default_factory=list)   # the grid's (the tables')
    jobs_folder: str = ""             # where the shared kinds' jobs are (default: results)
    _index: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for job in self.jobs:
            self._index[self._key(job.kind.name, job.wildcards)] = job

    def _key(self, kind: str, wildcards) -> tuple:
        return (kind, *(str(wildcards[f]) for f in self.kinds[kind].wildcards))

    def find(self, kind: str, wildcards) -> Job:
        """The job of `kind` with these wildcards (a Snakemake Wildcards object or a dict)."""
        values = {f: getattr(wildcards, f, None) if not isinstance(wildcards, dict)
                  else wildcards.get(f) for f in self.kinds[kind].wildcards}
        job = self._index.get(self._key(kind, values))
        if job is None:
            raise ConfigError(f"no {kind} job {values} in this grid: only the grid's own jobs "
                              "can be asked for")
        return job

    def of(self, *kinds: str) -> list[Job]:
        return [j for j in self.jobs if j.kind.name in kinds]

    def pattern(self, kind: str, part: str = "output") -> str:
        """A kind's output, log or benchmark pattern in this grid (its axes' levels in)."""
        bound = self.kinds[kind]
        return bound.pattern(bound.root(self.results, self.jobs_folder or self.results), part)

    def constraints(self) -> dict[str, str]:
        """Each config axis's wildcard: one folder level."""
        return {name: "[^/]+" for name in self.axes.names()}

    def collected(self) -> list[Job]:
        """The jobs whose records the tables read: teachers, then the distillations and cells of
        the grid (not those made for the dense sub-grid alone)."""
        distilled, cells = set(self.distilled), set(self.cells)
        return ([*self.of("teacher")]
                + [j for j in self.of("distill") if j.made in distilled]
                + [j for j in self.of("cell") if j.made in cells] + self.of("select_cell"))


def plan(config: dict) -> Plan:
    results = config.get("results", "results")
    folder = config.get("jobs_folder") or results
    cells = g.expand_grid(config)
    axes = g.grid_axes(config)
    jobs = Jobs(config, results, axes, folder)
    for d, t, s in g.imports(config, cells):
        jobs.add_import(d, t, s)
    for model in g.teachers(config, cells):
        jobs.add_teacher(model)
    trained = cells + dj.dense_cells(config, cells)
    for distillation in g.distillations(config, trained):
        jobs.add_distill(distillation)
    if sel.section(config):
        jobs.add_selection(cells)
    for cell in trained:
        jobs.add_cell(cell)
    panel = g.attention_panel(config)
    jobs.add_maps(panel, None)
    for student in g.attention_students(config, cells):
        jobs.add_maps(panel, student)
    if g.robustness_section(config):
        jobs.add_robustness(cells)
    if config.get("dense"):
        jobs.add_dense(dj.dense_runs(config, cells))
    if g.export_section(config):
        jobs.add_export(g.export_cells(config, cells))
    if config.get("bench"):
        from linvit.workflow.deps import registry_names

        operators = config["bench"].get("operators") or registry_names("operator")
        jobs.add("bench", {}, "bench", {"stage": "bench"}, g.bench_overrides(config), "bench",
                 ("bench", operators))
    return Plan(results, cells, jobs.made, axes, jobs.kinds, g.distillations(config, cells),
                folder)


class Jobs:
    """Makes the jobs of one config, each from the jobs it reads (made before it)."""

    def __init__(self, config: dict, results: str, axes: Axes, jobs_folder: str | None = None):
        self.config, self.results, self.axes, self.made = config, results, axes, []
        self.jobs_folder = jobs_folder or results
        self.kinds = {name: kind.bind(axes, g.replicated(config))
                      for name, kind in KINDS.items()}
        self._by: dict[tuple, Job] = {}

    def add(self, kind, wildcards, stage, key, overrides, field_, code, inputs=(), reads=None,
            made=None):
        """A job; `made`: what it makes in the grid's terms (its Cell, Model, Distillation)."""
        bound = self.kinds[kind]
        job = Job(bound, {k: str(wildcards[k]) for k in bound.wildcards}, stage, key, overrides,
                  field_, code, list(inputs), reads or {},
                  bound.root(self.results, self.jobs_folder), made)
        index = (kind, *job.wildcards.values())
        if index in self._by:
            raise ConfigError(f"two {kind} jobs with one key, {key}: {self._by[index].field} "
                              f"and {field_} both make {job.folder} (a grid makes each job once)")
        self.made.append(job)
        self._by[index] = job
        return job

    def get(self, kind: str, wildcards: dict) -> Job:
        return self._by[self._index_of(kind, wildcards)]

    def _index_of(self, kind: str, wildcards: dict) -> tuple:
        return (kind, *(str(wildcards[f]) for f in self.kinds[kind].wildcards))

    def dataset(self, name: str) -> str:
        """The dataset registry entry a grid dataset (a key of config["datasets"]) reads."""
        return self.config["datasets"][name]["dataset"]

    def _with_axes(self, key: dict, combo, kind: str) -> dict:
        """A key with the config axes of `kind` (from `combo`, `none` where it has none), the
        seed kept last."""
        values = dict(combo)
        axes = {name: values.get(name, NONE) for name in self.kinds[kind].axes}
        seed = {"seed": key["seed"]} if "seed" in key else {}
        return {**{k: v for k, v in key.items() if k != "seed"}, **axes, **seed}

    def add_import(self, d, t, s):
        key = dict(dataset=d, teacher=t, size=s)
        self.add("import", key, "import-teacher", key, g.import_overrides(self.config, d, t),
                 f"teachers.{t}", ("import-teacher", [SOFTMAX], [], [self.dataset(d)]))

    def teacher_of(self, model: Model) -> Job:
        return self.get("teacher", self._with_axes(dict(zip(("dataset", "teacher", "size"),
                                                            model)), model.axes, "teacher"))

    def add_teacher(self, model: Model):
        d, t, s = model[:3]
        stage = g.teacher_stage(self.config, t, s)
        made_at = model._replace(size=g.made_size(g.teacher_specs(self.config)[t], s))
        source = {"probe": lambda: self.get("import", dict(dataset=d, teacher=t, size=s)),
                  "select": lambda: self.teacher_of(made_at)}.get(stage, lambda: None)()
        field_ = (f"teachers.{t}" if stage != "pretrain" or self.config.get("teachers")
                  else "stages.teacher") + self.axes.describe(model.axes, "teacher")
        wildcards = self._with_axes(dict(dataset=d, teacher=t, size=s), model.axes, "teacher")
        key = self._with_axes(dict(dataset=d, teacher=t, size=s, stage=stage), model.axes,
                              "teacher")
        self.add("teacher", wildcards, stage, key,
                 g.teacher_overrides(self.config, model, source.model if source else None),
                 field_, (stage, [SOFTMAX], [], [self.dataset(d)]),
                 [source.output] if source else [], {"teacher": source.model} if source else {},
                 made=model)

    def _distill_key(self, dist: Distillation) -> dict:
        seed = {} if dist.seed is None else {"seed": dist.seed}
        return self._with_axes(dict(dataset=dist.dataset, teacher=dist.teacher, size=dist.size,
                                    operator=dist.operator, loss=dist.loss, **seed), dist.axes,
                               "distill")

    def distill_of(self, dist: Distillation) -> Job:
        return self.get("distill", self._distill_key(dist))

    def add_distill(self, dist: Distillation):
        teacher = self.teacher_of(dist.model._replace(
            axes=self.axes.project(dist.axes, ["teacher"])))
        key = self._distill_key(dist)
        self.add("distill", key, "distill", key,
                 g.distill_overrides(self.config, dist, teacher.model),
                 f"stages.distill / losses.{dist.loss}" + self.axes.describe(dist.axes,
                                                                             "distill"),
                 ("distill", [SOFTMAX, dist.operator], list(self.config["losses"][dist.loss]),
                  [self.dataset(dist.dataset)]),
                 [teacher.output], {"teacher": teacher.model}, made=dist)

    def _sources(self, c: Cell) -> tuple[Job, Job | None]:
        """The teacher and (for a strategy that takes one) distillation jobs of a cell."""
        teacher = self.teacher_of(g.model_of(self.config, c))
        distilled = (self.distill_of(g.distillation_of(self.config, c)) if c.needs_distill
                     else None)
        return teacher, distilled

    def add_cell(self, c: Cell, kind: str = "cell", candidate: tuple[str, dict] | None = None):
        """A fine-tuned cell; with `candidate` (label, settings), a selection job instead: the
        cell at that candidate, scored on the validation split."""
        teacher, distilled = self._sources(c)
        reads = {"teacher": teacher.model, **({"distilled": distilled.model} if distilled else {})}
        key = c.as_dict() if candidate is None else {**c.as_dict(), "candidate": candidate[0]}
        # a dense sub-grid's cell of a strategy the grid does not choose for keeps the stage's
        # own settings (no choice job exists for it)
        chosen = (self._by.get(self._index_of("choose", self._choice_key(sel.choice_of(c))))
                  if candidate is None and sel.section(self.config) else None)
        job = self.add(kind, key, "finetune", key,
                       g.finetune_overrides(self.config, c, teacher.model,
                                            distilled.model if distilled else None,
                                            candidate[1] if candidate else None),
                       ("selection.candidates" if candidate else "stages.finetune")
                       + self.axes.describe(c.axes, "finetune"),
                       ("finetune", [SOFTMAX, c.operator], [], [self.dataset(c.dataset)]),
                       [teacher.output] + ([distilled.output] if distilled else [])
                       + ([chosen.output] if chosen else []), reads, made=c)
        job.config_file = chosen.output if chosen else None
        return job

    def _choice_key(self, choice: sel.Choice) -> dict:
        return self._with_axes(dict(dataset=choice.dataset, teacher=choice.teacher,
                                    size=choice.size, init=choice.init, family=choice.family),
                               choice.axes, "choose")

    def add_selection(self, cells: list[Cell]):
        """Every candidate on each choice's cells of the selection seed, then the choice."""
        seed, options = sel.selection_seed(self.config), sel.candidates(self.config)
        picked: dict[sel.Choice, list[Job]] = {}
        for c in cells:
            if (c.seed == seed and c.loss in (self.config["main_loss"], g.NO_LOSS)
                    and sel.runs_on(self.config, c.operator)):
                picked.setdefault(sel.choice_of(c), []).extend(
                    self.add_cell(c, "select_cell", option) for option in options)
        for choice, runs in picked.items():
            key = self._choice_key(choice)
            self.add("choose", key, "choose", key, {}, "selection",
                     ("choose",), [r.output for r in runs], made=choice)

    def add_maps(self, panel: Model, student: Distillation | None):
        """The teacher's maps (student None) or a distilled student's, for the one figure."""
        teacher = self.teacher_of(panel)
        distilled = self.distill_of(student) if student else None
        operator = student.operator if student else SOFTMAX
        name = student.operator if student else g.MAPS_TEACHER
        combo = student.axes if student else panel.axes
        wildcards = self._with_axes(dict(zip(("dataset", "teacher", "size"), panel[:3]),
                                         model=name), combo, "maps")
        key = self._with_axes(dict(zip(("dataset", "teacher", "size"), panel[:3]),
                                   operator=operator,
                                   model="distilled" if student else "teacher"), combo, "maps")
        reads = {"teacher": teacher.model, **({"model": distilled.model} if distilled else {})}
        self.add("maps", wildcards, "attention-maps", key,
                 g.maps_overrides(self.config, panel.dataset, teacher.model,
                                  distilled.model if distilled else None),
                 "figures", ("attention-maps", [SOFTMAX] + ([operator] if student else []), [],
                             [self.dataset(panel.dataset)]),
                 [teacher.output] + ([distilled.output] if distilled else []), reads,
                 made=student or panel)

    def add_robustness(self, cells: list[Cell]):
        """The corrupted copies (once per dataset), then every teacher model and cell scored."""
        corrupt = {}
        for d in g.corrupt_datasets(self.config):
            corrupt[d] = self.add("corrupt", dict(dataset=d), "corrupt", dict(dataset=d),
                                  g.corrupt_overrides(self.config, d), "robustness.corruptions",
                                  ("corrupt", [], [], [self.dataset(d)]))
        for job in self.of_kind("teacher") + [self.get("cell", c.as_dict()) for c in cells]:
            self._add_scored(job, corrupt.get(job.wildcards["dataset"]))

    def _add_scored(self, model: Job, corrupt: Job | None):
        is_cell = model.kind.name == "cell"
        w = model.wildcards
        key = (model.key if is_cell else self._with_axes(
            dict(dataset=w["dataset"], teacher=w["teacher"], size=w["size"], operator=SOFTMAX,
                 init="teacher", loss=g.NO_LOSS, seed=None), model.made.axes, "teacher"))
        corrupted = f"{corrupt.run_dir}/corrupted.safetensors" if corrupt else None
        reads = {"checkpoint": model.model, **({"corrupted": corrupted} if corrupt else {})}
        self.add("robustness_cell" if is_cell else "robustness_teacher", w, "robustness", key,
                 g.robustness_overrides(self.config, w["dataset"], model.model, corrupted),
                 "robustness", ("robustness", [key["operator"]], [],
                                [self.dataset(w["dataset"])]),
                 [model.output] + ([corrupt.output] if corrupt else []), reads, made=model.made)

    def of_kind(self, kind: str) -> list[Job]:
        return [j for j in self.made if j.kind.name == kind]

    def add_export(self, cells: list[Cell]):
        """Each chosen cell's run folder as a Hub-style folder (`linvit export`)."""
        for c in cells:
            cell = self.get("cell", c.as_dict())
            self.add("export", c.as_dict(), "export", c.as_dict(),
                     g.export_overrides(self.config, cell.run_dir), "export",
                     ("export", [SOFTMAX, c.operator], [], [self.dataset(c.dataset)]),
                     [cell.output], {"source": cell.run_dir}, made=c)

    def add_dense(self, runs: list[dj.DenseRun]):
        scenes = self.add("scenes", {}, "make-scenes", {}, dj.scenes_overrides(self.config),
                          "dense.scenes", ("make-scenes", [], [], ["fashion_mnist"]))
        for r in runs:
            backbone = (self.teacher_of(r.model) if r.cell is None
                        else self.get("cell", r.cell.as_dict()))
            uses_scenes = dj.dense_uses_scenes(self.config, r.task)
            reads = {"checkpoint": backbone.model,
                     **({"data.root": scenes.run_dir} if uses_scenes else {})}
            combo = r.cell.axes if r.cell else r.model.axes
            key = self._with_axes(r.key(), combo, "dense")
            wildcards = self._with_axes(dict(task=r.task, dataset=r.model.dataset,
                                             teacher=r.model.teacher, size=r.model.size,
                                             backbone=r.backbone), combo, "dense")
            self.add("dense", wildcards, r.task, key,
                     dj.dense_overrides(self.config, r, backbone.model, scenes.run_dir),
                     f"dense.stages.{r.task}",
                     (r.task, [SOFTMAX, key["operator"]], [], [self.dataset(r.model.dataset)]),
                     [backbone.output] + ([scenes.output] if uses_scenes else []), reads,
                     made=r)
