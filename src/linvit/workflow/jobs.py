"""One `Job` per workflow job: `plan(config)` expands the grid once and returns every job with its
kind, stage, key, folders, overrides and inputs.

A job kind's templates (relative to the results folder, with `{wildcard}` fields) are the one
place a job's files are named: Python formats them with the job's wildcards, and the rules use
them as their output, log and benchmark patterns. A rule looks its job up by its wildcards
(`Plan.find`) and runs `Job.command`; the config check builds each job's `overrides` into its
stage's config; the record key is `Job.key`, everywhere.
"""
from __future__ import annotations

import json
import os
import shlex
import string
from dataclasses import dataclass, field

from linvit.trees import flatten

RECORD = "record.json"
MODEL = "model.safetensors"
CELL = "cells/{dataset}/{teacher}/{size}/{operator}/{init}/{loss}/seed{seed}"
MODELS = "{dataset}/{teacher}/{size}"
DENSE = "dense/{task}/" + MODELS + "/{backbone}"


@dataclass(frozen=True)
class JobKind:
    """What a kind of job writes where. `folder` holds the job's output (its record, or a scenes
    manifest); `run` is the run folder inside it when the record sits beside the run."""
    name: str
    record_kind: str | None        # `record --kind` (linvit.report.kinds); None: no record
    folder: str
    log: str
    benchmark: str | None = None
    run: str = ""
    threads: int = 1
    output: str = RECORD

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f for _, f, _, _ in string.Formatter().parse(self.folder) if f)

    def pattern(self, results: str, part: str = "output") -> str:
        """The rule's pattern of `part` (output, log, benchmark), `{wildcard}`s left in."""
        template = {"output": f"{self.folder}/{self.output}", "log": self.log,
                    "benchmark": self.benchmark}[part]
        return f"{results}/{template}"


def _kind(name, folder, log_name, benchmark=True, **kw) -> JobKind:
    """A kind whose log and benchmark mirror its folder under logs/ and benchmarks/."""
    return JobKind(name, kw.pop("record_kind", name), folder, f"logs/{log_name}.log",
                   f"benchmarks/{log_name}.tsv" if benchmark else None, **kw)


KINDS = {k.name: k for k in (
    _kind("teacher", f"teachers/{MODELS}", f"teachers/{MODELS}", threads=2),
    _kind("import", f"imports/{MODELS}", f"imports/{MODELS}", benchmark=False),
    _kind("distill", f"distill/{MODELS}/{{operator}}/{{loss}}",
          f"distill/{MODELS}/{{operator}}/{{loss}}"),
    _kind("cell", CELL, CELL),
    _kind("maps", f"maps/{MODELS}/{{model}}", f"maps/{MODELS}/{{model}}"),
    _kind("corrupt", "robustness/corrupted/{dataset}", "robustness/corrupt/{dataset}",
          benchmark=False, run="run"),
    _kind("robustness_teacher", f"robustness/teachers/{MODELS}", f"robustness/teachers/{MODELS}",
          benchmark=False, run="run", record_kind="robustness"),
    _kind("robustness_cell", f"robustness/{CELL}", f"robustness/{CELL}", benchmark=False,
          run="run", record_kind="robustness"),
    _kind("scenes", "scenes", "scenes", benchmark=False, record_kind=None,
          output="MANIFEST.json"),
    _kind("dense", DENSE, DENSE),
    # every core of the machine it runs on, counted there (a cluster job reads this file again)
    _kind("bench", "bench", "bench", benchmark=False, run="run", threads=os.cpu_count() or 1),
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
        """`<stage> -o <run folder> --rerun k=v ...`, one shell-safe string: --rerun because the
        workflow, not the folder, decides whether a job must run (an unfinished run of the same
        config still resumes)."""
        return shlex.join([self.stage, "-o", self.run_dir, "--rerun", *self.words()])

    def key_json(self) -> str:
        return json.dumps(self.key)
