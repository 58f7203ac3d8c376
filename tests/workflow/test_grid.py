"""The workflow's logic, without Snakemake: grid expansion, arguments, code map, tables."""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml

from linvit.attention import OPERATORS
from linvit.config import load_config
from linvit.errors import ConfigError
from linvit.render.tables import summarize, to_latex, to_markdown
from linvit.report.claims import CLAIMS, SOFTMAX
from linvit.report.collect import results_frame
from linvit.report.tables import format_cell, main_table
from linvit.robustness.shifts import SHIFTS
from linvit.transfer.config import FinetuneConfig
from linvit.workflow import check, dense_jobs, deps, grid

ROOT = Path(__file__).resolve().parents[2]


def default_config() -> dict:
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config.setdefault("teachers", {})
    return config


def test_default_grid_decides_every_claim_on_two_operator_families_with_seeds():
    """What the report's claims read: every strategy of every claim, the softmax reference, a
    feature map and a gated operator, and seeds to pair (one seed decides nothing)."""
    config = default_config()
    cells = grid.expand_grid(config)
    needed = {s for claim in CLAIMS for s in claim.needs if s != SOFTMAX}
    assert needed <= set(config["strategies"])
    assert {"linear", "gla"} <= set(config["operators"])
    assert len(config["seeds"]) >= 2
    main = [c for c in cells if c.loss in (config["main_loss"], "none") and c.operator != "softmax"]
    assert {c.init for c in main} == set(config["strategies"])
    assert len(main) == len(config["strategies"]) * len(config["operators"]) * len(config["seeds"])
    assert any(c.operator == "softmax" for c in cells)
    assert grid.teachers(config, cells) == [("fashion_mnist", "pretrain", "cpu96")]
    # one distillation per (operator, loss design), shared by every cell that needs it
    assert len(grid.distillations(cells)) == len(config["operators"]) + 2


def test_loss_is_none_exactly_for_strategies_without_distillation():
    for c in grid.expand_grid(default_config()):
        assert (c.loss == "none") == (c.init not in ("distill", "copy_mlp+distill"))


def test_job_arguments_are_valid_linvit_configs(tmp_path):
    config = default_config()
    cell = grid.Cell("fashion_mnist", "pretrain", "cpu96", "focused", "copy_mlp+distill", "out",
                     3)
    teacher = tmp_path / "t.safetensors"
    teacher.write_bytes(b"")
    words = shlex.split(grid.finetune_args(config, cell, str(teacher), str(teacher), "OUT"))
    assert words[:4] == ["finetune", "-o", "OUT", "--rerun"]
    cfg = load_config(FinetuneConfig, None, words[4:])
    assert (cfg.model.operator, cfg.init.strategy, cfg.run.seed) == \
        ("focused", "copy_mlp+distill", 3)
    assert cfg.data.train_subset == config["stages"]["finetune"]["data"]["train_subset"]
    distill = shlex.split(grid.distill_args(config, "fashion_mnist", "pretrain", "cpu96",
                                            "linear", "map+out", str(teacher), "D"))
    assert 'distill.losses={"attn_map_ce": 1.0, "attn_out_mse": 1.0}' in distill


NAME_RULE = f"allowed: {check.NAME_PATTERN}"


def test_each_distillation_gets_exactly_its_loss_design(tmp_path):
    """A loss design's weights replace the stage default, never add to it."""
    from linvit.transfer.config import DistillConfig
    config, teacher = default_config(), str(ROOT / "Snakefile")
    for design, weights in config["losses"].items():
        words = shlex.split(grid.distill_args(config, "fashion_mnist", "pretrain", "cpu96",
                                              "linear", design, teacher, "D"))
        assert load_config(DistillConfig, None, words[4:]).distill.losses == weights, design


