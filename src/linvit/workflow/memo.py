"""What a workflow start computes once per version of linvit's code and then reuses: the config
check's verdict and the code map (linvit.workflow.deps: the package's import graph, the
registries' files).

Every Snakemake start evaluates the Snakefile: the one that plans a run checks every job's config,
and every one (the one inside a cluster job too, and the one Snakemake spawns for a `run:` rule)
builds the code map for code-change invalidation. Both need the registries, which are torch
classes, and the map parses every source file: seconds per start, paid again on every rerun of an
unchanged grid and twice per cluster job. Stored here instead, keyed by everything they depend on
(the code of src/linvit, byte for byte; the config; the interpreter and the torch, timm and
PyYAML versions), they are read back without importing torch. A key that differs recomputes and
replaces the entry; a verdict is also refused when a file it found has gone since
(`linvit.found_files` records them), so a deleted teacher file is still named before any job.
Only successful checks are stored.

The folder is the workflow's `.snakemake/linvit` (Snakemake's state folder, in the working
directory that cluster jobs share). Nothing outside it is written; a folder that cannot be written
only costs the recomputation.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

from linvit.code_digests import digest_lines, file_digests
from linvit.io import write_text


@cache
def code_version() -> str:
    """sha256 over every source file of the package (its path and the sha256 of its bytes)."""
    return hashlib.sha256(digest_lines(file_digests()).encode()).hexdigest()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """What besides the code can change a verdict: the interpreter and the libraries the
    registries and configs are built on."""
    return {"python": sys.version, "executable": sys.executable, "code": code_version(),
            **{dist: _version(dist) for dist in ("torch", "timm", "pyyaml")}}


def key_of(value) -> str:
    """A digest of plain data (dicts, lists, str, numbers, ...): equal data in any key order give
    the same digest; 1 and "1" do not (JSON would merge them, and fail on keys of mixed types)."""
    return hashlib.sha256(repr(_canonical(value)).encode()).hexdigest()


def _canonical(value):
    if isinstance(value, dict):
        return sorted((repr(k), _canonical(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return repr(value)


def load(folder: Path | None, name: str, key: str) -> dict | None:
    """The mapping stored under `name` for `key`; None when absent, unreadable, another key's or
    not a mapping (callers still check the fields they read)."""
    if folder is None:
        return None
    try:
        entry = json.loads((Path(folder) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    return entry["value"] if isinstance(entry.get("value"), dict) else None


def store(folder: Path | None, name: str, key: str, value) -> None:
    """Replace `name`'s entry atomically (a concurrent reader sees the old or the new one)."""
    if folder is None:
        return
    with contextlib.suppress(OSError):
        write_text(Path(folder) / f"{name}.json", json.dumps({"key": key, "value": value}))


def all_still_files(paths) -> bool:
    """Whether `paths` is a list of paths that all are files now (False for anything else)."""
    return isinstance(paths, list) and all(isinstance(p, str) and Path(p).is_file()
                                           for p in paths)
