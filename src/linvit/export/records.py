"""What a model card says, read from the run folders that made the model: the exported run, the
distillation and the teacher it names, and the runs of the same cell at other seeds. Every
number comes from a verified run's metrics.json (linvit.runs.verify)."""
from __future__ import annotations

from pathlib import Path

from linvit.errors import ConfigError
from linvit.io import load_yaml, read_json
from linvit.models.checkpoint import ModelFile
from linvit.models.tensor_files import ORIGIN_KEY
from linvit.runs.rundir import config_identity
from linvit.runs.verify import check_run, verified_metrics

SEED = frozenset({("run", "seed")})


def finished_run(folder: str | Path, field: str = "source") -> dict:
    """The metrics of the finished, verified run in `folder`; ConfigError naming why not."""
    folder = Path(folder)
    metrics, why = check_run(folder)
    if metrics is None:
        raise ConfigError(f"{field}: {folder} holds no finished linvit run ({why})")
    if not (folder / "model.safetensors").is_file():
        raise ConfigError(f"{field}: {folder} is a {metrics.get('stage')} run, which leaves no "
                          "model.safetensors to export")
    return metrics


def run_config(folder: Path) -> dict:
    return load_yaml((folder / "config.yaml").read_text())["config"]


def input_path(value: str | None, metrics: dict) -> Path | None:
    """An input a run's config names, as it was read: the absolute path in its metrics' inputs
    (the config may hold a path relative to where the run started)."""
    if not value:
        return None
    for name in metrics.get("inputs") or {}:
        if Path(name) == Path(value).resolve() or name.endswith("/" + value.lstrip("./")):
            return Path(name)
    return Path(value) if Path(value).exists() else None


def producer(model_path: Path | None) -> dict | None:
    """The record of the run whose model file `model_path` is (its folder's verified metrics and
    config), or None when that folder is not a finished run here."""
    if model_path is None or not model_path.is_file():
        return None
    metrics = verified_metrics(model_path.parent)
    if metrics is None:
        return None
    return {"path": str(model_path), "metrics": metrics, "config": run_config(model_path.parent)}


def seed_runs(folder: Path, config: dict, own: dict) -> list[dict]:
    """Finished runs beside `folder` (its parent's other sub-folders: the workflow's seedN) whose
    config differs from its own in run.seed alone, with their metrics, seed-ordered."""
    folder, want, found = folder.resolve(), config_identity(config, SEED), []
    for other in sorted(p for p in folder.parent.iterdir() if p.is_dir()):
        if not (other / "config.yaml").is_file():
            continue
        try:
            cfg = run_config(other)
        except (OSError, KeyError, TypeError, ValueError):
            continue
        if config_identity(cfg, SEED) != want:
            continue
        # the exported run itself was verified already (finished_run)
        metrics = own if other == folder else verified_metrics(other)
        if metrics is not None:
            found.append({"seed": cfg["run"]["seed"], "top1": metrics.get("top1"),
                          "path": str(other)})
    return sorted(found, key=lambda r: r["seed"])


def gather(folder: str | Path, use_seeds: bool = True) -> dict:
    """Everything the card and config.json say of the run in `folder`."""
    folder = Path(folder)
    metrics = finished_run(folder)
    config = run_config(folder)
    model_file = ModelFile(folder / "model.safetensors")
    copied = read_json(folder / "copied.json") if (folder / "copied.json").is_file() else None
    teacher = producer(input_path(config.get("teacher"), metrics))
    distilled = producer(input_path(config.get("distilled"), metrics))
    return {"folder": str(folder), "metrics": metrics, "config": config, "copied": copied,
            "model_file": model_file, "origin": model_file.carried(head=False).get(ORIGIN_KEY),
            "teacher": teacher, "distilled": distilled,
            "seeds": seed_runs(folder, config, metrics) if use_seeds else []}