@pytest.mark.parametrize("change, message", [
    ({"operators": ["lineer"]}, "operators: ['lineer'] not in"),
    ({"strategies": ["copy_everything"]}, "strategies: ['copy_everything'] not in"),
    ({"main_loss": "nope"}, "main_loss / loss_grid.losses: ['nope'] not in"),
    ({"losses": {"out": {"mse": 1.0}, "map": {}, "map+out": {}}}, "losses.out: ['mse'] not in"),
    ({"stages": {"finetune": {"optim": {"lrr": 0.1}}}},
     "stages.finetune (job cells/fashion_mnist/pretrain/cpu96/linear/random/none/seed0): "
     "optim.lrr: unknown field"),
    # names become folders and shell words: refused even when the schema is skipped
    ({"datasets": {"x$(touch${IFS}MARKER)": {"dataset": "fashion_mnist"}}},
     f"datasets: 'x$(touch${{IFS}}MARKER)' is not an allowed name (names become folders and "
     f"command-line words; {NAME_RULE})"),
    ({"losses": {"out": {"attn_out_mse": 1.0}, "it's": {"attn_map_ce": 1.0}}},
     "losses: \"it's\" is not an allowed name"),
    ({"sizes": ["cpu96", "../cpu96"]}, "sizes: '../cpu96' is not an allowed name"),
    ({"strategies": ["random", "-rf"]}, "strategies: '-rf' is not an allowed name"),
    ({"dense": {"tasks": ["segment"], "operators": ["linear x"], "strategies": ["random"]}},
     "dense.operators: 'linear x' is not an allowed name"),
    ({"results": "out/{dataset}"}, "results: 'out/{dataset}' must be a non-empty path without "
                                   "braces"),
    ({"datasets": None}, "datasets: required"),
    # teacher files and jobs beyond the first of each stage
    ({"teachers": {"deit": {"source": "timm", "size": "cpu96", "file": "no/such/deit.pth"}}},
     "teachers.deit.file: file not found: no/such/deit.pth"),
    ({"teachers": {"deit": {"source": "timm", "file": "deit.pth"}}},
     "teachers.deit.size: required for a timm teacher"),
    ({"teachers": {"big": {"source": "pretrain", "size": "cpu192", "students": ["deit_t"]}}},
     "teachers.big.students: ['deit_t'] not in: cpu96"),
    ({"teachers": {"big": {"source": "pretrain", "students": ["cpu96"]}}},
     "teachers.big.students: needs teachers.big.size"),
    ({"teachers": {"big": {"source": "pretrain", "headless": True}}},
     "teachers.big.headless: only for a timm teacher"),

    ({"losses": {"out": {"attn_out_mse": 1.0}, "map": {"attn_map_ce": -1.0},
                 "map+out": {"attn_map_ce": 1.0}}},
     "stages.distill / losses.map (job distill/fashion_mnist/pretrain/cpu96/linear/map): "
     "distill.losses.attn_map_ce: must be >= 0"),
    ({"operators": ["focused", "inline"], "reference_strategies": [], "loss_grid": None,
      "dense": None,
      "stages": {"finetune": {"model": {"operator_options": {"focusing_factor": 2.0}}}}},
     "stages.finetune (job cells/fashion_mnist/pretrain/cpu96/inline/random/none/seed0): "
     "model.operator_options"),
    ({"bench": {"tokens": [15]}}, "bench (job bench): tokens[0]: 15 is not a positive square"),
])
def test_check_config_names_the_field(change, message):
    config = {k: v for k, v in {**default_config(), **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=re.escape(message)):
        check.check_config(config, str(ROOT / "Snakefile"))


def test_grid_names_allow_every_registry_name():
    from linvit.attention import OPERATORS
    from linvit.models import SIZES
    from linvit.transfer.strategies import STRATEGIES
    for name in [*OPERATORS, *SIZES, *STRATEGIES, "map+out", "fashion_mnist", "v1.2"]:
        assert re.fullmatch(check.NAME_PATTERN, name), name


def test_schema_repeats_the_grid_rules():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schema["$defs"]["name"]["pattern"] == check.NAME_PATTERN
    assert tuple(schema["required"]) == check.GRID_KEYS


def test_check_config_builds_every_job_with_its_own_arguments(monkeypatch):
    """Each teacher, distillation, cell, attention-maps job, dense job, the benchmark, the
    corrupted copy and every robustness job is built into its stage's config, so an override
    that only some jobs reject is found before any job runs."""
    import linvit.config
    config = default_config()
    built, load = [], linvit.config.load_config
    monkeypatch.setattr(linvit.config, "load_config",
                        lambda cls, path, overrides: built.append((cls.__name__, overrides))
                        or load(cls, path, overrides))
    check.check_config(config, str(ROOT / "Snakefile"))
    cells = grid.expand_grid(config)
    counts = {name: sum(1 for n, _ in built if n == name) for name, _ in built}
    assert counts == {"PretrainConfig": len(grid.teachers(config, cells)),
                      "DistillConfig": len(grid.distillations(cells)),
                      "FinetuneConfig": len(cells) + len(dense_jobs.dense_cells(config, cells)),
                      "ScenesConfig": 1, "DenseConfig": len(dense_jobs.dense_jobs(config, cells)),
                      "BenchConfig": 1, "MapsConfig": len(grid.attention_models(config, cells)),
                      "CorruptConfig": len(config["datasets"]),
                      "RobustnessConfig": len(grid.teachers(config, cells)) + len(cells)}
    seeds = {o for _, overrides in built for o in overrides if o.startswith("init.strategy=")}
    assert len(seeds) == len(config["strategies"])
    # an operator option that suits one operator of the grid is fine when only it gets it
    focused = {**default_config(), "operators": ["focused"], "reference_strategies": [],
               "stages": {"finetune": {"model": {"operator_options": {"focusing_factor": 2.0}}}}}
    del focused["loss_grid"], focused["dense"]
    check.check_config(focused, str(ROOT / "Snakefile"))


def test_check_config_covers_the_paper_grid():
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    jobs = check.job_arguments(config, str(ROOT / "Snakefile"))
    cells = grid.expand_grid(config)
    maps = grid.attention_models(config, cells)
    assert maps[0] == grid.MAPS_TEACHER and len(maps) == 1 + len(config["operators"])
    robustness = len(config["datasets"]) + len(grid.teachers(config, cells)) + len(cells)
    dense = 1 + len(dense_jobs.dense_jobs(config, cells))            # scenes + the dense jobs
    assert len(jobs) == (len(grid.imports(config, cells)) + len(grid.teachers(config, cells))
                         + len(grid.distillations(cells)) + len(cells)
                         + len(maps) + 1 + robustness + dense)
    assert {field for field, _, _ in jobs} >= {"teachers.deit_t", "stages.finetune", "bench",
                                                 "robustness.corruptions", "robustness",
                                                 "dense.stages.segment", "dense.stages.detect"}
    dense_args = [shlex.split(a) for f, _, a in jobs if f.startswith("dense.stages.")]
    assert all({'model.neck="adapter"', 'data.kind="ade20k"'} <= set(a) for a in dense_args
               if a[0] == "segment")
    assert {a[0] for a in dense_args} == {"segment", "detect"}
    shifts = {o for _, _, args in jobs for o in shlex.split(args) if o.startswith("shifts.")}
    assert {o.split("=")[0] for o in shifts} == {f"shifts.{name}" for name in SHIFTS}
    check.check_config(config, str(ROOT / "Snakefile"))


def test_paper_grid_lists_every_operator_of_the_registry():
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    assert config["operators"] == [o for o in OPERATORS if o != "softmax"]


def test_a_map_loss_for_an_operator_without_a_stochastic_map_is_refused_before_any_job():
    signed = next(o for o, cls in OPERATORS.items() if cls.map_kind != "stochastic")
    config = {**default_config(), "operators": [signed], "main_loss": "map"}
    del config["loss_grid"], config["dense"]
    with pytest.raises(ConfigError, match=f"stages.distill .*attn_map_ce.*'{signed}' has a"):
        check.check_config(config, str(ROOT / "Snakefile"))


def test_a_configfile_must_define_the_whole_grid():
    assert check.use_shipped_grid({}, [])                       # no --configfile: shipped grid
    assert check.use_shipped_grid({"results": "x"}, [])         # --config overrides go on top
    assert not check.use_shipped_grid(default_config(), ["mine.yaml"])
    partial = {k: v for k, v in default_config().items() if k not in ("datasets", "seeds")}
    with pytest.raises(ConfigError, match=re.escape("mine.yaml: no datasets, seeds (a "
                                                    "--configfile replaces the shipped grid")):
        check.use_shipped_grid(partial, ["mine.yaml"])


def test_dense_backbones_of_dotted_loss_names_round_trip():
    cell = grid.Cell("fashion_mnist", "t", "cpu96", "linear", "copy_mlp+distill", "map.v2", 1)
    job = dense_jobs.DenseJob("segment", "fashion_mnist", "t", "cpu96",
                              dense_jobs.backbone_label(cell))
    assert job.cell == cell and job.seed == 1 and job.key()["seed"] == 1
    teacher = dense_jobs.DenseJob("segment", "fashion_mnist", "t", "cpu96", "teacher.seed3")
    assert teacher.cell is None and teacher.seed == 3
    assert teacher.key() == {"task": "segment", "dataset": "fashion_mnist", "teacher": "t",
                             "size": "cpu96", "operator": "softmax", "init": "teacher",
                             "loss": "none", "seed": 3}


def test_every_dense_job_trains_its_heads_with_its_own_seed():
    """The seed axis seeds the heads of every dense job, the teacher's included (one backbone,
    a job per seed), over a seed the user's stage may set."""
    config = default_config()
    config["dense"] = {**config["dense"], "seeds": [0, 2]}
    config["dense"]["stages"] = {**config["dense"]["stages"], "detect": {
        **config["dense"]["stages"]["detect"], "run": {"seed": 7}}}
    jobs = dense_jobs.dense_jobs(config, grid.expand_grid(config))
    assert {j.backbone for j in jobs if j.cell is None} == {"teacher.seed0", "teacher.seed2"}
    for job in jobs:
        args = shlex.split(dense_jobs.dense_args(config, job, "m.safetensors", "scenes", "out"))
        assert f"run.seed={job.seed}" in args, (job, args)


def rel(paths):
    return {str(p.relative_to(deps.SRC_ROOT)) for p in paths}


def test_code_map_selects_registry_members():
    files = rel(deps.stage_sources("finetune", ["softmax", "focused"], [], ["fashion_mnist"]))
    assert {"linvit/attention/focused.py", "linvit/attention/softmax.py",
            "linvit/attention/base.py", "linvit/transfer/init.py", "linvit/train/loop.py",
            "linvit/data/fashion_mnist.py"} <= files
    assert not files & {"linvit/attention/linear.py", "linvit/attention/inline.py",
                        "linvit/data/cifar.py", "linvit/transfer/losses/attn_map_ce.py",
                        "linvit/report/figures.py"}
    distill = rel(deps.stage_sources("distill", ["softmax", "linear"], ["attn_map_ce"], []))
    assert "linvit/transfer/losses/attn_map_ce.py" in distill
    assert "linvit/transfer/losses/attn_out_mse.py" not in distill
    figures = rel(deps.stage_sources("figures"))
    assert "linvit/report/figures.py" in figures and not any("attention/" in f for f in figures)
    assert "linvit/report/figures.py" not in rel(deps.stage_sources("tables"))
    # computed once per selection, in any order, and each caller gets a list of its own
    again = deps.stage_sources("finetune", ("focused", "softmax"), (), {"fashion_mnist"})
    assert rel(again) == files
    again.clear()
    assert rel(deps.stage_sources("finetune", ["softmax", "focused"], [],
                                  ["fashion_mnist"])) == files


def test_a_code_stamp_lists_its_jobs_files_and_is_rewritten_only_when_they_change(
        tmp_path, monkeypatch):
    """A job's one code input: its files with their sha256; the same file for the same selection
    in any order, rewritten (a newer mtime, which reruns the job) when one of its files changes,
    left alone when another file does or nothing does."""
    import hashlib
    from functools import cache

    from linvit import code_digests

    def stamp(operators=("softmax", "focused")):
        deps.memoise_in(None)                           # a new workflow start
        return deps.code_stamp(tmp_path, "finetune", operators, [], ["fashion_mnist"])

    path = stamp()
    lines = path.read_text().splitlines()[1:]
    files = deps.stage_sources("finetune", ["softmax", "focused"], [], ["fashion_mnist"])
    # new: as old as its newest file (a lost .snakemake reruns nothing); the code as planned
    assert path.stat().st_mtime_ns == max(f.stat().st_mtime_ns for f in files)
    assert code_digests.digest_mismatches(path.read_text()) == []
    assert [line.split("  ")[1] for line in lines] == [str(f.relative_to(deps.SRC_ROOT))
                                                      for f in files]
    for line in lines:
        digest, name = line.split("  ")
        assert digest == hashlib.sha256((deps.SRC_ROOT / name).read_bytes()).hexdigest(), name
    os.utime(path, ns=(0, 0))
    assert stamp(["focused", "softmax", "focused"]) == path and path.stat().st_mtime_ns == 0
    digests = code_digests.file_digests()
    monkeypatch.setattr(code_digests, "file_digests", cache(
        lambda: {**digests, "linvit/attention/linear.py": "0" * 64}))
    assert stamp() == path and path.stat().st_mtime_ns == 0       # not one of its files
    monkeypatch.setattr(code_digests, "file_digests", cache(
        lambda: {**digests, "linvit/attention/focused.py": "0" * 64}))
    assert stamp() == path and path.stat().st_mtime_ns > 0
    assert f"{'0' * 64}  linvit/attention/focused.py" in path.read_text().splitlines()
    # a job planned with that stamp refuses to run the real focused.py
    assert code_digests.digest_mismatches(path.read_text()) == ["linvit/attention/focused.py"]
    other = stamp(["softmax", "linear"])
    assert other != path and other.parent != path.parent     # a folder each (_write_stamp: why)
    deps.memoise_in(None)


def test_operators_and_losses_each_have_their_own_file():
    members = deps.registry_members()
    for kind in ("operator", "loss"):
        assert len(set(members[kind].values())) == len(members[kind]), kind
    # entries sharing a file (cifar10/cifar100) keep it when either is selected
    assert "linvit/data/cifar.py" in rel(deps.stage_sources("finetune", datasets=["cifar100"]))


def test_ci_and_cell_formatting():
    mean, ci, n = summarize([70.0, 72.0, 74.0])
    assert (mean, n) == (72.0, 3) and ci == pytest.approx(4.303 * 2 / 3 ** 0.5)
    frame = pd.DataFrame({"status": ["ok", "ok", "failed"], "top1": [70.0, 72.0, None]})
    assert format_cell(frame) == "71.00 ± 12.71 (2/3 seeds)"
    assert format_cell(pd.DataFrame({"status": ["failed"], "top1": [None]})) == "failed"
    assert format_cell(pd.DataFrame({"status": ["missing"], "top1": [None]})) == "missing"


def record(kind, key, top1=None, status="ok"):
    metrics = {"top1": top1, "top5": 99.0, "loss": 0.5, "train_time_s": 10.0, "epochs": 1}
    return {"kind": kind, "key": key, "run_dir": "x", "status": status,
            "metrics": metrics if status == "ok" else {}, "config": {"optim": {"lr": 0.001}},
            "error": "" if status == "ok" else "boom"}


def test_tables_show_missing_and_failed_cells_and_match_known_output():
    cells = [{"dataset": "d", "teacher": "t", "size": "s", "operator": op, "init": init,
              "loss": "none", "seed": 0}
             for op in ("linear", "focused") for init in ("random", "copy_mlp")]
    records = [record("teacher", {"dataset": "d", "teacher": "t", "size": "s"}, 80.0),
               record("cell", cells[0], 61.5), record("cell", cells[1], 70.25),
               record("cell", cells[2], status="failed")]
    results = results_frame(records, cells)
    assert list(results["status"]) == ["ok", "ok", "ok", "failed", "missing"]
    assert results.loc[1, "config.optim.lr"] == 0.001           # every row carries its config
    orders = {"init": ["random", "copy_mlp"], "operator": ["linear", "focused", "softmax"]}
    table = main_table(results, orders, "out")
    assert to_markdown(table) == (
        "| dataset | teacher | size | init | linear | focused | softmax |\n"
        "|---|---|---|---|---:|---:|---:|\n"
        "| d | t | s | teacher (pretrained) |  |  | 80.00 |\n"
        "| d | t | s | random | 61.50 | failed |  |\n"
        "| d | t | s | copy_mlp | 70.25 | missing |  |\n")
    latex = to_latex(table, "Top-1 & more")
    assert r"\caption{Top-1 \& more}" in latex
    assert r"d & t & s & random & 61.50 & failed &  \\" in latex


def test_robustness_folders_mirror_the_models_they_score():
    cell = grid.Cell("d", "t", "s", "linear", "copy_mlp", "none", 0)
    folder = "res/robustness/cells/d/t/s/linear/copy_mlp/none/seed0"
    assert grid.robustness_dir("res", "d", "t", "s", cell) == folder
    assert grid.robustness_dir("res", "d", "t", "s") == "res/robustness/teachers/d/t/s"


def teacher_axis_config(tmp_path) -> dict:
    """The default grid with three teachers: pretrained at the student size, pretrained wider and
    selected down, and imported timm weights given a head by a linear probe."""
    weights = tmp_path / "deit.safetensors"
    weights.write_bytes(b"")
    config = {**default_config(), "operators": ["linear"], "loss_grid": None, "dense": None,
              "teachers": {"pretrain": {"source": "pretrain"},
                           "wide": {"source": "pretrain", "size": "cpu192",
                                    "students": ["cpu96"]},
                           "deit": {"source": "timm", "size": "cpu96", "file": str(weights),
                                    "headless": True, "layout": "mocov3",
                                    "probe": {"mode": "linear",
                                              "optim": {"epochs": 1, "warmup_epochs": 0}}}}}
    return {k: v for k, v in config.items() if v is not None}


def test_teacher_axis_makes_selects_and_probes_each_teacher(tmp_path, monkeypatch):
    import linvit.config
    config = teacher_axis_config(tmp_path)
    cells = grid.expand_grid(config)
    per_teacher = {t: [c for c in cells if c.teacher == t] for t in config["teachers"]}
    assert {t: len(c) for t, c in per_teacher.items()} == {t: len(cells) // 3 for t in per_teacher}
    assert {c.size for c in cells} == {"cpu96"}
    # the wide teacher is made at its own size, then cut down for its cpu96 students
    models = grid.teachers(config, cells)
    assert models.index(("fashion_mnist", "wide", "cpu192")) < \
        models.index(("fashion_mnist", "wide", "cpu96"))
    stages = {(t, s): grid.teacher_stage(config, t, s) for _, t, s in models}
    assert stages == {("pretrain", "cpu96"): "pretrain", ("wide", "cpu192"): "pretrain",
                      ("wide", "cpu96"): "select", ("deit", "cpu96"): "probe"}
    assert grid.imports(config, cells) == [("fashion_mnist", "deit", "cpu96")]
    assert grid.teacher_source("R", config, "fashion_mnist", "wide", "cpu96") == \
        "R/teachers/fashion_mnist/wide/cpu192"
    assert grid.teacher_source("R", config, "fashion_mnist", "deit", "cpu96") == \
        "R/imports/fashion_mnist/deit/cpu96"
    select = shlex.split(grid.teacher_args(config, "fashion_mnist", "wide", "cpu96", "BIG", "O"))
    assert select[0] == "select" and {"teacher=\"BIG\"", "size=\"cpu96\""} <= set(select)
    probe = shlex.split(grid.teacher_args(config, "fashion_mnist", "deit", "cpu96", "IMP", "O"))
    assert probe[0] == "probe" and {"teacher=\"IMP\"", "mode=\"linear\""} <= set(probe)
    imported = shlex.split(grid.import_args(config, "fashion_mnist", "deit", "O"))
    assert {"headless=true", "reset_head=false", "layout=\"mocov3\""} <= set(imported)
    # every job of the axis is built into its stage's config before any runs
    built, load = [], linvit.config.load_config
    monkeypatch.setattr(linvit.config, "load_config",
                        lambda cls, path, overrides: built.append(cls.__name__)
                        or load(cls, path, overrides))
    check.check_config(config, str(ROOT / "Snakefile"))
    assert {n: built.count(n) for n in ("PretrainConfig", "SelectConfig", "ImportConfig",
                                        "ProbeConfig")} == {"PretrainConfig": 2, "SelectConfig": 1,
                                                            "ImportConfig": 1, "ProbeConfig": 1}
    assert grid.grid_document(config, cells)["orders"]["teacher"] == ["pretrain", "wide", "deit"]


def test_a_stored_config_verdict_holds_only_for_its_config_code_and_files(tmp_path, monkeypatch):
    """A workflow start reuses the last successful check (linvit.workflow.memo) instead of
    building every job's config again; another config or code, or a file the check found gone
    since, is checked anew, and a failed check is not stored."""
    import linvit.config
    from linvit.workflow import memo
    config, snakefile = teacher_axis_config(tmp_path), str(ROOT / "Snakefile")
    built, load = [], linvit.config.load_config
    monkeypatch.setattr(linvit.config, "load_config",
                        lambda cls, path, overrides: built.append(cls)
                        or load(cls, path, overrides))

    def checked(cfg) -> bool:
        """Whether check_config built the jobs' configs (rather than reuse a verdict)."""
        before = len(built)
        check.check_config(cfg, snakefile, tmp_path / "memo")
        return len(built) > before

    assert checked(config) and not checked(config)
    assert not checked(yaml.safe_load(yaml.safe_dump(config)))        # equal, not the same dict
    assert checked({**config, "seeds": [*config["seeds"], 7]})
    assert checked(config)                                # one entry: the last verdict stored
    monkeypatch.setattr(memo, "code_version", lambda: "edited")
    assert checked(config) and not checked(config)
    Path(config["teachers"]["deit"]["file"]).unlink()
    for _ in range(2):
        with pytest.raises(ConfigError, match="teachers.deit.file: file not found"):
            checked(config)
    # a file a job's config named (checkpoints: the stand-in file) counts as well
    del config["teachers"]["deit"]
    stand_in = tmp_path / "stand-in"
    stand_in.write_text("")
    check.check_config(config, str(stand_in), tmp_path / "memo")
    stand_in.unlink()
    with pytest.raises(ConfigError, match="file not found: .*stand-in"):
        check.check_config(config, str(stand_in), tmp_path / "memo")
    # an entry of the right key but another shape (edited by hand) is checked anew
    entry = tmp_path / "memo" / "config_check.json"
    entry.write_text(entry.read_text().replace('"files"', '"other"'))
    assert checked(config)


def test_a_memo_key_ignores_key_order_but_not_types():
    from linvit.workflow.memo import key_of
    a = {"x": [1, {"b": 2.0, "a": None}], 1: "one"}            # keys of mixed types are fine
    assert key_of(a) == key_of({1: "one", "x": [1, {"a": None, "b": 2.0}]})
    assert key_of(a) != key_of({"1": "one", "x": [1, {"b": 2.0, "a": None}]})
    assert key_of(a) != key_of({1: "one", "x": [1, {"b": 2, "a": None}]})
    assert key_of(a) != key_of({1: "one", "x": [{"b": 2.0, "a": None}, 1]})


def test_a_workflow_start_with_stored_answers_does_not_import_torch(tmp_path):
    """What every Snakemake start evaluates, the config check and the code map, is read back from
    linvit.workflow.memo without importing the registries (and so torch) or parsing the package
    (~5 s per start), and the code map read back is the one the registries and the imports give."""
    import json
    import subprocess
    import sys
    (tmp_path / "config.json").write_text(json.dumps(default_config()))
    script = f"""
import json, sys
from pathlib import Path
from linvit.workflow import check, deps
parsed, parse = [], deps._imports
deps._imports = lambda path: parsed.append(path) or parse(path)
memo = Path({str(tmp_path / "memo")!r})
deps.memoise_in(memo)
check.check_config(json.loads(Path({str(tmp_path / "config.json")!r}).read_text()),
                  {str(ROOT / "Snakefile")!r}, memo)
files = deps.stage_sources("finetune", ["linear", "gla"], ["attn_map_ce"], ["fashion_mnist"])
print(json.dumps([sorted(m for m in ("torch", "linvit.attention") if m in sys.modules),
                  bool(parsed), deps.registry_names("operator"), [str(f) for f in files]]))
"""

    def start():
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(deps.SRC_ROOT)})
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout)

    imported, parsed, names, files = start()
    assert imported == ["linvit.attention", "torch"] and parsed and names == list(OPERATORS)
    assert files == [str(f) for f in deps.stage_sources("finetune", ["linear", "gla"],
                                                        ["attn_map_ce"], ["fashion_mnist"])]
    assert start() == [[], False, names, files]           # nothing imported, no file parsed


