"""The sha256 of linvit's own source files: what a workflow job's code stamp records
(linvit.workflow.deps) and what the CLI checks before it runs the job (`--code-stamp`)."""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from linvit.io import sha256_file

PACKAGE_ROOT = Path(__file__).resolve().parent          # src/linvit
# What a job's code is made of: the Python modules and the C++ kernels' sources and headers
# (linvit/ops/csrc), which the float32 CPU paths of most operators run.
SUFFIXES = (".py", ".cpp", ".h")


@cache
def file_digests() -> dict[str, str]:
    """The sha256 of every source file of the package, by its path under src/ ("linvit/io.py")."""
    return {path.relative_to(PACKAGE_ROOT.parent).as_posix(): sha256_file(path)
            for path in sorted(PACKAGE_ROOT.rglob("*")) if path.suffix in SUFFIXES
            and path.is_file()}


def digest_lines(paths) -> str:
    """`sha256sum`'s format for the given paths under src/: one "<sha256>  <path>" line each."""
    digests = file_digests()
    return "".join(f"{digests[p]}  {p}\n" for p in paths)


def digest_mismatches(text: str) -> list[str]:
    """The paths of `digest_lines` text (lines starting with # are comments) whose file under
    src/ is gone or no longer has the recorded sha256, read afresh from disk. ValueError for text
    that is not such a list: no entry at all, a malformed line, or a path that is not one of the
    package's source files (a stamp that checks nothing must not pass)."""
    changed, entries = [], 0
    for line in text.splitlines():
        if line and not line.startswith("#"):
            digest, name = line.split("  ", 1)
            if not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise ValueError(f"not a sha256: {digest[:80]!r}")
            if not re.fullmatch(r"linvit(/[A-Za-z0-9_]+)*/[A-Za-z0-9_]+\.(py|cpp|h)", name):
                raise ValueError(f"{name!r} is not a source file of the linvit package")
            entries += 1
            file = PACKAGE_ROOT.parent / name
            if not file.is_file() or sha256_file(file) != digest:
                changed.append(name)
    if not entries:
        raise ValueError("it lists no source file")
    return changed
