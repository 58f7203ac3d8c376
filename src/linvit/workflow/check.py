"""The workflow config check, before any job runs: grid names usable as folders and CLI words,
registry names, teacher entries and their files, and every job's resolved linvit config, built
as its stage would build it. A successful verdict is stored per config, code and environment
(linvit.workflow.memo) and reused while the files it found are still there."""
from __future__ import annotations

import re
from pathlib import Path

from linvit import found_files
from linvit.workflow import axes, memo, selection
from linvit.workflow.grid import check_seed_grid, grid_axes, robustness_section, teacher_specs
from linvit.workflow.plan import Plan, plan
from linvit.workflow.schema import GRID_KEYS, NAME_PATTERN


def use_shipped_grid(config: dict, configfiles: list) -> bool:
    """Whether the Snakefile loads the shipped grid (config/config.yaml): only without --configfile.

    A --configfile replaces the shipped grid rather than being merged onto it, so one that lacks
    a grid key is refused instead of silently borrowing the shipped grid's datasets or sizes.
    """
    from linvit.errors import ConfigError  # (linvit.config imports the training stack)

    if not configfiles:
        return True
    missing = [k for k in GRID_KEYS if k not in config]
    if missing:
        raise ConfigError(f"{', '.join(map(str, configfiles))}: no {', '.join(missing)} (a "
                          "--configfile replaces the shipped grid, config/config.yaml, so it "
                          "must define the whole grid)")
    return False


def grid_names(config: dict) -> dict[str, list]:
    """Every name that becomes a path part or a command-line word, by config field."""
    sub, dense = config.get("loss_grid") or {}, config.get("dense") or {}
    return {"datasets": list(config["datasets"]), "sizes": config["sizes"],
            "operators": config["operators"], "strategies": config["strategies"],
            "reference_strategies": config.get("reference_strategies", []),
            "losses": list(config["losses"]), "main_loss": [config["main_loss"]],
            "loss_grid.operators": sub.get("operators", []),
            "loss_grid.strategies": sub.get("strategies", []),
            "loss_grid.losses": sub.get("losses", []),
            "teachers": list(teacher_specs(config)),
            "dense.operators": dense.get("operators", []),
            "dense.strategies": dense.get("strategies", [])}


def check_names(config: dict) -> None:
    """Grid keys present, grid names safe, and a results path Snakemake can put in patterns."""
    from linvit.errors import ConfigError

    missing = [k for k in GRID_KEYS if k not in config]
    if missing:
        raise ConfigError(f"{missing[0]}: required")
    for field, values in grid_names(config).items():
        bad = [v for v in values if not (isinstance(v, str) and re.fullmatch(NAME_PATTERN, v))]
        if bad:
            raise ConfigError(f"{field}: {bad[0]!r} is not an allowed name (names become folders "
                              f"and command-line words; allowed: {NAME_PATTERN})")
    folders = {"results": config.get("results", "results"),
               **({"jobs_folder": config["jobs_folder"]}
                  if config.get("jobs_folder") is not None else {})}
    for field, path in folders.items():
        if not isinstance(path, str) or not path or re.search(r"[{}\n]", path):
            raise ConfigError(f"{field}: {path!r} must be a non-empty path without braces or "
                              "newlines (Snakemake reads braces in output paths as wildcards)")


def _check_registries(config: dict) -> None:
    from linvit.attention import OPERATORS
    from linvit.data import DATASETS
    from linvit.errors import ConfigError
    from linvit.models import SIZES
    from linvit.transfer.losses import LOSSES
    from linvit.transfer.strategies import STRATEGIES

    def names(field, values, allowed):
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ConfigError(f"{field}: {bad} not in: {', '.join(map(str, allowed))}")

    sub = config.get("loss_grid") or {}
    names("sizes", config["sizes"], SIZES)
    names("operators", config["operators"] + sub.get("operators", []), OPERATORS)
    names("strategies", config["strategies"] + config.get("reference_strategies", [])
          + sub.get("strategies", []), STRATEGIES)
    names("main_loss / loss_grid.losses", [config["main_loss"], *sub.get("losses", [])],
          config["losses"])
    for design, weights in config["losses"].items():
        names(f"losses.{design}", weights, LOSSES)
    for name, data in config["datasets"].items():
        names(f"datasets.{name}.dataset", [data["dataset"]], DATASETS)
    for name, spec in teacher_specs(config).items():
        names(f"teachers.{name}.size", [spec["size"]] if spec.get("size") else [], SIZES)
        names(f"teachers.{name}.students", spec.get("students") or [], config["sizes"])
    if dense := config.get("dense"):
        from linvit.dense.tasks import TASKS

        names("dense.tasks", dense["tasks"], TASKS)
        names("dense.stages", list(dense.get("stages") or {}), dense["tasks"])


def _check_teachers(config: dict) -> None:
    """Each teacher is fully described, and imported weight files exist now, not only when their
    job starts."""
    from linvit.errors import ConfigError

    for name, spec in teacher_specs(config).items():
        where = f"teachers.{name}"
        if spec["source"] == "timm" and not spec.get("size"):
            raise ConfigError(f"{where}.size: required for a timm teacher (its architecture)")
        if spec["source"] == "pretrain" and spec.get("students") and not spec.get("size"):
            raise ConfigError(f"{where}.students: needs {where}.size (the size it is trained at)")
        for key in ("file", "layout", "timm_name", "headless", "probe"):
            if spec["source"] != "timm" and spec.get(key) is not None:
                raise ConfigError(f"{where}.{key}: only for a timm teacher (source: timm)")
        if spec.get("layout") is not None:        # before the import check reads the file
            from linvit.config import one_of
            from linvit.models.layouts import LAYOUTS

            one_of(f"{where}.layout", spec["layout"], LAYOUTS)
        file = spec.get("file")
        if file is not None and not Path(file).is_file():
            raise ConfigError(f"{where}.file: file not found: {file}")
        if file is not None:
            found_files.note_checked(file)


