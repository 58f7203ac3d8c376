"""Workflow tests that need no shared run (test_snakemake.py's tiny grid): the paper DAG, config
validation before any job, paths and names a shell would misread, and the teacher axis run on a
small grid of its own. Apart from test_snakemake.py so that the two test processes can take them
while one of them runs the tiny grid."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_snakemake import (
    HOSTILE,
    copy_project,
    small_config,
    snakemake,
    tiny_config,
)

pytestmark = pytest.mark.slow


def test_paper_dag_has_the_full_grid(tmp_path):
    path = copy_project(tmp_path)
    run = snakemake(path, "-n", "--configfile", "config/paper.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    paper = yaml.safe_load((path / "config" / "paper.yaml").read_text())
    teachers = paper["teachers"]
    # (teacher, student size) pairs: a teacher serves its `students`, by default its own size
    pairs = sum(len(t.get("students", [t["size"]])) for t in teachers.values())
    models = pairs                                       # teacher models: one per pair ...
    imports = sum(1 for t in teachers.values() if t.get("probe"))   # ... an import before a probe
    ops, seeds = len(paper["operators"]), len(paper["seeds"])
    sub = paper["loss_grid"]
    sub_cells = pairs * len(sub["operators"]) * len(sub["strategies"]) * len(sub["losses"]) * seeds
    references = pairs * len(paper["reference_strategies"]) * seeds     # softmax rows
    cells = pairs * ops * len(paper["strategies"]) * seeds + references + sub_cells
    distills = pairs * ops + pairs * len(sub["operators"]) * len(sub["losses"])
    # grid_document, collect, tables, figures, attention_figure, bench, report, all,
    # robustness_report
    report_jobs = 9
    maps_jobs = 1 + ops   # the first teacher's attention maps and its students' (main loss)
    robustness_jobs = len(paper["datasets"]) + models + cells    # corrupt, teachers, cells
    total = int(re.search(r"^total\s+(\d+)$", run.stdout, re.M).group(1))
    assert total == (imports + models + distills + cells + report_jobs + maps_jobs
                     + robustness_jobs)
    assert re.search(rf"^teacher\s+{models}$", run.stdout, re.M)
    assert re.search(rf"^import_teacher\s+{imports}$", run.stdout, re.M)
    assert re.search(rf"^robustness_cell\s+{cells}$", run.stdout, re.M)
    assert re.search(rf"^attention_maps\s+{maps_jobs}$", run.stdout, re.M)
    assert re.search(rf"^finetune\s+{cells}$", run.stdout, re.M)
    # the dry run says what the grid costs (linvit plan's total)
    assert re.search(r"^linvit plan: \d+ costed jobs, .* device-hours at 200 effective TFLOP/s",
                     run.stderr, re.M), run.stderr[-3000:]


@pytest.mark.parametrize("override, message", [
    ("seeds=[x]", "seeds"),
    ("operators=[lineer]", "operators: ['lineer'] not in"),
    ("main_loss=kl", "main_loss / loss_grid.losses: ['kl'] not in"),
])
def test_malformed_config_fails_before_any_job(tmp_path, override, message):
    path = copy_project(tmp_path)
    run = snakemake(path, "--cores", "1", "--config", override)
    assert run.returncode != 0
    assert message in run.stdout + run.stderr
    assert not (path / "results").exists()


def test_a_configfile_without_a_grid_is_refused(tmp_path):
    """Not merged onto the shipped grid, whose datasets and sizes it would silently run."""
    path = copy_project(tmp_path)
    (path / "config" / "partial.yaml").write_text("results: elsewhere\n")
    run = snakemake(path, "-n", "--configfile", "config/partial.yaml")
    assert run.returncode != 0
    assert ("config/partial.yaml: no datasets, sizes, operators, strategies, seeds, losses, "
            "main_loss (a --configfile replaces the shipped grid") in run.stdout + run.stderr


def test_a_name_that_would_run_a_command_is_refused(tmp_path, mnist_root):
    path = copy_project(tmp_path)
    name = "x$(touch${IFS}MARKER)"
    config = tiny_config("results", mnist_root)
    config["datasets"] = {name: config["datasets"]["synthetic"]}
    (path / "config" / "evil.yaml").write_text(yaml.safe_dump(config))
    # a real run of the job that name reaches (a dry run would never start a shell)
    run = snakemake(path, f"results/teachers/{name}/pretrain/cpu96/record.json", "--cores", "1",
                    "--configfile", "config/evil.yaml")
    assert not list(path.rglob("MARKER"))
    assert run.returncode != 0 and not (path / "results").exists()
    assert "does not match '^[A-Za-z0-9][A-Za-z0-9_.+-]*$'" in run.stderr, run.stderr[-3000:]


def shell_commands(dry_run: str) -> dict[str, list[list[str]]]:
    """rule -> the words of each shell line that `snakemake -n -p` prints for its jobs."""
    commands: dict[str, list[list[str]]] = {}
    rule, text = None, None
    for line in dry_run.splitlines() + [""]:
        if text is not None:
            if line.strip() and not line.startswith("["):
                text.append(line)
                continue
            script = "\n".join(text).replace("\\\n", " ")
            commands.setdefault(rule, []).extend(
                shlex.split(cmd) for cmd in script.splitlines() if cmd.strip())
            text = None
        if m := re.match(r"^(?:local)?rule (\w+):$", line.strip()):
            rule = m.group(1)
        elif line.startswith("Shell command:") and line.split(":", 1)[1].strip() != "None":
            text = [line.split(":", 1)[1]]
    return commands


def test_every_command_keeps_paths_and_keys_whole(tmp_path, mnist_root):
    path = copy_project(tmp_path / "linvit's pro ject")
    config = tiny_config(HOSTILE, mnist_root)
    (path / "config" / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(path, "all", "dense", "-n", "-p", "--configfile", "config/tiny.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    commands = shell_commands(run.stdout)
    assert set(commands) == {"teacher", "distill", "finetune", "bench", "collect", "tables",
                             "figures", "attention_maps", "attention_figure", "report",
                             "scenes", "dense_job",
                             "dense_collect", "dense", "corrupt", "robustness_teacher",
                             "robustness_cell", "robustness_report"}
    for rule, lines in commands.items():
        for words in lines:
            for word in words:                # a split path leaves pieces of it as words
                assert "MARK" not in word or HOSTILE in word, (rule, word)
                assert "ject" not in word or str(path) in word, (rule, word)
            for flag in ("--key", "--data"):
                if flag in words:
                    assert isinstance(json.loads(words[words.index(flag) + 1]), dict), words
    record = [words for words in commands["teacher"] if "record" in words][0]
    assert json.loads(record[record.index("--key") + 1]) == {
        "dataset": "synthetic", "teacher": "pretrain", "size": "cpu96", "stage": "pretrain"}
    assert record[record.index("--run-dir") + 1] == f"{HOSTILE}/teachers/synthetic/pretrain/cpu96"
    assert [w for w in commands["teacher"][1] if w.startswith("PYTHONPATH=")] == [
        f"PYTHONPATH={path}/src"]
    students = commands["attention_figure"][0]
    assert students[students.index("--student-record") + 1] == \
        f"linear={HOSTILE}/maps/synthetic/pretrain/cpu96/linear/record.json"
    maps = {words[words.index("-o") + 1]: words for words in commands["attention_maps"]
            if "attention-maps" in words}
    linear = maps[f"{HOSTILE}/maps/synthetic/pretrain/cpu96/linear"]
    student = f"{HOSTILE}/distill/synthetic/pretrain/cpu96/linear/out/model.safetensors"
    assert f"model={json.dumps(student)}" in linear
    assert "layers=[0, -1]" in linear and "images=1" in linear
    assert not [w for w in maps[f"{HOSTILE}/maps/synthetic/pretrain/cpu96/teacher"]
                if w.startswith("model=")]                 # the teacher's own maps
    robust = {words[words.index("-o") + 1]: words for words in commands["robustness_cell"]
              if "-o" in words}
    cell = f"{HOSTILE}/robustness/cells/synthetic/pretrain/cpu96/linear/random/none/seed0/run"
    corrupted = f"{HOSTILE}/robustness/corrupted/synthetic/run/corrupted.safetensors"
    assert f"corrupted={json.dumps(corrupted)}" in robust[cell]


def mocov3_backbone_file(path: Path) -> Path:
    """A headless cpu96 backbone (28 px, one channel) saved in MoCo v3's training layout."""
    import torch

    from linvit.models import ModelSpec, create_vit
    state = create_vit(ModelSpec("cpu96", "softmax", 0, 28, 1)).state_dict()
    torch.save({"epoch": 1, "state_dict": {f"module.base_encoder.{k}": v
                                           for k, v in state.items()}}, path)
    return path


