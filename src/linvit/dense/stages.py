"""Stage entry points `linvit segment` (UperNet) and `linvit detect` (Mask R-CNN). A dense run
folder holds the usual config.yaml, run.log and metrics.json, plus mmengine's
own work/ folder (its logs and its checkpoints, from which an interrupted run resumes).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from linvit.dense.config import DenseConfig
from linvit.dense.tasks import TASKS, DenseTask
from linvit.errors import ConfigError
from linvit.runs.runtime import seed_everything, setup_runtime
from linvit.runs.stage import completed_metrics, prepare_run

log = logging.getLogger("linvit")


def run_dense(name: str, cfg: DenseConfig, out, replace: bool = False) -> dict:
    from linvit.data import get_dataset
    from linvit.dense.scenes import verify_scenes
    from linvit.models import SIZES
    from linvit.models.checkpoint import ModelFile

    task = TASKS[name]
    if cfg.data.kind not in ("scenes", task.real_kind):
        raise ConfigError(f"data.kind: {cfg.data.kind!r} does not fit {name} (scenes or "
                          f"{task.real_kind})")
    check_folder(cfg.data)
    backbone = ModelFile(cfg.checkpoint)
    spec = backbone.spec
    if cfg.model.neck == "adapter":
        check_adapter(cfg.model.adapter, SIZES[spec.size])
    run = prepare_run(cfg, out, name, replace)
    if run.finished:
        return completed_metrics(run)
    rt = setup_runtime(cfg.run)
    seed_everything(cfg.run.seed)
    if cfg.data.kind == "scenes":
        verify_scenes(cfg.data.root)
    backbone.state  # noqa: B018 (read: its checksum checked, before any write)
    if backbone.maps_teacher is not None:
        raise ConfigError(f"checkpoint: {cfg.checkpoint} runs on its teacher's attention maps "
                          "(attention transfer, copy mode): it has no attention of its own to "
                          "put under a dense head")
    if cfg.data.img_size % SIZES[spec.size].patch_size:
        raise ConfigError(f"data.img_size: {cfg.data.img_size} is not a multiple of the "
                          f"backbone's patch size {SIZES[spec.size].patch_size}")
    mean, std = get_dataset(cfg.pretrain_dataset).normalisation()
    mean = [255 * m for m in mean] * (3 // len(mean))         # grey statistics on every channel
    std = [255 * s for s in std] * (3 // len(std))
    run.is_main = rt.is_main
    run.open(f"{name} with a {spec.operator} {spec.size} backbone from {cfg.checkpoint}")
    config = build_config(task, cfg, SIZES[spec.size].width, mean, std, str(run.path / "work"))
    metrics, train_s, eval_s = train_and_validate(config)
    result = {task.metrics[k]: v for k, v in metrics.items() if k in task.metrics}
    if task.percent:                        # fractions in [0, 1]; tables use percent
        result = {k: 100 * v for k, v in result.items()}
    if not metrics and task.empty_means_zero:
        log.warning("%s: no metrics (nothing scored above the threshold): every metric is 0",
                    name)
        result = dict.fromkeys(task.metrics.values(), 0.0)
    return run.finish({**result, "raw": metrics, "iters": cfg.optim.iters, "train_s": train_s,
                       "eval_s": eval_s, "step_s": train_s / cfg.optim.iters,
                       "backbone": spec.as_dict()})


def check_folder(data) -> None:
    """The folder has the task's layout, and every image in it opens (before the run writes)."""
    from linvit.data.imagefolder import check_images
    from linvit.dense.configs import required_paths

    root = Path(data.root)
    if not root.is_dir():
        raise ConfigError(f"data.root: folder not found: {root}")
    required = required_paths(data.kind)
    missing = [p for p in required if not (root / p).exists()]
    if missing:
        raise ConfigError(f"data.root: {root} is not a {data.kind} folder in the standard layout: "
                          f"missing {', '.join(missing)}")
    for path, kind in required.items():
        where = root / path
        if kind == "file" and not where.is_file():
            raise ConfigError(f"data.root: {where} must be a file ({data.kind} layout)")
        if kind == "images" and not where.is_dir():
            raise ConfigError(f"data.root: {where} must be a folder ({data.kind} layout)")
        if kind == "images":
            images = _image_files(where)
            if not images:
                raise ConfigError(f"data.root: {where} holds no image ({data.kind} layout)")
            check_images(images)


def _image_files(folder: Path) -> list[Path]:
    """The image files in `folder` and the folders in it."""
    from linvit.data.imagefolder import IMAGE_SUFFIXES

    return [p for p in sorted(folder.rglob("*")) if p.suffix.lower() in IMAGE_SUFFIXES
            and p.is_file()]


def check_adapter(adapter, size) -> None:
    """ViT-Adapter's settings against the backbone's shape, before any compute."""
    import dataclasses

    from linvit.dense.adapter_spec import adapter_spec

    try:
        spec = adapter_spec(dataclasses.asdict(adapter), size.depth, size.heads)
    except ValueError as e:
        raise ConfigError(f"model.adapter.interactions: {e}") from None
    # mmcv splits the query width and the value projection's width over the heads
    value_width = int(size.width * spec.deform_ratio)
    for what, width in (("width", size.width), ("value width (x deform_ratio)", value_width)):
        if width % spec.heads:
            raise ConfigError(f"model.adapter.heads: {spec.heads} does not divide the backbone's "
                              f"{what} {width}")


def build_config(task: DenseTask, cfg: DenseConfig, width: int, mean, std, work_dir: str):
    import importlib

    from mmengine.config import Config

    module, function = task.build.split(":")
    make = getattr(importlib.import_module(module), function)
    return Config(make(cfg, width, mean, std, work_dir))


def train_and_validate(config) -> tuple[dict, float, float]:
    """mmengine's Runner: train (resuming from work_dir's last checkpoint), then validate.
    Returns the validation metrics and the seconds spent training and validating."""
    import importlib

    from mmengine.runner import Runner

    from linvit.dense.backbone import register
    from linvit.dense.safe_load import mmengine_checkpoints_allowed

    # import every module of the task's package into its registries (mmdet does not do it lazily)
    importlib.import_module(f"{config.default_scope}.utils").register_all_modules(
        init_default_scope=False)
    register()
    if not Path(config.work_dir, "last_checkpoint").is_file():
        config.resume = False
    runner = Runner.from_cfg(config)
    start = time.perf_counter()
    with mmengine_checkpoints_allowed():
        runner.train()
    middle = time.perf_counter()
    metrics = {k: float(v) for k, v in runner.val().items()}
    return metrics, middle - start, time.perf_counter() - middle


def run_segment(cfg: DenseConfig, out, replace: bool = False) -> dict:
    return run_dense("segment", cfg, out, replace)


def run_detect(cfg: DenseConfig, out, replace: bool = False) -> dict:
    return run_dense("detect", cfg, out, replace)
