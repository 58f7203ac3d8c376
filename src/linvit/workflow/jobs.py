"""One `Job` per workflow job: `plan(config)` expands the grid once and returns every job with its
kind, stage, key, folders, overrides and inputs.

KINDS is the one table of job kinds: what each writes where, the grid's axes in its key (its
built-in ones, and the stages whose config axes join it) and so its wildcards. A kind's templates
(relative to the results folder, with `{wildcard}` fields) are derived from that key and are the
one place a job's files are named: Python formats them with the job's wildcards, and the rules
use them as their output, log and benchmark patterns (a config axis is a folder level
`<axis>=<value>`, before the seed). A rule looks its job up by its wildcards (`Plan.find`) and
runs `Job.command`; the config check builds each job's `overrides` into its stage's config; the
record key is `Job.key`, everywhere.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
from dataclasses import dataclass, field

from linvit.trees import flatten

RECORD = "record.json"
MODEL = "model.safetensors"
MODELS = ("dataset", "teacher", "size")               # one teacher model
CELL = (*MODELS, "operator", "init", "loss", "seed")   # one fine-tuned student
ALL_STAGES = ("teacher", "distill", "finetune")


@dataclass(frozen=True)
class JobKind:
    """What a kind of job writes where. Its folder is `prefix` and then a level per wildcard:
    its built-in `fields` in order ("seed" as seed<N>), with the config axes of `stages` before
    the seed (`axes`, the names a grid's plan binds: `bind`). `run` is the run folder inside it
    when the record sits beside the run."""
    name: str
    record_kind: str | None        # `record --kind` (linvit.report.kinds); None: no record
    prefix: str
    fields: tuple[str, ...] = ()
    stages: tuple[str, ...] = ()   # whose config axes join the key (linvit.workflow.axes)
    log_prefix: str | None = None  # the log's folder under logs/ (default: prefix)
    benchmark_file: bool = True
    run: str = ""
    threads: int = 1
    output: str = RECORD
    axes: tuple[str, ...] = ()
    seeded: bool = False           # takes the cells' seed where a grid replicates it per seed
    shared: bool = False           # kept in the jobs folder (config `jobs_folder`), not results

    def bind(self, axes, replicated: bool = False) -> JobKind:
        """This kind in a grid with config axes `axes` (linvit.workflow.axes.Axes), its jobs
        made per seed where the grid replicates them (`seeded` kinds: distillations)."""
        fields = (*self.fields, "seed") if self.seeded and replicated else self.fields
        return dataclasses.replace(self, axes=axes.names(self.stages), fields=fields)

    @functools.cached_property
    def wildcards(self) -> tuple[str, ...]:
        builtin = [f for f in self.fields if f != "seed"]
        return (*builtin, *self.axes, *(["seed"] if "seed" in self.fields else []))

    def _levels(self) -> str:
        levels = [f"{name}={{{name}}}" if name in self.axes else
                  "seed{seed}" if name == "seed" else f"{{{name}}}" for name in self.wildcards]
        return "".join(f"/{level}" for level in levels)

    @functools.cached_property
    def folder(self) -> str:
        return self.prefix + self._levels()

    @functools.cached_property
    def log(self) -> str:
        return f"logs/{self.log_prefix or self.prefix}{self._levels()}.log"

    @functools.cached_property
    def benchmark(self) -> str | None:
        if not self.benchmark_file:
            return None
        return f"benchmarks/{self.log_prefix or self.prefix}{self._levels()}.tsv"

    def root(self, results: str, jobs_folder: str) -> str:
        """The folder its jobs are kept under in a grid: the jobs folder for a shared kind."""
        return jobs_folder if self.shared else results

    def pattern(self, results: str, part: str = "output") -> str:
        """The rule's pattern of `part` (output, log, benchmark), `{wildcard}`s left in."""
        template = {"output": f"{self.folder}/{self.output}", "log": self.log,
                    "benchmark": self.benchmark}[part]
        return f"{results}/{template}"


KINDS = {k.name: k for k in (
    # the training jobs, which grids naming one jobs folder share (linvit.workflow.shared)
    JobKind("teacher", "teacher", "teachers", MODELS, ("teacher",), threads=2, shared=True),
    JobKind("import", "import", "imports", MODELS, benchmark_file=False, shared=True),
    JobKind("distill", "distill", "distill", (*MODELS, "operator", "loss"),
            ("teacher", "distill"), seeded=True, shared=True),
    JobKind("cell", "cell", "cells", CELL, ALL_STAGES, shared=True),
    # fine-tuning settings chosen on a validation split (linvit.workflow.selection)
    JobKind("select_cell", "selection", "selection/cells", (*CELL[:-1], "candidate", "seed"),
            ALL_STAGES, shared=True),
    # the choice stays with its grid: it reads the grid's own grid.json, and its file carries no
    # record to tell which grid made it (a cell reading it is then the grid's own too)
    JobKind("choose", None, "selection/chosen", (*MODELS, "init", "family"), ALL_STAGES,
            benchmark_file=False, output="chosen.yaml"),
    JobKind("maps", "maps", "maps", (*MODELS, "model"), ("teacher", "distill")),
    JobKind("corrupt", "corrupt", "robustness/corrupted", ("dataset",),
            log_prefix="robustness/corrupt", benchmark_file=False, run="run"),
    JobKind("robustness_teacher", "robustness", "robustness/teachers", MODELS, ("teacher",),
            benchmark_file=False, run="run"),
    JobKind("robustness_cell", "robustness", "robustness/cells", CELL, ALL_STAGES,
            benchmark_file=False, run="run"),
    JobKind("scenes", None, "scenes", benchmark_file=False, output="MANIFEST.json"),
    JobKind("dense", "dense", "dense", ("task", *MODELS, "backbone"), ALL_STAGES),
    # chosen cells as Hub-style folders (`linvit export`; target `export`): the folder is the run
    JobKind("export", None, "export", CELL, ALL_STAGES, benchmark_file=False,
            output="metrics.json"),
    # every core of the machine it runs on, counted there (a cluster job reads this file again)
    JobKind("bench", "bench", "bench", benchmark_file=False, run="run",
            threads=os.cpu_count() or 1),
)}


@dataclass
class Job:
    """One workflow job. `reads`: the overrides (dotted keys) that name a file or folder another
    job makes (the config check stands an existing one in for them)."""
    kind: JobKind
    wildcards: dict
    stage: str
    key: dict
    overrides: dict
    field: str                        # the config field the overrides come from (for errors)
    code: tuple                       # (stage, operators, losses, datasets): deps.code_stamp
    inputs: list = field(default_factory=list)
    reads: dict = field(default_factory=dict)
    results: str = "results"
    made: object = None               # what it makes in the grid's terms (grid.Cell, ...)
    config_file: str | None = None    # a YAML the stage reads first (`-c`: a chosen setting)

    def _path(self, template: str) -> str:
        return f"{self.results}/{template.format(**self.wildcards)}"

    @property
    def folder(self) -> str:
        return self._path(self.kind.folder)

    @property
    def run_dir(self) -> str:
        return f"{self.folder}/{self.kind.run}" if self.kind.run else self.folder

    @property
    def output(self) -> str:
        return f"{self.folder}/{self.kind.output}"

    @property
    def log(self) -> str:
        return self._path(self.kind.log)

    @property
    def benchmark(self) -> str | None:
        return self._path(self.kind.benchmark) if self.kind.benchmark else None

    @property
    def model(self) -> str:
        return f"{self.run_dir}/{MODEL}"

    def words(self, stand_in: str | None = None) -> list[str]:
        """The overrides as `key=value` words, values as JSON (the CLI reads them as YAML; whole
        mappings such as loss weights stay one word). With `stand_in`, an existing file (and
        its folder) replaces each file (folder) the job reads."""
        flat = flatten(self.overrides)
        if stand_in is not None:
            folder = os.path.dirname(stand_in) or "."
            flat.update({k: stand_in if v.endswith(".safetensors") else folder
                         for k, v in self.reads.items()})
        return [f"{key}={json.dumps(value)}" for key, value in flat.items()]

    def command(self) -> str:
        """`<stage> [-c <config file>] -o <run folder> --rerun k=v ...`, one shell-safe string:
        --rerun because the workflow, not the folder, decides whether a job must run (an
        unfinished run of the same config still resumes)."""
        first = ["-c", self.config_file] if self.config_file else []
        return shlex.join([self.stage, *first, "-o", self.run_dir, "--rerun", *self.words()])

    def key_json(self) -> str:
        return json.dumps(self.key)
