"""Whether a run folder holds a complete run: what reporting needs of run folders, without the
code that writes them (so a report step's code map stays free of model and training code)."""
from __future__ import annotations

from pathlib import Path

from linvit.io import read_json, sha256_file


def verified_metrics(path: str | Path) -> dict | None:
    """The metrics of a complete run in `path`, or None: complete means metrics.json is strict
    JSON and every output it lists is present and has the checksum written with it."""
    path = Path(path)
    try:
        metrics = read_json(path / "metrics.json")
        files = metrics["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, dict):
        return None
    for name, digest in files.items():
        target = path / name
        if digest is None:
            if not target.exists():
                return None
        elif not target.is_file() or sha256_file(target) != digest:
            return None
    return metrics
