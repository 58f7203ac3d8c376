"""Which source files a workflow job runs: the code-dependency map behind code-change invalidation.

A stage's files are the static import closure of its entry modules (every `import linvit...`
anywhere in a file counts, lazy imports included). Registries import all their members, so
members are filtered: a job keeps only the operator, loss and dataset files it selects. Editing
`attention/focused.py` therefore touches only the jobs that run the focused operator, while
editing a shared module (`attention/base.py`, `train/loop.py`) touches every job that imports it.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import os
from functools import cache
from pathlib import Path

from linvit import code_digests
from linvit.io import write_text
from linvit.workflow import memo

PACKAGE_ROOT = code_digests.PACKAGE_ROOT                         # src/linvit
SRC_ROOT = PACKAGE_ROOT.parent                           # src

@cache
def stage_entries() -> dict[str, list[str]]:
    """Entry modules of every job kind: each stage of linvit.stages (the CLI, the stage's module
    and its config's module) and each reporting step (report.cli.COMMANDS). cli.py dispatches
    by string, so its stages are read from the table rather than from its imports."""
    from linvit.report import cli as report_cli
    from linvit.stages import STAGES

    entries = {name: ["linvit.cli", stage.entry.split(":")[0], stage.config.split(":")[0]]
               for name, stage in STAGES.items()}
    clash = set(entries) & set(report_cli.COMMANDS)
    if clash:
        raise ValueError(f"{sorted(clash)} name both a CLI stage and a reporting step")
    entries.update({step: ["linvit.report.cli", module]
                    for step, module in report_cli.COMMANDS.items()})
    return entries


def module_file(name: str) -> Path | None:
    parts = name.split(".")
    if parts[0] != "linvit":
        return None
    base = SRC_ROOT.joinpath(*parts)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC_ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[Path]:
    """linvit files that importing `path` loads: named modules, submodules named in
    `from x import y`, and every parent package's __init__.py."""
    names: set[str] = set()
    package = _module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                                   # relative import
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    files = set()
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):                   # parents are imported first
            f = module_file(".".join(parts[:i]))
            if f is not None:
                files.add(f)
    return files


_memo_dir: Path | None = None


def memoise_in(folder: Path | None) -> None:
    """Store the import graph and the registries' member files in `folder` (linvit.workflow.memo),
    keyed by the code: a later Snakemake start, and every one that runs a single job (in a cluster
    job, or for a `run:` rule), reads them back instead of parsing every file and importing the
    registries, and so torch."""
    global _memo_dir
    _memo_dir = folder
    for cached in (_code_facts, import_graph, registry_members, _stage_sources, _write_stamp,
                   code_digests.file_digests, memo.code_version):
        cached.cache_clear()


@cache
def _code_facts() -> dict:
    """{"graph": file -> files it imports, "members": kind -> name -> file}, as paths relative to
    SRC_ROOT (JSON, and valid wherever the checkout is)."""
    key = memo.code_version()
    facts = memo.load(_memo_dir, "code_facts", key) or {}
    if not all(isinstance(facts.get(part), dict) for part in ("graph", "members", "kernels")):
        facts = {"graph": {_rel(p): sorted(map(_rel, _imports(p)))
                           for p in sorted(PACKAGE_ROOT.rglob("*.py"))},
                 "members": {kind: {name: _rel(path) for name, path in members.items()}
                             for kind, members in _imported_registry_members().items()},
                 "kernels": {name: sorted(map(_rel, files))
                             for name, files in _imported_kernel_files().items()}}
        memo.store(_memo_dir, "code_facts", key, facts)
    return facts


def _rel(path: Path) -> str:
    return path.relative_to(SRC_ROOT).as_posix()


@cache
def import_graph() -> dict[Path, frozenset[Path]]:
    return {SRC_ROOT / p: frozenset(SRC_ROOT / t for t in targets)
            for p, targets in _code_facts()["graph"].items()}


def closure(entries: list[str]) -> set[Path]:
    graph = import_graph()
    todo = [f for f in (module_file(e) for e in entries) if f is not None]
    seen: set[Path] = set()
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(graph.get(f, ()))
    return seen


@cache
def registry_members() -> dict[str, dict[str, Path]]:
    """kind -> name -> the file that defines that registry entry."""
    return {kind: {name: SRC_ROOT / rel for name, rel in members.items()}
            for kind, members in _code_facts()["members"].items()}


def kernel_files() -> dict[str, list[Path]]:
    """operator -> the C++ sources and headers its CPU path can run (AttentionOperator's
    cpp_sources, with their #includes)."""
    return {name: [SRC_ROOT / rel for rel in files]
            for name, files in _code_facts()["kernels"].items()}