def test_by_teacher_table_puts_teachers_side_by_side():
    from linvit.report.tables import axis_table
    records = [record("cell", {"dataset": "d", "teacher": t, "size": "s", "operator": "linear",
                               "init": "copy_mlp", "loss": "none", "seed": seed}, top1)
               for t, seed, top1 in [("sup", 0, 70.0), ("sup", 1, 72.0), ("ssl", 0, 60.0)]]
    records.append(record("teacher", {"dataset": "d", "teacher": "ssl", "size": "s",
                                      "stage": "select"}, 50.0))
    results = results_frame(records)
    orders = {"teacher": ["sup", "ssl"], "init": ["copy_mlp"], "operator": ["linear"]}
    table = axis_table(results, orders, "teacher", "out")
    assert list(table.columns) == ["sup", "ssl"]
    assert table.loc[("d", "s", "linear", "copy_mlp"), "ssl"] == "60.00"
    assert table.loc[("d", "s", "linear", "copy_mlp"), "sup"].startswith("71.00")
    main = main_table(results, orders, "out")
    assert ("d", "ssl", "s", "teacher (selected)") in main.index


def test_adapter_interactions_that_do_not_fit_a_dense_backbone_are_refused_before_any_job():
    """The dense stage config cannot know its backbone's depth; check_config does, per job."""
    config = default_config()
    config["dense"] = {**config["dense"], "neck": "adapter", "adapter": {"interactions": [[0, 2]]}}
    with pytest.raises(ConfigError,
                       match=r"dense.adapter \(job dense/.*end at block 2, the ViT has 6 blocks"):
        check.check_config(config, str(ROOT / "Snakefile"))
    config["dense"]["adapter"] = {"interactions": [[0, 2], [3, 5]]}
    check.check_config(config, str(ROOT / "Snakefile"))


