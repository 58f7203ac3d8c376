"""`plan(config)`: the grid expanded once into every job the workflow can run
(linvit.workflow.jobs), in the order teachers, distillations, cells, attention maps,
robustness, dense, bench. The Snakefile, the config check and the tests all read this one list."""
from __future__ import annotations

from dataclasses import dataclass, field

from linvit.workflow import dense_jobs as dj
from linvit.workflow import grid as g
from linvit.workflow.grid import Cell
from linvit.workflow.jobs import KINDS, Job

SOFTMAX = "softmax"


@dataclass
class Plan:
    results: str
    cells: list[Cell]                 # the grid's cells (the tables'), without dense-only ones
    jobs: list[Job]
    _index: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for job in self.jobs:
            self._index[self._key(job.kind.name, job.wildcards)] = job

    @staticmethod
    def _key(kind: str, wildcards) -> tuple:
        return (kind, *(str(wildcards[f]) for f in KINDS[kind].fields))

    def find(self, kind: str, wildcards) -> Job:
        """The job of `kind` with these wildcards (a Snakemake Wildcards object or a dict)."""
        from linvit.errors import ConfigError

        values = {f: getattr(wildcards, f, None) if not isinstance(wildcards, dict)
                  else wildcards.get(f) for f in KINDS[kind].fields}
        job = self._index.get(self._key(kind, values))
        if job is None:
            raise ConfigError(f"no {kind} job {values} in this grid: only the grid's own jobs "
                              "can be asked for")
        return job

    def of(self, *kinds: str) -> list[Job]:
        return [j for j in self.jobs if j.kind.name in kinds]

    def collected(self) -> list[Job]:
        """The jobs whose records the tables read: teachers, then the distillations and cells of
        the grid (not those made for the dense sub-grid alone)."""
        distilled = set(g.distillations(self.cells))
        cells = set(self.cells)
        return ([*self.of("teacher")]
                + [j for j in self.of("distill") if _distill_tuple(j) in distilled]
                + [j for j in self.of("cell") if Cell(**j.key) in cells])


def _distill_tuple(job: Job) -> tuple:
    k = job.key
    return (k["dataset"], k["teacher"], k["size"], k["operator"], k["loss"])


def plan(config: dict) -> Plan:
    results = config.get("results", "results")
    cells = g.expand_grid(config)
    jobs = Jobs(config, results)
    for d, t, s in g.imports(config, cells):
        jobs.add_import(d, t, s)
    for d, t, s in g.teachers(config, cells):
        jobs.add_teacher(d, t, s)
    trained = cells + dj.dense_cells(config, cells)
    for key in g.distillations(trained):
        jobs.add_distill(*key)
    for cell in trained:
        jobs.add_cell(cell)
    panel = g.attention_panel(config)
    for model in g.attention_models(config, cells):
        jobs.add_maps(*panel, model)
    if g.robustness_section(config):
        jobs.add_robustness(cells)
    if config.get("dense"):
        jobs.add_dense(dj.dense_runs(config, cells))
    if config.get("bench"):
        from linvit.workflow.deps import registry_names

        operators = config["bench"].get("operators") or registry_names("operator")
        jobs.add("bench", {}, "bench", {"stage": "bench"}, g.bench_overrides(config), "bench",
                 ("bench", operators))
    return Plan(results, cells, jobs.made)


