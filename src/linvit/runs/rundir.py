"""A run's output folder: linvit's own, locked while a run writes it, complete only when verified.

    .linvit-run             the marker: this folder is linvit's, and which files linvit writes here
    .linvit-lock            locked (flock) by the process writing the folder
    config.yaml             the resolved config (a rerun must match it)
    run.log                 the log of every attempt
    <the stage's files>     linvit.stages: train.jsonl, checkpoint.safetensors, model.safetensors
    metrics.json            written last, with a SHA-256 of every output file

A folder without the marker is never written into unless it is empty, and `--rerun` (replace)
removes only the files the marker names, never anything else in the folder. A run counts as
complete only when metrics.json is valid JSON and every output it lists is present and unchanged.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import yaml

from linvit.errors import CheckpointError, RunDirError, RunFailed
from linvit.io import (
    dumps,
    load_yaml,
    read_json,
    remove_temporaries,
    sha256_file,
    write_json,
    write_text,
    write_yaml,
)
from linvit.runs.environment import environment, log_to
from linvit.runs.lock import LOCK, release_lock, take_lock
from linvit.runs.verify import check_run, input_digests, verified_metrics
from linvit.stages import STAGES
from linvit.trees import non_finite

MARKER = ".linvit-run"
# Every run folder's own files; each stage's outputs (checksummed in metrics.json) and scratch
# files are in its entry of linvit.stages.STAGES.
COMMON = ("config.yaml", "run.log", "metrics.json")
# Fields that do not change results, so a rerun may differ in them.
VOLATILE = {("run", "progress"), ("run", "threads"), ("data", "workers"), ("run", "loggers")}

log = logging.getLogger("linvit")


def config_identity(config: dict, ignore: frozenset = frozenset()) -> dict:
    """The config without the fields that do not change results (VOLATILE) and `ignore`'s
    (section, field) pairs."""
    skip = VOLATILE | ignore
    return {k: ({kk: vv for kk, vv in v.items() if (k, kk) not in skip}
                if isinstance(v, dict) else v) for k, v in config.items()}


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _diff(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r} -> {vb!r}")
    return out


def check_output_path(out) -> Path:
    """The output folder, or RunDirError when it can never be one (writes nothing)."""
    if out is None or str(out).strip() == "":
        raise RunDirError("output folder: empty path; name a folder for this run")
    path = Path(out).expanduser()
    resolved = path.resolve()
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents:
        raise RunDirError(f"output folder {out!r} is the current directory or holds it; name a "
                          "folder of its own for this run")
    if resolved == Path.home().resolve() or resolved == Path(resolved.anchor):
        raise RunDirError(f"output folder {out!r} is a home or root folder; name a folder of its "
                          "own for this run")
    if path.exists() and not path.is_dir():
        raise RunDirError(f"output folder {out}: exists and is not a folder")
    parent = next(p for p in [path, *path.parents] if p.exists() or p == Path(p.anchor))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"output folder {out}: cannot be created in {parent} (not a writable "
                          "folder)")
    return path


def _path_leaves(tree, prefix: str = ""):
    """(dotted field, value) of every non-empty string in a config tree: the paths among them."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _path_leaves(v, f"{prefix}{k}.")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _path_leaves(v, f"{prefix}{i}.")
    elif isinstance(tree, str) and tree.strip():
        yield prefix.rstrip("."), tree


def owned_names(stage: str) -> list[str]:
    outputs, others = STAGES[stage].outputs, STAGES[stage].scratch
    return [*COMMON, *outputs, *STAGES[stage].optional, *others]


ALL_OWNED = {name for stage in STAGES for name in owned_names(stage)}


class Problem(NamedTuple):
    """Why a folder's previous run is neither resumed nor reused as it is."""
    reason: str
    replaceable: bool = True      # False: not linvit's to clear, even with --rerun