def test_the_report_has_the_dense_section_when_asked_or_once_it_exists(tmp_path):
    config = default_config()
    results = str(tmp_path)
    assert dense_jobs.dense_in_report(config, results) == []
    assert dense_jobs.dense_in_report({**config, "dense": {**config["dense"], "in_all": True}},
                                results) == [f"{results}/dense.md"]
    (tmp_path / "dense.md").write_text("## Dense tasks\n")
    assert dense_jobs.dense_in_report(config, results) == [f"{results}/dense.md"]
    assert dense_jobs.dense_in_report({**config, "dense": None}, results) == []


def test_dense_seeds_beyond_the_grid_s_add_backbone_cells_for_the_dense_sub_grid_only():
    config = {**default_config(), "seeds": [0]}
    config["dense"] = {**config["dense"], "operators": ["linear"], "seeds": [0, 1]}
    cells = grid.expand_grid(config)
    extra = dense_jobs.dense_cells(config, cells)
    assert {(c.operator, c.init, c.seed) for c in extra} == {
        ("linear", init, 1) for init in config["dense"]["strategies"]}
    assert not set(extra) & set(cells)
    finetunes = {where for field, where, _ in check.job_arguments(config, str(ROOT / "Snakefile"))
                 if field == "stages.finetune"}
    assert {grid.cell_dir("", c).lstrip("/") for c in extra} <= finetunes
    backbones = {j.backbone for j in dense_jobs.dense_jobs(config, cells) if j.task == "segment"}
    assert backbones == {"teacher.seed0", "teacher.seed1"} | {
        dense_jobs.backbone_label(c) for c in extra} | {
        dense_jobs.backbone_label(c) for c in cells if c.operator == "linear" and c.seed == 0
        and c.init in config["dense"]["strategies"] and c.loss in ("none", config["main_loss"])}


