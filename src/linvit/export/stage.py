"""`linvit export RUN_DIR -o DIR`: the run's model as a Hub-style folder that timm loads
(`timm.create_model("local-dir:DIR", pretrained=True)` after `import linvit`), with its model
card, and with `push_to_hub=ORG/NAME` uploaded through huggingface_hub."""
from __future__ import annotations

import logging
from pathlib import Path

from linvit.data import get_dataset
from linvit.errors import ConfigError, DataError
from linvit.export.config import ExportConfig
from linvit.io import write_text
from linvit.runs.stage import completed_metrics, prepare_run

log = logging.getLogger("linvit")

HF_FILES = ("model.safetensors", "config.json", "README.md")   # what goes to the Hub


def label_names(config: dict) -> tuple:
    """The class names of the run's dataset, when they are known here (a folder dataset's come
    from its folder, which may not be on this machine: then none are written)."""
    data = config.get("data", {})
    try:
        return tuple(get_dataset(data["dataset"]).info(data.get("root"),
                                                       data.get("img_size")).class_names)
    except (DataError, KeyError, OSError) as e:
        log.warning("no label names in config.json: %s", e)
        return ()


def run_export(cfg: ExportConfig, out, replace: bool = False) -> dict:
    from linvit.export.card import model_card
    from linvit.export.records import gather
    from linvit.models.hub import pretrained_cfg, write_hf_folder

    run = prepare_run(cfg, out, "export", replace)
    if run.finished:
        return completed_metrics(run)
    rec = gather(cfg.source, cfg.seed_runs)            # refuses an unfinished run, naming why
    source = rec["model_file"]
    if source.maps_teacher is not None:
        raise ConfigError(f"source: {cfg.source} runs on its teacher's attention maps "
                          "(attention transfer, copy mode); it cannot stand alone as a model")
    model = source.load()
    data = rec["config"].get("data", {})
    mean, std = get_dataset(data["dataset"]).normalisation() if "dataset" in data else ((), ())
    labels = label_names(rec["config"])
    run.open()
    write_hf_folder(model, run.path, pretrained_cfg(source.spec, mean, std, labels),
                    metadata=source.carried())
    write_text(run.path / "README.md", model_card(rec, cfg.license, cfg.push_to_hub))
    hub = None
    if cfg.push_to_hub:
        from linvit.export.push import push_folder

        hub = push_folder(run.path, cfg.push_to_hub, HF_FILES, cfg.private, cfg.hub_endpoint)
    return run.finish({"source": str(Path(cfg.source).resolve()), "spec": source.spec.as_dict(),
                       "top1": rec["metrics"].get("top1"), "labels": len(labels),
                       "seed_runs": [r["path"] for r in rec["seeds"]], "hub": hub})
