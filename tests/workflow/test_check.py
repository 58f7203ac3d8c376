"""The workflow config check: names, registries, teachers, every job's config built before any job
runs, and the stored verdict (linvit.workflow.memo)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from linvit.attention import OPERATORS
from linvit.errors import ConfigError
from linvit.robustness.shifts import SHIFTS
from linvit.workflow import check, dense_jobs, grid

from grid_configs import ROOT, default_config, teacher_axis_config

NAME_RULE = f"allowed: {check.NAME_PATTERN}"


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

    ({"losses": {"out": {"attn_out_mse": 1.0}, "map": {"attn_map_ce": -1.0}},
      "loss_grid": {"operators": ["linear"], "strategies": ["copy_mlp+distill"],
                    "losses": ["map"]}},
     "stages.distill / losses.map (job distill/fashion_mnist/pretrain/cpu96/linear/map): "
     "distill.losses.attn_map_ce: must be >= 0"),
    ({"operators": ["focused", "inline"], "reference_strategies": [], "loss_grid": None,
      "dense": None,
      "stages": {"finetune": {"model": {"operator_options": {"focusing_factor": 2.0}}}}},
     "stages.finetune (job cells/fashion_mnist/pretrain/cpu96/inline/random/none/seed0): "
     "model.operator_options"),
    ({"bench": {"tokens": [15]}}, "bench (job bench): tokens[0]: 15 is not a positive square"),
    # what every job would refuse, refused once at plan time
    ({"robustness": {"shifts": {"imagenet_a": "/data/imagenet-a"}}},
     "robustness.shifts: ImageNet shift sets score a 1000-class ImageNet model; "
     "datasets.fashion_mnist (fashion_mnist) has 10 classes"),
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


def test_the_check_applies_the_schema_s_own_name_rule_and_grid_keys():
    assert check.NAME_PATTERN == r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
    assert check.GRID_KEYS == ("datasets", "sizes", "operators", "strategies", "seeds", "losses",
                               "main_loss")


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
                      "DistillConfig": len(grid.distillations(config, cells)),
                      "FinetuneConfig": len(cells) + len(dense_jobs.dense_cells(config, cells)),
                      "ScenesConfig": 1, "DenseConfig": len(dense_jobs.dense_runs(config, cells)),
                      "BenchConfig": 1,
                      "MapsConfig": 1 + len(grid.attention_students(config, cells)),
                      "CorruptConfig": len(config["datasets"]),
                      "RobustnessConfig": len(grid.teachers(config, cells)) + len(cells)}
    seeds = {o for _, overrides in built for o in overrides if o.startswith("init.strategy=")}
    assert len(seeds) == len(config["strategies"])
    # an operator option that suits one operator of the grid is fine when only it gets it
    focused = {**default_config(), "operators": ["focused"], "reference_strategies": [],
               "stages": {"finetune": {"model": {"operator_options": {"focusing_factor": 2.0}}}}}
    del focused["dense"]
    check.check_config(focused, str(ROOT / "Snakefile"))


def test_check_config_covers_the_paper_grid():
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    jobs = check.job_arguments(config, str(ROOT / "Snakefile"))
    cells = grid.expand_grid(config)
    maps = [grid.MAPS_TEACHER, *grid.attention_students(config, cells)]
    assert len(maps) == 1 + len(config["operators"])
    robustness = len(config["datasets"]) + len(grid.teachers(config, cells)) + len(cells)
    dense = 1 + len(dense_jobs.dense_runs(config, cells))            # scenes + the dense jobs
    assert len(jobs) == (len(grid.imports(config, cells)) + len(grid.teachers(config, cells))
                         + len(grid.distillations(config, cells)) + len(cells)
                         + len(maps) + 1 + robustness + dense)
    assert {field for field, *_ in jobs} >= {"teachers.deit_t", "stages.finetune", "bench",
                                                 "robustness.corruptions", "robustness",
                                                 "dense.stages.segment", "dense.stages.detect"}
    dense_args = [(stage, set(words)) for f, _, stage, words in jobs
                  if f.startswith("dense.stages.")]
    assert all({'model.neck="adapter"', 'data.kind="ade20k"'} <= words
               for stage, words in dense_args if stage == "segment")
    assert {stage for stage, _ in dense_args} == {"segment", "detect"}
    shifts = {o for _, _, _, words in jobs for o in words if o.startswith("shifts.")}
    assert {o.split("=")[0] for o in shifts} == {f"shifts.{name}" for name in SHIFTS}
    check.check_config(config, str(ROOT / "Snakefile"))


def test_paper_grid_lists_every_operator_of_the_registry():
    config = yaml.safe_load((ROOT / "config" / "paper.yaml").read_text())
    assert config["operators"] == [o for o in OPERATORS if o != "softmax"]


def test_a_map_loss_for_an_operator_without_a_stochastic_map_is_refused_before_any_job():
    signed = next(o for o, cls in OPERATORS.items() if cls.map_kind != "stochastic")
    config = {**default_config(), "operators": [signed], "main_loss": "map",
              "losses": {"map": {"attn_map_ce": 1.0}}}
    del config["dense"]
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


def test_adapter_interactions_that_do_not_fit_a_dense_backbone_are_refused_before_any_job():
    """The dense stage config cannot know its backbone's depth; check_config does, per job."""
    config = default_config()
    config["dense"] = {**config["dense"], "neck": "adapter", "adapter": {"interactions": [[0, 2]]}}
    with pytest.raises(ConfigError,
                       match=r"dense.adapter \(job dense/.*end at block 2, the ViT has 6 blocks"):
        check.check_config(config, str(ROOT / "Snakefile"))
    config["dense"]["adapter"] = {"interactions": [[0, 2], [3, 5]]}
    check.check_config(config, str(ROOT / "Snakefile"))


def test_a_teacher_file_its_import_job_would_refuse_is_refused_by_the_check(tmp_path):
    """The check runs the import each job runs: a file that is not a checkpoint, or one with NaN
    weights, fails the plan, not the jobs."""
    import torch

    config = teacher_axis_config(tmp_path)
    check.check_config(config, str(ROOT / "Snakefile"))
    deit = config["teachers"]["deit"]
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="teachers.deit.file: .*broken.pth"):
        check.check_config({**config, "teachers": {**config["teachers"],
                                                   "deit": {**deit, "file": str(broken)}}},
                           str(ROOT / "Snakefile"))
    evil = {**deit, "layout": "evil"}            # named, before the import reads the file
    with pytest.raises(ConfigError, match="teachers.deit.layout: 'evil' is not one of: timm"):
        check.check_config({**config, "teachers": {**config["teachers"], "deit": evil}},
                           str(ROOT / "Snakefile"))
    state = torch.load(deit["file"])
    next(iter(state["state_dict"].values())).fill_(float("nan"))
    torch.save(state, tmp_path / "nan.pth")
    nan = {**deit, "file": str(tmp_path / "nan.pth")}
    with pytest.raises(ConfigError, match="teachers.deit.file: .*non-finite|NaN"):
        check.check_config({**config, "teachers": {**config["teachers"], "deit": nan}},
                           str(ROOT / "Snakefile"))