def test_an_axis_table_exists_only_where_its_axis_has_two_values(tmp_path):
    config = default_config()
    assert grid.report_tables(config, grid.expand_grid(config)) == [
        "main", "claims", "time_to_target", "loss_design"]
    wide = {**config, "sizes": ["cpu96", "cpu192"], "loss_grid": None}
    assert grid.report_tables(wide, grid.expand_grid(wide)) == [
        "main", "claims", "time_to_target", "by_size"]
    taught = teacher_axis_config(tmp_path)
    assert "by_teacher" in grid.report_tables(taught, grid.expand_grid(taught))
    assert grid.grid_document(taught, grid.expand_grid(taught))["tables"] == \
        grid.report_tables(taught, grid.expand_grid(taught))


def test_a_dataset_overrides_the_grids_stages_for_its_own_jobs():
    config = default_config()
    config["datasets"] = {"fashion_mnist": {"dataset": "fashion_mnist"},
                          "digits": {"dataset": "mnist5k",
                                     "stages": {"teacher": {"optim": {"epochs": 9}},
                                                "finetune": {"data": {"train_subset": 300}}}}}
    words = {d: shlex.split(grid.teacher_args(config, d, "pretrain", "cpu96", None, "O"))
             for d in config["datasets"]}
    assert "optim.epochs=9" in words["digits"] and "optim.epochs=2" in words["fashion_mnist"]
    assert not any(w.startswith("data.stages") for w in words["digits"])
    cells = {c.dataset: c for c in grid.expand_grid(config)}
    digits = shlex.split(grid.finetune_args(config, cells["digits"], "T", "D", "O"))
    assert "data.train_subset=300" in digits and "optim.epochs=1" in digits
    own = config["stages"]["finetune"]["data"]["train_subset"]
    assert f"data.train_subset={own}" in shlex.split(
        grid.finetune_args(config, cells["fashion_mnist"], "T", "D", "O"))