def _check_teacher_files(config: dict) -> None:
    """Each imported teacher file goes through the import its job will run (format, layout,
    head, finiteness), for each dataset it teaches whose data this host can read: a grid that
    passes the check does not fail on its teacher file."""
    from linvit.data import get_dataset
    from linvit.errors import CheckpointError, ConfigError, DataError
    from linvit.models import ModelSpec
    from linvit.models.timm_import import import_timm_weights

    for name, spec in teacher_specs(config).items():
        if spec["source"] != "timm" or spec.get("file") is None:
            continue
        headless, imported = bool(spec.get("headless")), set()
        for data in config["datasets"].values():
            try:
                info = get_dataset(data["dataset"]).info(data.get("root"), data.get("img_size"))
            except DataError:
                continue                    # data on the hosts the jobs run on: they check it
            model = ModelSpec(spec["size"], "softmax", 0 if headless else info.num_classes,
                              info.img_size, info.in_chans)
            shape = (model.num_classes, model.img_size, model.in_chans)
            if shape in imported:           # the same import for another dataset of one shape
                continue
            imported.add(shape)
            try:
                import_timm_weights(model, spec["file"], not headless,
                                    spec.get("layout", "timm"), spec.get("timm_name"))
            except CheckpointError as e:
                raise ConfigError(f"teachers.{name}.file: {e}") from None


def _check_shift_classes(config: dict) -> None:
    """ImageNet shift sets score 1000-class ImageNet models: a grid whose dataset has other
    classes is refused here, not by each of its robustness jobs."""
    from linvit.data import get_dataset
    from linvit.errors import ConfigError, DataError
    from linvit.robustness.shifts import IMAGENET_CLASSES

    if not (robustness_section(config).get("shifts")):
        return
    for name, data in config["datasets"].items():
        try:
            classes = get_dataset(data["dataset"]).info(data.get("root"),
                                                        data.get("img_size")).num_classes
        except DataError:
            continue
        if classes != IMAGENET_CLASSES:
            raise ConfigError(f"robustness.shifts: ImageNet shift sets score a "
                              f"{IMAGENET_CLASSES}-class ImageNet model; datasets.{name} "
                              f"({data['dataset']}) has {classes} classes")


def job_arguments(config: dict, existing_file: str,
                  jobs: Plan | None = None) -> list[tuple[str, str, str, list[str]]]:
    """(config field, job folder, stage, overrides) of every job the workflow can run, as its
    rule gives them (linvit.workflow.plan), with `existing_file` (and its folder) standing in for
    the files and folders jobs read that are not yet made. `run.threads` as the rule's shell line
    adds it to every job that leaves a record."""
    from linvit.stages import STAGES

    jobs = jobs or plan(config)
    out = []
    for job in jobs.jobs:
        if job.stage not in STAGES:            # a reporting step (a choice of settings)
            continue
        threads = [f"run.threads={job.kind.threads}"] if job.kind.record_kind else []
        where = job.folder.removeprefix(job.results).lstrip("/")
        out.append((job.field, where, job.stage, job.words(existing_file) + threads))
    return out


def check_config(config: dict, existing_file: str, memo_dir: Path | None = None) -> None:
    """Names, registries, cross-references and every job's resolved linvit config, before any job
    runs: each job's exact overrides are built into its stage's config (the paper grid's ~400
    jobs take about a second). With `memo_dir`, a verdict stored there for the same config, code
    and environment is reused while the files it found are still there (linvit.workflow.memo): no
    torch import, no rebuild."""
    if memo_dir is None:
        return _check_config(config, existing_file)
    key = memo.key_of({"config": config, "existing_file": existing_file,
                       "environment": memo.environment()})
    found = memo.load(memo_dir, "config_check", key) or {}
    if memo.all_still_files(found.get("files")):
        return
    with found_files.recording() as files:
        _check_config(config, existing_file)
    memo.store(memo_dir, "config_check", key, {"files": sorted(set(files))})


def _check_config(config: dict, existing_file: str) -> None:
    from linvit.cli import stage_config
    from linvit.config import load_config
    from linvit.errors import ConfigError

    check_names(config)
    axes.check_types(grid_axes(config))
    selection.check(config)
    _check_registries(config)
    check_seed_grid(config)
    _check_teachers(config)
    _check_teacher_files(config)
    _check_shift_classes(config)
    jobs = plan(config)
    built = {}
    for field, where, stage, overrides in job_arguments(config, existing_file, jobs):
        try:
            built[where] = load_config(stage_config(stage), None, overrides)
        except ConfigError as e:
            raise ConfigError(f"{field} (job {where}): {e}") from None
    _check_dense_necks(jobs, built)


def _check_dense_necks(jobs: Plan, built: dict) -> None:
    """ViT-Adapter's interactions and heads against each dense backbone's depth and width (a
    stage config alone does not know its backbone's size). `built`: job folder -> config."""
    from linvit.dense.stages import check_adapter
    from linvit.errors import ConfigError
    from linvit.models import SIZES

    for job in jobs.of("dense"):
        where = job.folder.removeprefix(job.results).lstrip("/")
        cfg = built[where]
        if cfg.model.neck == "adapter":
            try:
                check_adapter(cfg.model.adapter, SIZES[job.wildcards["size"]])
            except ConfigError as e:
                raise ConfigError(f"dense.adapter (job {where}): {e}") from None
