"""Grid designs beyond the full factorial: axis groups varied one at a time (`axis_groups`), more
seeds for part of the grid (`seed_grid`), and a jobs folder shared between grids (`jobs_folder`,
linvit.workflow.shared), each counted from its config and checked before anything runs."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from linvit.errors import ConfigError
from linvit.report.record import made_by
from linvit.workflow import check, grid
from linvit.workflow.axes import NONE, parse
from linvit.workflow.jobs import KINDS
from linvit.workflow.plan import plan
from linvit.workflow.schema import NAME_PATTERN
from linvit.workflow.shared import check_not_foreign, digest

from grid_configs import ROOT, default_config

AXES = {"start": {"stage": "distill", "field": "distill.attn_init",
                  "values": ["random", "teacher"]},
        "e2e": {"stage": "distill", "field": "distill.e2e_epochs", "values": {"no": 0, "kd": 2}},
        "d_epochs": {"stage": "distill", "field": "optim.epochs", "values": [5, 1, 15]},
        "ft_lr": {"stage": "finetune", "field": "optim.lr", "values": {"a": 1e-3, "b": 5e-4}}}
GROUPS = [["start", "e2e"], ["d_epochs"], ["ft_lr"]]


def expected_combos(axes: dict, groups: list[list[str]], reached: dict) -> set[tuple]:
    """Per group, its axes crossed and the others at their first value; `none` where a stage
    is not reached. Written from the definition, not from the code under test."""
    def labels(name):
        spec = axes[name]
        values = spec["values"]
        return [str(v) for v in values] if isinstance(values, list) else list(values)
    out = set()
    for group in groups:
        choices = [[(n, lab) for lab in (labels(n) if n in group else labels(n)[:1])]
                   if reached[axes[n]["stage"]] else [(n, NONE)] for n in axes]
        out |= set(itertools.product(*choices))
    return out


@pytest.mark.parametrize("groups", [GROUPS, [["start"], ["e2e"], ["d_epochs"], ["ft_lr"]],
                                    [["start", "e2e", "d_epochs", "ft_lr"]], None])
@pytest.mark.parametrize("stages", [{"distill": True, "finetune": True},
                                    {"distill": False, "finetune": True}])
def test_axis_groups_vary_one_group_at_a_time_around_the_first_values(groups, stages):
    config = {"axes": AXES, **({"axis_groups": groups} if groups else {})}
    axes = parse(config, NAME_PATTERN)
    found = axes.combinations({"teacher": True, **stages})
    assert len(found) == len(set(found))
    assert set(found) == expected_combos(AXES, groups or [list(AXES)], {"teacher": True, **stages})
    # the baseline comes first: the attention-map panel and the tables start there
    assert found[0] == tuple((n, NONE if not stages.get(AXES[n]["stage"]) else
                              str(list(AXES[n]["values"])[0])) for n in AXES)


def test_axis_groups_compute_the_shared_baseline_once_in_the_plan():
    config = {**default_config(), "axes": AXES, "axis_groups": GROUPS}
    crossed = {**default_config(), "axes": AXES}
    distilled = [c for c in plan(config).cells if c.needs_distill]
    per_student = len({c.axes for c in distilled})
    assert per_student == 2 * 2 + (3 - 1) + (2 - 1)          # 7 combinations, not 24
    assert len({c.axes for c in plan(crossed).cells if c.needs_distill}) == 24
    # a strategy without distillation sees only the finetune group: ft_lr's two values
    assert len({c.axes for c in plan(config).cells if not c.needs_distill}) == 2


@pytest.mark.parametrize("groups, message", [
    ([["start", "e2e"], ["d_epochs"], ["ft_lr"], ["nope"]], "'nope' is not an axis"),
    ([["start", "e2e"], ["e2e", "d_epochs"], ["ft_lr"]], "'e2e' is in two groups"),
    ([["start", "e2e"], ["ft_lr"]], "axis 'd_epochs' is in no group"),
])
def test_axis_groups_that_miss_or_repeat_an_axis_are_refused(groups, message):
    with pytest.raises(ConfigError, match=message):
        parse({"axes": AXES, "axis_groups": groups}, NAME_PATTERN)


def seed_entry(config: dict) -> dict:
    return {"seeds": [7, 8], "operators": [config["operators"][-1], "softmax"],
            "strategies": ["copy_mlp", "copy_all", "copy_mlp+distill"]}


def test_a_seed_grid_adds_its_seeds_to_its_part_of_the_grid_only():
    config = default_config()
    entry = seed_entry(config)
    base = plan(config).cells
    cells = plan({**config, "seed_grid": [entry]}).cells
    added = [c for c in cells if c not in base]
    assert cells[:len(base)] == base
    op = config["operators"][-1]
    expected = {(d, op, s, seed) for d in config["datasets"] for seed in entry["seeds"]
                for s in entry["strategies"] if s in config["strategies"]}
    expected |= {(d, "softmax", s, seed) for d in config["datasets"] for seed in entry["seeds"]
                 for s in entry["strategies"] if s in config["reference_strategies"]}
    assert {(c.dataset, c.operator, c.init, c.seed) for c in added} == expected
    assert all(c.loss in (config["main_loss"], grid.NO_LOSS) for c in added)
    # replicated distillations: the new seeds get their own
    if grid.replicated(config):
        seeds = {d.seed for d in plan({**config, "seed_grid": [entry]}).distilled}
        assert set(entry["seeds"]) <= seeds


@pytest.mark.parametrize("change, message", [
    ({"operators": ["nope"]}, r"seed_grid\[0\].operators: 'nope' is not one of"),
    ({"datasets": ["imagenet"]}, r"seed_grid\[0\].datasets: 'imagenet'"),
    ({"strategies": ["mimetic"]}, r"seed_grid\[0\].strategies: 'mimetic'"),
    ({"operators": ["softmax"], "strategies": ["copy_mlp"]}, r"seed_grid\[0\]: adds no cell"),
])
def test_a_seed_grid_naming_what_the_grid_lacks_is_refused(change, message):
    config = default_config()
    config["seed_grid"] = [{**seed_entry(config), **change}]
    with pytest.raises(ConfigError, match=message):
        grid.check_seed_grid(config)


def test_the_shared_kinds_go_to_the_jobs_folder_and_the_rest_to_results():
    config = {**default_config(), "results": "out/grid b", "jobs_folder": "out/jobs"}
    jobs = plan(config)
    assert {k.name for k in KINDS.values() if k.shared} == {
        "teacher", "import", "distill", "cell", "select_cell"}
    for job in jobs.jobs:
        root = "out/jobs" if job.kind.shared else "out/grid b"
        assert job.folder.startswith(root + "/") and job.log.startswith(root + "/logs/")
        assert jobs.pattern(job.kind.name).startswith(root + "/")
        if job.kind.shared:       # what a shared job reads (teacher, distillation): shared too
            assert all(str(i).startswith("out/jobs/") for i in job.inputs
                       if str(i).startswith("out")), job.inputs
    # the same grid without the field keeps everything in results, as before
    assert all(j.folder.startswith("out/grid b/") for j in
               plan({**config, "jobs_folder": None}).jobs)


def write_record(job, grid_results: str, command: str) -> None:
    Path(job.output).parent.mkdir(parents=True, exist_ok=True)
    Path(job.output).write_text(json.dumps({"kind": job.kind.record_kind, "status": "ok",
                                            "made_by": made_by(grid_results, digest(command))}))


def test_a_job_another_grid_made_with_other_settings_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = {**default_config(), "results": "a", "jobs_folder": "jobs"}
    teacher = plan(config).of("teacher")[0]
    write_record(teacher, "a", teacher.command())
    other = {**config, "results": "b"}
    check_not_foreign(plan(other))                       # same command: shared, no complaint
    longer = {**other, "stages": {**other["stages"], "teacher": {
        **other["stages"]["teacher"], "optim": {**other["stages"]["teacher"]["optim"],
                                                "epochs": 99}}}}
    with pytest.raises(ConfigError, match=r"made by the grid of 'a' with other settings"):
        check_not_foreign(plan(longer))
    check_not_foreign(plan({**longer, "results": "a"}))  # its own grid reruns it as usual


def test_the_schema_and_check_accept_the_fields_and_refuse_a_bad_jobs_folder():
    config = {**default_config(), "jobs_folder": "results/{x}"}
    with pytest.raises(ConfigError, match="jobs_folder: 'results/{x}' must be"):
        check.check_names(config)
    check.check_names({**default_config(), "jobs_folder": "results/shared"})
    schema = (ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text()
    for field in ("jobs_folder:", "axis_groups:", "seed_grid:"):
        assert f"\n  {field}" in schema


def test_the_tables_fill_a_row_an_axis_does_not_reach_into_the_design_s_combinations_only(
        tmp_path):
    """With axis groups, a cell no distill axis reaches (copy_mlp) stands in each combination
    of the design, not in the whole cross product of the axes' values."""
    import pandas as pd

    from linvit.report.grid import read_grid

    config = {**default_config(), "axes": AXES, "axis_groups": GROUPS}
    cells = plan(config).cells
    (tmp_path / "grid.json").write_text(json.dumps(grid.grid_document(config, cells)))
    g = read_grid(tmp_path / "grid.json")
    design = expected_combos(AXES, GROUPS, {"teacher": True, "distill": True, "finetune": True})
    row = {"kind": "cell", "init": "copy_mlp", "loss": "none", "start": NONE, "e2e": NONE,
           "d_epochs": NONE, "ft_lr": "a", "top1": 50.0}
    filled = g.complete(pd.DataFrame([row]))
    found = {tuple(zip(AXES, r)) for r in filled[list(AXES)].astype(str).to_numpy()}
    assert found == {c for c in design if dict(c)["ft_lr"] == "a"}
    assert len(filled) == len(found) == 2 * 2 + (3 - 1)
    crossed = {**config, "axis_groups": None}
    (tmp_path / "full.json").write_text(json.dumps(grid.grid_document(crossed, cells)))
    assert len(read_grid(tmp_path / "full.json").complete(pd.DataFrame([row]))) == 2 * 2 * 3


def test_a_grid_whose_results_another_grid_uses_as_its_jobs_folder_is_checked_too(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sharer = {**default_config(), "results": "b", "jobs_folder": "a"}
    teacher = plan(sharer).of("teacher")[0]
    write_record(teacher, "b", teacher.command())       # b made a's teacher with its settings
    owner = {**default_config(), "results": "./a"}       # a itself, spelt another way
    assert plan(owner).of("teacher")[0].output == teacher.output.replace("a/", "./a/", 1)
    check_not_foreign(plan({**owner, "results": "a"}))  # the same settings: nothing to refuse
    epochs = {**owner, "stages": {**owner["stages"], "teacher": {
        **owner["stages"]["teacher"], "optim": {**owner["stages"]["teacher"]["optim"],
                                                "epochs": 99}}}}
    with pytest.raises(ConfigError, match=r"made by the grid of 'b'"):
        check_not_foreign(plan(epochs))
    # b, spelt another way, with its settings changed since: its own job, rerun as usual
    write_record(teacher, "./b", "pretrain -o a/teachers/old --rerun optim.epochs=1")
    check_not_foreign(plan({**sharer, "results": "b/"}))
