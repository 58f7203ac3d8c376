"""Atomic file output: a reader sees either nothing or a whole file, never a half-written one.

Every result file goes through here: write to a temporary file in the same directory, fsync, then
os.replace (atomic on POSIX within one file system).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)             # mkstemp makes 0600; results are for sharing
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str | os.PathLike, writer: Callable[[Path], None]) -> None:
    with atomic_path(path) as tmp:
        writer(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_atomic(path, lambda p: p.write_text(text))


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def write_yaml(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, yaml.safe_dump(obj, sort_keys=False))


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """One JSON object per line; a line is written with a single write call and flushed."""
    line = json.dumps(record, sort_keys=True, default=_jsonable) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL log, ignoring a torn last line left by a crash mid-write."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def _jsonable(obj: Any):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