class RunDir:
    """Check (read-only) decides what to do; open() takes the lock and writes; finish() seals."""

    def __init__(self, out, stage: str, config: dict, replace: bool = False,
                 is_main: bool = True, barrier=lambda: None):
        if stage not in STAGES:
            raise ValueError(f"no declared files for stage {stage!r}")
        self.path = Path(out)
        self.stage, self.config, self.replace, self.is_main = stage, config, replace, is_main
        self.barrier = barrier                   # other processes wait while the main one writes
        self.precision = lambda: None            # the runtime's, once a stage has one (start_run)
        self.checkpoint = self.path / "checkpoint.safetensors"
        self.model = self.path / "model.safetensors"
        self.metrics = self.path / "metrics.json"
        self.train_log = self.path / "train.jsonl"
        self.config_file = self.path / "config.yaml"
        self.finished = False            # complete, verified, and not to be replaced
        self._discard = False            # open() removes the previous run's files
        self._previous_files: list[str] = []
        self._complete = False                   # set by _previous_run_problem
        self._verified: tuple | None = None      # (mtime, size) of the checkpoint last verified

    @property
    def identity(self) -> dict:
        """The config without the fields a resume may change (threads, progress, workers):
        what a training checkpoint must match to be continued."""
        return config_identity(self.config)

    def complete(self) -> bool:
        return verified_metrics(self.path) is not None

    def check(self) -> None:
        """Decide, without writing, whether this run starts, resumes, replaces the previous
        one (`replace`, for workflows) or is finished already; RunDirError when it may not."""
        check_output_path(self.path)
        self.finished = self._discard = False
        if not self.path.is_dir() or not [p for p in self.path.iterdir() if p.name != LOCK]:
            return
        problem = self._previous_run_problem()
        if problem is None:
            complete = self._complete
            self.finished, self._discard = complete and not self.replace, complete and self.replace
        elif self.replace and problem.replaceable:
            self._discard = True
        else:
            raise RunDirError(problem.reason)
        if not self.finished:
            self._refuse_inputs_at_risk()

    def _refuse_inputs_at_risk(self) -> None:
        """An input of this run (any path in its config) that lies among the files it would
        remove (the previous run's, when replacing) or write is refused, naming the field:
        following --rerun must never delete what the run reads."""
        removed = set(self._previous_files) | {MARKER} if self._discard else set()
        at_risk = {(self.path / n).resolve(): n for n in {*owned_names(self.stage), *removed}}
        for field, value in _path_leaves(self.config):
            target = Path(value).expanduser().resolve()
            hit = next((n for p, n in at_risk.items() if target == p or p in target.parents),
                       None)
            if hit is not None:
                verb = "replaces" if hit in removed else "writes"
                raise RunDirError(f"{field}: {value} lies in the output folder {self.path} among "
                                  f"the files this run {verb} ({hit}); move it out of the folder "
                                  "or choose another output folder")

    def _previous_run_problem(self) -> Problem | None:
        """Why the folder's previous run cannot simply be resumed or reused, or None."""
        marker = self.path / MARKER
        if not marker.is_file():
            return Problem(f"{self.path} is not empty and was not made by linvit (no {MARKER}); "
                           "linvit does not write into it: choose another output folder", False)
        try:
            owner = read_json(marker)
            old = load_yaml(self.config_file.read_text()) if self.config_file.is_file() else {}
            names, old_stage = list(owner["files"]), owner["stage"]
            if not (isinstance(old, dict) and isinstance(old.get("config", {}), dict)
                    and all(isinstance(n, str) for n in names)):
                raise ValueError("unexpected structure")
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
            return Problem(f"{self.path}: its {MARKER} or config.yaml is unreadable "
                           f"({' '.join(str(e).split())}); move the folder away", False)
        # only names linvit itself writes: a marker edited to name '..' removes nothing else
        self._previous_files = [n for n in names if n in ALL_OWNED]
        if old_stage != self.stage:
            return Problem(f"{self.path} holds a {old_stage} run, not a {self.stage} run; use "
                           "another output folder, or --rerun to replace it")
        # no config.yaml: the previous attempt stopped before writing one, so nothing ran
        changes = (_diff(config_identity(old.get("config", {})), config_identity(self.config))
                   if old else [])
        if changes:
            return Problem(f"{self.path} holds a {old_stage} run with another config "
                           f"({'; '.join(changes[:5])}); use another output folder, or --rerun "
                           "to replace it")
        self._complete = False
        if self.metrics.is_file():                                     # hashes the outputs once
            metrics, why = check_run(self.path)
            self._complete = metrics is not None
            if not self._complete:
                return Problem(f"{self.path}: its finished run fails verification ({why}); "
                               "--rerun redoes it")
        return self._checkpoint_problem()

    def _checkpoint_problem(self) -> Problem | None:
        if not self.checkpoint.is_file():
            return None
        from linvit.runs.state import check_identity, read_state

        stat = self.checkpoint.stat()
        if self._verified == (stat.st_mtime_ns, stat.st_size):   # checked before the lock
            return None
        try:
            _, meta = read_state(self.checkpoint)
            check_identity(self.checkpoint, meta, self.identity)
        except (CheckpointError, KeyError, ValueError) as e:
            return Problem(f"cannot resume: {e}. --rerun discards the checkpoint and starts "
                           "over, or delete the folder")
        self._verified = (stat.st_mtime_ns, stat.st_size)
        return None

    def open(self, *notes: str) -> None:
        """Take the folder's lock, clear what `check` decided to replace, write the marker and
        the resolved config, and log to run.log. Only the main process writes."""
        if self.is_main:
            self._open_main(notes)
        self.barrier()

    def _open_main(self, notes) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        take_lock(self.path)
        self.check()                              # the folder may have changed before the lock
        if self.finished:
            raise RunDirError(f"{self.path}: another linvit process finished this run meanwhile")
        if self._discard:
            self._remove_previous()
        for tmp in remove_temporaries(self.path):
            log.info("removed %s, left by an interrupted write", tmp)
        write_json(self.path / MARKER, {"linvit": "run folder", "stage": self.stage,
                                        "files": owned_names(self.stage)})
        write_yaml(self.config_file, {"stage": self.stage, "config": self.config})
        log_to(self.path / "run.log")
        log.info("%s run in %s", self.stage, self.path)
        for note in notes:
            log.info("%s", note)

    def release(self) -> None:
        release_lock(self.path)

    def _remove_previous(self) -> None:
        log.info("replacing the previous run in %s", self.path)
        for name in [*self._previous_files, MARKER]:
            target = self.path / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()

    def write_history(self, history: list[dict]) -> None:
        write_text(self.train_log, "".join(dumps(r) + "\n" for r in history))

    def finish(self, metrics: dict) -> dict:
        """Write metrics.json with the outputs' checksums; RunFailed (and no metrics.json) when a
        metric is not finite or a declared output is missing. Only the main process writes."""
        if not self.is_main:
            return metrics
        try:
            dumps(metrics)
        except ValueError:
            raise RunFailed(f"non-finite metrics, not recorded as a result: "
                            f"{non_finite(metrics)}") from None
        outputs = {}
        for name in STAGES[self.stage].outputs:
            target = self.path / name
            if not target.exists():
                raise RunFailed(f"{target}: a declared output is missing")
            outputs[name] = sha256_file(target) if target.is_file() else None
        for name in STAGES[self.stage].optional:          # asked for by this run's config
            if (self.path / name).is_file():
                outputs[name] = sha256_file(self.path / name)
        inputs = input_digests(value for _, value in _path_leaves(self.config))
        metrics = {**metrics, "stage": self.stage, "precision": self.precision(),
                   "env": environment(), "outputs": outputs, "inputs": inputs}
        write_json(self.metrics, metrics)
        self.checkpoint.unlink(missing_ok=True)
        log.info("finished: %s", self.metrics)
        self.release()
        return metrics


