"""Whether a run folder holds a complete run: what reporting needs of run folders, without the
code that writes them (so a report step's code map stays free of model and training code)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from linvit.io import read_json, sha256_file


def input_digests(paths) -> dict[str, str]:
    """sha256 of each path that is a file now, by its absolute path: what a run read."""
    out = {}
    for p in paths:
        target = Path(p).expanduser().resolve()
        if target.is_file():
            out[str(target)] = _digest(target)
    return out


def _digest(target: Path) -> str:
    stat = target.stat()
    return _cached_digest(str(target), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _cached_digest(path: str, mtime_ns: int, size: int) -> str:
    """Hashed once per file version in a process (a report reads many runs of one teacher)."""
    return sha256_file(Path(path))


def verified_metrics(path: str | Path) -> dict | None:
    """The metrics of a complete run in `path`, or None (check_run says why)."""
    return check_run(path)[0]


def check_run(path: str | Path) -> tuple[dict | None, str]:
    """(metrics, "") for a complete run in `path`, else (None, why not). Complete means
    metrics.json is strict JSON, every output it lists is present and has the checksum written
    with it, and no input file it lists has changed since (one that is gone, e.g. a results
    folder moved to another machine, cannot be checked and does not count against the run)."""
    path = Path(path)
    try:
        metrics = read_json(path / "metrics.json")
        files = metrics["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, "its metrics.json is missing or not valid"
    if not isinstance(files, dict):
        return None, "its metrics.json lists no outputs"
    for name, digest in files.items():
        target = path / name
        if not target.exists() if digest is None else not target.is_file():
            return None, f"its output {name} is missing"
        if digest is not None and sha256_file(target) != digest:
            return None, f"its output {name} has changed since the run wrote it"
    inputs = metrics.get("inputs") or {}
    if not isinstance(inputs, dict):
        return None, "its metrics.json lists no valid inputs"
    for name, digest in inputs.items():
        target = Path(name)
        if target.is_file() and _digest(target) != digest:
            # stale: computed from another version of an input
            return None, f"its input {name} has changed since the run read it"
    return metrics, ""
