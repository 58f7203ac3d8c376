"""File I/O every stage shares: atomic writes, strict JSON, safe YAML, checksums.

Atomic: write to a temporary file in the same directory, fsync, then os.replace (atomic on POSIX
within one file system), so a reader sees either nothing or a whole file. Temporary files are named
`.<name>.<random>.tmp`; a write killed half-way leaves one, which `remove_temporaries` clears on the
next run of that folder.

Strict: JSON never holds NaN or Infinity (which are not JSON), and YAML with a key given twice is
refused rather than silently keeping the last value.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")


def _umask() -> int:
    """The process umask, read without setting it (os.umask sets and returns it, and for a moment
    every file another thread creates would get permissions 0o666)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def file_mode() -> int:
    """What open() would give a new file: results are for sharing, like every other file."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, file_mode())            # mkstemp makes 0600; a writer may have replaced it
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def remove_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporary files that interrupted atomic writes left under `folder`."""
    removed = []
    for p in Path(folder).rglob(".*.tmp"):
        if p.is_file() and TEMP_NAME.match(p.name):
            p.unlink()
            removed.append(p)
    return removed


def write_atomic(path: str | os.PathLike, writer: Callable[[Path], None]) -> None:
    with atomic_path(path) as tmp:
        writer(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    write_atomic(path, lambda p: p.write_text(text))


def dumps(obj: Any, **kwargs) -> str:
    """JSON text; NaN and infinities raise ValueError (they are not JSON, and no reader of ours
    should ever take one for a result)."""
    return json.dumps(obj, sort_keys=True, allow_nan=False, default=_jsonable, **kwargs)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, dumps(obj, indent=2) + "\n")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str) -> Any:
    """Strict JSON: NaN, Infinity and -Infinity are refused."""
    return json.loads(text, parse_constant=_refuse_constant)


def read_json(path: str | os.PathLike) -> Any:
    return loads(Path(path).read_text())


def write_yaml(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, yaml.safe_dump(obj, sort_keys=False))


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """yaml.safe_load, except that a mapping with a key given twice is an error. On libyaml's
    parser where PyYAML has it (its wheels do): ~5x faster, which a Snakemake start feels, as it
    parses every job's overrides (~50 000 values on the paper grid)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL log, ignoring a torn last line left by a crash mid-write."""
    records = []
    with open(path) as f:
        for line in f:
            try:
                records.append(loads(line))
            except ValueError:
                break
    return records


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _jsonable(obj: Any):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