def _imported_kernel_files() -> dict[str, list[Path]]:
    from linvit.attention import OPERATORS
    from linvit.ops.cpp_kernels import kernel_files as files_of

    return {name: sorted({f.resolve() for cpp in op.cpp_sources for f in files_of(cpp)})
            for name, op in OPERATORS.items()}


def registry_names(kind: str) -> list[str]:
    """A registry's names in its order ("operator", "loss", "dataset"), without importing it once
    stored."""
    return list(registry_members()[kind])


def _imported_registry_members() -> dict[str, dict[str, Path]]:
    from linvit.attention import OPERATORS
    from linvit.data import DATASETS
    from linvit.transfer import losses

    return {
        "operator": {n: Path(inspect.getfile(c)).resolve() for n, c in OPERATORS.items()},
        "loss": {m.LOSS.name: Path(m.__file__).resolve() for m in losses.MODULES},
        "dataset": {n: Path(inspect.getfile(type(d))).resolve() for n, d in DATASETS.items()},
    }


def stage_sources(stage: str, operators=(), losses=(), datasets=()) -> list[Path]:
    """Source files a job of `stage` runs, for the registry entries it selects."""
    return list(_stage_sources(stage, *(tuple(sorted(set(names)))
                                        for names in (operators, losses, datasets))))


@cache
def _stage_sources(stage: str, operators: tuple, losses: tuple, datasets: tuple) -> tuple:
    """(Once per distinct selection: a workflow start asks for every job's, ~3000 on the paper
    grid, from a few dozen selections.)"""
    entries = stage_entries()
    if stage not in entries:
        raise ValueError(f"unknown stage {stage!r}; allowed: {', '.join(entries)}")
    files = closure(entries[stage])
    selected = {"operator": set(operators), "loss": set(losses), "dataset": set(datasets)}
    for kind, members in registry_members().items():
        for name, path in members.items():
            if name not in selected[kind]:
                files.discard(path)
    shared = {p for kind, m in registry_members().items() for n, p in m.items()
              if n in selected[kind]}
    by_operator = kernel_files()
    kernels = {p for name in operators for p in by_operator.get(name, ())}
    return tuple(sorted(files | shared | kernels))


def code_stamp(folder: Path, stage: str, operators=(), losses=(), datasets=()) -> Path:
    """A file in `folder` that stands for the source files a job of `stage` runs (stage_sources):
    it lists them with their sha256, `sha256sum`-style, and is rewritten only when that list
    changes. Jobs take it as their one code input. Snakemake then reruns a job when its stamp is
    newer than its outputs, unless the stamp's checksum equals the one recorded when the job ran:
    so an edit reruns exactly the jobs that run the edited file, undoing the edit reruns nothing,
    and neither does a checkout that only touches modification times. A new stamp takes the
    newest modification time of its files, as the files themselves did as inputs, so a lost
    `.snakemake` reruns nothing either. A DAG of thousands of jobs checks one file per job
    instead of ~60 (measured: docs/workflow.md). Jobs check their stamp
    before they run (`linvit --code-stamp`): code edited after planning fails the job instead of
    running code its record would not account for."""
    return _write_stamp(Path(folder), stage, *(tuple(sorted(set(names)))
                                               for names in (operators, losses, datasets)))


@cache
def _write_stamp(folder: Path, stage: str, operators: tuple, losses: tuple,
                 datasets: tuple) -> Path:
    # Once per selection and start. Named by the file list, so that a job's input set changes
    # only when what it runs does. The text's format is part of every job's input checksum:
    # changing it reruns every job once.
    sources = _stage_sources(stage, operators, losses, datasets)
    files = [_rel(p) for p in sources]
    name = hashlib.sha256("\n".join(files).encode()).hexdigest()[:16]
    # One folder per stamp: while it builds the DAG, Snakemake lists each input's folder once and
    # then takes a file missing from that listing as missing. Stamps are made by input functions
    # during that build, so a new one in a shared, already listed folder would be "missing".
    path = folder / f"{stage}-{name}" / "sources.sha256"
    text = (f"# the source files (under src/) that a linvit job of stage `{stage}` runs\n"
            + code_digests.digest_lines(files))
    try:
        old = path.read_text()
    except OSError:
        old = None
    if old != text:
        try:
            write_text(path, text)
            if old is None:
                newest = max(p.stat().st_mtime_ns for p in sources)
                os.utime(path, ns=(newest, newest))
        except OSError as e:
            raise OSError(f"cannot write the code stamp {path} ({e}): the workflow keeps one "
                          "per job kind in .snakemake/linvit/code of its working directory, "
                          "which must be writable") from e
    return path