class Jobs:
    """Makes the jobs of one config, each from the jobs it reads (made before it)."""

    def __init__(self, config: dict, results: str):
        self.config, self.results, self.made = config, results, []
        self._by = {}

    def add(self, kind, wildcards, stage, key, overrides, field_, code, inputs=(), reads=None):
        job = Job(KINDS[kind], {k: str(v) for k, v in wildcards.items()}, stage, key, overrides,
                  field_, code, list(inputs), reads or {}, self.results)
        self.made.append(job)
        self._by[(kind, *job.wildcards.values())] = job
        return job

    def get(self, kind: str, *values) -> Job:
        return self._by[(kind, *map(str, values))]

    def dataset(self, name: str) -> str:
        """The dataset registry entry a grid dataset (a key of config["datasets"]) reads."""
        return self.config["datasets"][name]["dataset"]

    def add_import(self, d, t, s):
        self.add("import", dict(dataset=d, teacher=t, size=s), "import-teacher",
                 dict(dataset=d, teacher=t, size=s), g.import_overrides(self.config, d, t),
                 f"teachers.{t}", ("import-teacher", [SOFTMAX], [], [self.dataset(d)]))

    def add_teacher(self, d, t, s):
        stage = g.teacher_stage(self.config, t, s)
        source = {"probe": lambda: self.get("import", d, t, s),
                  "select": lambda: self.get(
                      "teacher", d, t, g.made_size(g.teacher_specs(self.config)[t], s)),
                  }.get(stage, lambda: None)()
        field_ = (f"teachers.{t}" if stage != "pretrain" or self.config.get("teachers")
                  else "stages.teacher")
        self.add("teacher", dict(dataset=d, teacher=t, size=s), stage,
                 dict(dataset=d, teacher=t, size=s, stage=stage),
                 g.teacher_overrides(self.config, d, t, s, source.model if source else None),
                 field_, (stage, [SOFTMAX], [], [self.dataset(d)]),
                 [source.output] if source else [], {"teacher": source.model} if source else {})

    def add_distill(self, d, t, s, op, loss):
        teacher = self.get("teacher", d, t, s)
        key = dict(dataset=d, teacher=t, size=s, operator=op, loss=loss)
        self.add("distill", key, "distill", key,
                 g.distill_overrides(self.config, d, op, loss, teacher.model),
                 f"stages.distill / losses.{loss}",
                 ("distill", [SOFTMAX, op], list(self.config["losses"][loss]), [self.dataset(d)]),
                 [teacher.output], {"teacher": teacher.model})

    def add_cell(self, c: Cell):
        teacher = self.get("teacher", c.dataset, c.teacher, c.size)
        distilled = (self.get("distill", c.dataset, c.teacher, c.size, c.operator, c.loss)
                     if c.needs_distill else None)
        reads = {"teacher": teacher.model, **({"distilled": distilled.model} if distilled else {})}
        self.add("cell", c.as_dict(), "finetune", c.as_dict(),
                 g.finetune_overrides(self.config, c, teacher.model,
                                      distilled.model if distilled else None),
                 "stages.finetune", ("finetune", [SOFTMAX, c.operator], [],
                                     [self.dataset(c.dataset)]),
                 [teacher.output] + ([distilled.output] if distilled else []), reads)

    def add_maps(self, d, t, s, model):
        teacher = self.get("teacher", d, t, s)
        student = (None if model == g.MAPS_TEACHER
                   else self.get("distill", d, t, s, model, self.config["main_loss"]))
        operator = SOFTMAX if student is None else model
        reads = {"teacher": teacher.model, **({"model": student.model} if student else {})}
        self.add("maps", dict(dataset=d, teacher=t, size=s, model=model), "attention-maps",
                 dict(dataset=d, teacher=t, size=s, operator=operator,
                      model="teacher" if student is None else "distilled"),
                 g.maps_overrides(self.config, d, teacher.model,
                                  student.model if student else None),
                 "figures", ("attention-maps", [SOFTMAX] + ([model] if student else []), [],
                             [self.dataset(d)]),
                 [teacher.output] + ([student.output] if student else []), reads)

    def add_robustness(self, cells: list[Cell]):
        """The corrupted copies (once per dataset), then every teacher model and cell scored."""
        corrupt = {}
        for d in g.corrupt_datasets(self.config):
            corrupt[d] = self.add("corrupt", dict(dataset=d), "corrupt", dict(dataset=d),
                                  g.corrupt_overrides(self.config, d), "robustness.corruptions",
                                  ("corrupt", [], [], [self.dataset(d)]))
        for job in self.of_kind("teacher") + [self.get("cell", *c.as_dict().values())
                                             for c in cells]:
            self._add_scored(job, corrupt.get(job.wildcards["dataset"]))

    def _add_scored(self, model: Job, corrupt: Job | None):
        is_cell = model.kind.name == "cell"
        w = model.wildcards
        key = (model.key if is_cell else
               dict(dataset=w["dataset"], teacher=w["teacher"], size=w["size"],
                    operator=SOFTMAX, init="teacher", loss=g.NO_LOSS, seed=None))
        corrupted = f"{corrupt.run_dir}/corrupted.safetensors" if corrupt else None
        reads = {"checkpoint": model.model, **({"corrupted": corrupted} if corrupt else {})}
        self.add("robustness_cell" if is_cell else "robustness_teacher", w, "robustness", key,
                 g.robustness_overrides(self.config, w["dataset"], model.model, corrupted),
                 "robustness", ("robustness", [key["operator"]], [],
                                [self.dataset(w["dataset"])]),
                 [model.output] + ([corrupt.output] if corrupt else []), reads)

    def of_kind(self, kind: str) -> list[Job]:
        return [j for j in self.made if j.kind.name == kind]

    def add_dense(self, runs: list[dj.DenseRun]):
        scenes = self.add("scenes", {}, "make-scenes", {}, dj.scenes_overrides(self.config),
                          "dense.scenes", ("make-scenes", [], [], ["fashion_mnist"]))
        for r in runs:
            backbone = (self.get("teacher", r.dataset, r.teacher, r.size) if r.cell is None
                        else self.get("cell", *r.cell.as_dict().values()))
            uses_scenes = dj.dense_uses_scenes(self.config, r.task)
            reads = {"checkpoint": backbone.model,
                     **({"data.root": scenes.run_dir} if uses_scenes else {})}
            self.add("dense", dict(task=r.task, dataset=r.dataset, teacher=r.teacher,
                                   size=r.size, backbone=r.backbone), r.task, r.key(),
                     dj.dense_overrides(self.config, r, backbone.model, scenes.run_dir),
                     f"dense.stages.{r.task}",
                     (r.task, [SOFTMAX, r.key()["operator"]], [], [self.dataset(r.dataset)]),
                     [backbone.output] + ([scenes.output] if uses_scenes else []), reads)
