"""A run folder's lock: one linvit process writes a folder at a time. flock on the folder's
lock file, held until the run finishes or the process ends (the kernel drops it then, also after
kill -9); a run of this process that holds it (an earlier, interrupted stage call) hands it on."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from linvit.errors import RunDirError
from linvit.io import file_mode

LOCK = ".linvit-lock"

log = logging.getLogger("linvit")
_HELD: dict[str, int] = {}               # run folder -> lock file descriptor, in this process


def take_lock(folder: Path) -> None:
    """Hold `folder`'s lock, or RunDirError when another process holds it."""
    key = str(folder.resolve())
    if key in _HELD:
        return
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, file_mode())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            # some cluster file systems (Lustre without flock, some NFS) have no locks
            log.warning("%s: no lock on this file system (%s); nothing stops a second "
                        "run into this folder", folder, e)
            return
        raise RunDirError(f"{folder}: another linvit process is writing this folder; wait "
                          "for it or choose another output folder") from None
    _HELD[key] = fd


def release_lock(folder: Path) -> None:
    fd = _HELD.pop(str(folder.resolve()), None)
    if fd is not None:
        os.close(fd)
