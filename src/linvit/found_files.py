"""The files a config check found, recorded while a workflow checks its jobs' configs: a stored
verdict (linvit.workflow.memo) holds only while every file it found is still there. Core code
(the config's file fields) notes them; only the workflow records."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

_recorders: list[list[str]] = []


def note_checked(path) -> None:
    """Record a file a config check found (see `recording`)."""
    for files in _recorders:
        files.append(str(path))


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """The files that checks inside the block found to exist (`note_checked`)."""
    files: list[str] = []
    _recorders.append(files)
    try:
        yield files
    finally:
        _recorders.remove(files)