def test_the_teacher_axis_runs_pretrained_selected_and_probed_teachers(tmp_path, mnist_root):
    """Three teachers of the same students: pretrained at their size, pretrained wider and cut
    down by weight selection, and a self-supervised (headless) import given a head by a linear
    probe; each job through the workflow, and the tables put the teachers side by side."""
    path = copy_project(tmp_path)
    config = small_config("results", mnist_root)
    stage = config["stages"]["teacher"]
    # copy_mlp: each teacher's weights reach its students without a distillation job each
    config.update(strategies=["copy_mlp"], reference_strategies=[],
                  teachers={"pretrain": {"source": "pretrain"},
                            "wide": {"source": "pretrain", "size": "cpu192",
                                     "students": ["cpu96"]},
                            "ssl": {"source": "timm", "size": "cpu96", "layout": "mocov3",
                                    "file": str(mocov3_backbone_file(tmp_path / "moco.pth")),
                                    "headless": True, "probe": {"mode": "linear", **stage}}})
    (path / "config" / "axis.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(path, "--cores", "2", "--configfile", "config/axis.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    results = path / "results"
    frame = pd.read_csv(results / "results.csv")
    assert set(frame["status"]) == {"ok"}, frame[["kind", "teacher", "init", "status", "error"]]
    teachers = frame[frame["kind"] == "teacher"].set_index(["teacher", "size"])["stage"]
    assert teachers.to_dict() == {("pretrain", "cpu96"): "pretrain",
                                  ("wide", "cpu192"): "pretrain", ("wide", "cpu96"): "select",
                                  ("ssl", "cpu96"): "probe"}
    selected = json.loads((results / "teachers/synthetic/wide/cpu96/selected.json").read_text())
    assert selected["teacher"] == "results/teachers/synthetic/wide/cpu192/model.safetensors"
    probe = yaml.safe_load((results / "teachers/synthetic/ssl/cpu96/config.yaml").read_text())
    assert probe["config"]["teacher"] == "results/imports/synthetic/ssl/cpu96/model.safetensors"
    # each cell was taught by its own teacher model
    for teacher in ("pretrain", "wide", "ssl"):
        cell = results / f"cells/synthetic/{teacher}/cpu96/linear/copy_mlp/none/seed0"
        cfg = yaml.safe_load((cell / "config.yaml").read_text())["config"]
        assert cfg["teacher"] == f"results/teachers/synthetic/{teacher}/cpu96/model.safetensors"
    by_teacher = pd.read_csv(results / "tables" / "by_teacher.csv")
    assert {"pretrain", "wide", "ssl"} <= set(by_teacher.columns)
    main = (results / "tables" / "main.md").read_text()
    assert "teacher (selected)" in main and "teacher (imported, probed)" in main


def test_a_finished_grid_moved_to_another_folder_plans_nothing(tmp_path, mnist_root):
    """Job inputs (code stamps included) are named relative to the working directory: a copy of a
    finished grid elsewhere, .snakemake and results with it, has nothing to do; an edit there
    still reruns what it reaches."""
    import shutil

    path = copy_project(tmp_path / "here")
    config = small_config("results", mnist_root)
    (path / "config" / "small.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(path, "--cores", "2", "--configfile", "config/small.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    moved = tmp_path / "elsewhere" / "clone"
    shutil.copytree(path, moved, symlinks=True)
    again = snakemake(moved, "-n", "--configfile", "config/small.yaml")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, \
        again.stdout[-3000:]
    linear = moved / "src" / "linvit" / "attention" / "linear.py"
    linear.write_text(linear.read_text() + "\n# an edit\n")
    edited = snakemake(moved, "-n", "--configfile", "config/small.yaml")
    assert edited.returncode == 0 and "rule finetune:" in edited.stdout, edited.stdout[-3000:]
