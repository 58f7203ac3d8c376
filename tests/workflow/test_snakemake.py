"""The Snakemake workflow on a temporary copy of the project: the paper DAG, config validation,
a tiny grid end to end, code-change invalidation, failing cells, interruption, and paths and
names that a shell would misread."""
from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def copy_project(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".snakemake", "results")
    for part in ("src", "workflow", "config"):
        shutil.copytree(ROOT / part, dest / part, ignore=ignore)
    shutil.copy(ROOT / "Snakefile", dest / "Snakefile")
    return dest


def snakemake(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def planned_outputs(dry_run: str) -> dict[str, set[str]]:
    """rule -> first outputs of the jobs a dry run would execute."""
    jobs: dict[str, set[str]] = {}
    rule = None
    for line in dry_run.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line.strip()):
            rule = m.group(1)
        elif rule and line.strip().startswith("output:"):
            jobs.setdefault(rule, set()).add(line.split("output:")[1].split(",")[0].strip())
            rule = None
    return jobs


TINY = {
    "sizes": ["cpu96"], "operators": ["linear", "focused"],
    "strategies": ["random", "copy_mlp", "copy_mlp+distill"], "reference_strategies": ["copy_all"],
    "seeds": [0], "main_loss": "out",
    "losses": {"out": {"attn_out_mse": 1.0}, "map": {"attn_map_ce": 1.0}},
    "loss_grid": {"operators": ["linear"], "strategies": ["copy_mlp+distill"], "losses": ["map"]},
    "stages": {stage: {"data": {"batch_size": 64, "eval_batch_size": 256},
                       "optim": {"epochs": 1, "warmup_epochs": 0}, "run": {"progress": False}}
               for stage in ("teacher", "distill", "finetune")},
    "figures": {"attention_layers": [0, -1], "attention_images": 1},
    "robustness": {"corruptions": {"names": ["contrast", "gaussian_noise"], "severities": [1, 5],
                                   "samples": 32}},
    "bench": {"operators": ["softmax", "linear"], "tokens": [16, 64], "softmax_max_tokens": 64,
              "min_run_time": 0.01, "goal_tokens": 64,
              "models": {"sizes": ["deit_t"], "resolutions": [32], "min_run_time": 0.01}},
}


def tiny_config(results: str, mnist_root: Path) -> dict:
    dense_stage = {"data": {"batch_size": 2}, "optim": {"iters": 2, "checkpoint_every": 2},
                   "model": {"head_channels": 32}}
    return {"results": results,
            "datasets": {"synthetic": {"dataset": "fashion_mnist", "root": str(mnist_root)}},
            **TINY,
            "dense": {"tasks": ["segment", "detect"], "operators": ["linear"],
                      "strategies": ["copy_mlp+distill"],
                      "scenes": {"train": 12, "val": 6, "sprites_root": str(mnist_root)},
                      "stages": {"segment": dense_stage, "detect": dense_stage}}}


def small_config(results: str, mnist_root: Path, **axes) -> dict:
    """The tiny grid with one operator and without its loss grid, dense tasks, robustness and
    benchmark: for tests of one workflow behaviour, which need a few jobs, not every kind."""
    config = tiny_config(results, mnist_root)
    for key in ("loss_grid", "dense", "robustness", "bench"):
        del config[key]
    config.update(operators=["linear"], **axes)
    return config


# A checkout and results folder with a space and a quote in their path: every command must quote.
@pytest.fixture(scope="module")
def project(tmp_path_factory, mnist_root):
    path = copy_project(tmp_path_factory.mktemp("linvit's project"))
    config = tiny_config(str(path / "results"), mnist_root)
    (path / "config" / "tiny.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(path, "--cores", "2", "--configfile", "config/tiny.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    return path


def tiny(project: Path, *args: str) -> subprocess.CompletedProcess:
    # targets first: --configfile takes every word after it
    return snakemake(project, *args, "--cores", "2", "--configfile", "config/tiny.yaml")


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


# A results path that a shell would split, unquote and run commands from.
HOSTILE = "res ults/it's $(touch MARKER) `touch MARK2`"


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
    cell = f"{HOSTILE}/robustness/cells/synthetic/pretrain/cpu96/linear/copy_mlp/none/seed0/run"
    corrupted = f"{HOSTILE}/robustness/corrupted/synthetic/run/corrupted.safetensors"
    assert f"corrupted={json.dumps(corrupted)}" in robust[cell]


def test_a_job_runs_in_a_results_path_full_of_shell_syntax(project):
    record = project / HOSTILE / "teachers" / "synthetic" / "pretrain" / "cpu96" / "record.json"
    run = snakemake(project, str(record.relative_to(project)), "--cores", "2",
                    "--configfile", "config/tiny.yaml", "--config", f"results={HOSTILE}")
    assert run.returncode == 0, run.stderr[-3000:]
    written = json.loads(record.read_text())
    assert (written["status"], written["key"]) == ("ok", {"dataset": "synthetic",
                                                          "teacher": "pretrain", "size": "cpu96",
                                                          "stage": "pretrain"})
    assert not list(project.rglob("MARK*"))


def test_tiny_grid_runs_end_to_end_and_then_has_nothing_to_do(project):
    results = project / "results"
    report = (results / "report.md").read_text()
    assert "## Main table" in report and "## The paper's claims on this grid" in report
    assert "## Operator benchmark" in report and "linear/torch vs softmax at N=64" in report
    assert "## Robustness" in report and "ImageNet-C-style" in report
    robust = pd.read_csv(results / "tables" / "robustness.csv")
    assert len(robust) == 1 + 2 * 3 + 1 + 1            # teacher, main cells, reference, loss grid
    assert not robust.isin(["failed", "missing"]).any().any()
    for name in ("main", "loss_design", "by_dataset", "by_teacher", "by_size", "robustness"):
        for ext in ("csv", "md", "tex"):
            assert (results / "tables" / f"{name}.{ext}").stat().st_size > 0
    for name in ("accuracy_by_init", "time_to_accuracy", "distill_layers", "attention_maps",
                 "robustness"):
        assert (results / "figures" / f"{name}.png").stat().st_size > 0
    maps = {p.parent.name: json.loads(p.read_text())
            for p in (results / "maps/synthetic/pretrain/cpu96").glob("*/record.json")}
    assert {name: (r["kind"], r["status"]) for name, r in maps.items()} == {
        name: ("maps", "ok") for name in ("teacher", "linear", "focused")}
    assert (Path(maps["focused"]["run_dir"]) / "maps.safetensors").is_file()
    records = list((results / "cells").rglob("record.json"))
    assert len(records) == 2 * 3 + 1 + 1
    assert "failed" not in (results / "results.csv").read_text()
    again = tiny(project)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_snakemakes_html_report_shows_tables_and_figures_with_captions(project):
    """`snakemake --report` (after the run above): one HTML file holding every table and figure
    the report rules mark, each with its caption from workflow/report/."""
    out = project / "results" / "report.html"
    run = tiny(project, "--report", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    html = out.read_text()
    for name in ("main.md", "loss_design.md", "by_dataset.md", "by_size.md", "report.md",
                 "accuracy_by_init.png", "time_to_accuracy.png", "distill_layers.png",
                 "attention_maps.png", "robustness.md", "robustness.png"):
        assert name in html, name
    captions = [(project / "workflow" / "report" / f"{c}.rst").read_text().split()[:6]
                for c in ("table", "figure", "attention_maps", "report_md")]
    for words in captions:
        assert " ".join(words).replace("``", "") in html.replace("<code>", "").replace(
            "</code>", ""), words


def edit_and_plan(project: Path, rel: str, extra: str = "\n# an edit\n") -> dict[str, set[str]]:
    path = project / "src" / "linvit" / rel
    original = path.read_text()
    path.write_text(original + extra)
    try:
        run = tiny(project, "-n")
        assert run.returncode == 0, run.stderr[-2000:]
        return planned_outputs(run.stdout)
    finally:
        path.write_text(original)             # same content again: nothing to rerun


def short(project: Path, jobs: dict[str, set[str]]) -> dict[str, set[str]]:
    base = str(project / "results") + "/"
    return {rule: {o.replace(base, "").rsplit("/record.json")[0] for o in outs}
            for rule, outs in jobs.items()}


REPORTING = {"collect": {"results.csv"}, "tables": {"tables/main.csv"},
             "figures": {"figures/accuracy_by_init.png"}, "report": {"report.md"}}
ROBUSTNESS_REPORT = {"robustness_report": {"tables/robustness.csv"}}


def test_editing_an_operator_reruns_exactly_its_cells(project):
    jobs = short(project, edit_and_plan(project, "attention/focused.py"))
    cells = "cells/synthetic/pretrain/cpu96/focused"
    assert jobs == {
        "distill": {"distill/synthetic/pretrain/cpu96/focused/out"},
        "finetune": {f"{cells}/random/none/seed0", f"{cells}/copy_mlp/none/seed0",
                     f"{cells}/copy_mlp+distill/out/seed0"},
        "attention_maps": {"maps/synthetic/pretrain/cpu96/focused"},
        "attention_figure": {"figures/attention_maps.png"},
        "robustness_cell": {f"robustness/{cells}/random/none/seed0",
                            f"robustness/{cells}/copy_mlp/none/seed0",
                            f"robustness/{cells}/copy_mlp+distill/out/seed0"},
        **ROBUSTNESS_REPORT, **REPORTING}


def test_editing_a_loss_reruns_exactly_its_distillation_and_cells(project):
    jobs = short(project, edit_and_plan(project, "transfer/losses/attn_map_ce.py"))
    cell = "cells/synthetic/pretrain/cpu96/linear/copy_mlp+distill/map/seed0"
    assert jobs == {"distill": {"distill/synthetic/pretrain/cpu96/linear/map"}, "finetune": {cell},
                    "robustness_cell": {f"robustness/{cell}"}, **ROBUSTNESS_REPORT,
                    **REPORTING}


def test_editing_plotting_code_reruns_only_figures(project):
    jobs = short(project, edit_and_plan(project, "report/figures.py"))
    assert jobs == {"figures": {"figures/accuracy_by_init.png"}}
    assert tiny(project, "-n").stdout.count("Nothing to be done") == 1   # the edit is undone


def test_the_attention_figure_and_its_maps_rerun_apart(project):
    """Drawing reads stored maps: editing the figure redraws it alone; editing the maps stage
    retakes every map (and so redraws), and no model code reruns the drawing by itself."""
    assert short(project, edit_and_plan(project, "report/attention_maps.py")) == {
        "attention_figure": {"figures/attention_maps.png"}}
    assert short(project, edit_and_plan(project, "transfer/maps.py")) == {
        "attention_maps": {f"maps/synthetic/pretrain/cpu96/{m}"
                           for m in ("teacher", "linear", "focused")},
        "attention_figure": {"figures/attention_maps.png"}}


def test_a_failing_cell_does_not_poison_the_others(project):
    path = project / "src" / "linvit" / "attention" / "focused.py"
    original = path.read_text()
    path.write_text(original.replace("    def global_mix(self, q, k, v):\n",
                                     "    def global_mix(self, q, k, v):\n"
                                     "        raise RuntimeError('focused is broken')\n"))
    try:
        run = tiny(project)
        assert run.returncode == 0, run.stderr[-2000:]
        main = (project / "results" / "tables" / "main.md").read_text()
        assert "| synthetic | pretrain | cpu96 | copy_mlp | " in main
        rows = [r for r in main.splitlines() if "| copy_mlp |" in r or "| random |" in r]
        assert all(r.split("|")[6].strip() == "failed" for r in rows), main   # focused column
        assert all(re.match(r"\d+\.\d\d", r.split("|")[5].strip()) for r in rows), main
        report = (project / "results" / "report.md").read_text()
        assert "focused is broken" in report
        failed = project / "results/maps/synthetic/pretrain/cpu96/focused/record.json"
        assert json.loads(failed.read_text())["status"] == "failed"    # the figure leaves it out
        figure = project / "results" / "figures" / "attention_maps.png"
        assert figure.stat().st_mtime_ns > failed.stat().st_mtime_ns     # and is drawn anyway
    finally:
        path.write_text(original)
    fixed = tiny(project)                        # the fix reruns the failed jobs, and only them
    assert fixed.returncode == 0
    assert "failed" not in (project / "results" / "tables" / "main.md").read_text()


def incomplete_outputs(project: Path) -> set[str]:
    """Outputs Snakemake marked incomplete: urlsafe base64 of the path, split into '@'-prefixed
    folders past the file-name limit."""
    marks = project / ".snakemake" / "incomplete"
    return {base64.urlsafe_b64decode("".join(part.lstrip("@")
                                             for part in p.relative_to(marks).parts)).decode()
            for p in marks.rglob("*") if p.is_file()} if marks.is_dir() else set()


def is_training_job(proc: psutil.Process, results: Path) -> bool:
    """Whether `proc` is a linvit distill or finetune job writing under `results`."""
    words = proc.cmdline()
    return ("linvit.cli" in words and bool({"distill", "finetune"} & set(words))
            and any(str(results) in w for w in words))


def freeze_a_training_job(snake: psutil.Process, results: Path) -> psutil.Process:
    """A distill or finetune job of this workflow, stopped (SIGSTOP) while it runs: from then on it
    cannot finish, so the interrupt that follows lands mid-job whatever the timing."""
    deadline = time.time() + 600
    while time.time() < deadline:
        for proc in snake.children(recursive=True):
            try:
                if not is_training_job(proc, results):
                    continue
                proc.suspend()
                while proc.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                    time.sleep(0.01)          # the stop signal is being delivered
                if proc.status() == psutil.STATUS_STOPPED:
                    return proc
            except psutil.NoSuchProcess:      # finished before it could be stopped: the next one
                pass
        time.sleep(0.1)
    raise AssertionError("no distill or finetune job started within 10 minutes")


def test_an_interrupted_workflow_resumes_without_recomputing(project, mnist_root):
    """Ctrl-C mid-job: the next run reruns only unfinished jobs, leaves finished ones untouched
    and completes the grid."""
    results = project / "results-interrupted"
    config = small_config(str(results), mnist_root, reference_strategies=[])
    (project / "config" / "small.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cells = len(config["strategies"])
    # one core: one job at a time
    args = ["--cores", "1", "--configfile", "config/small.yaml"]
    # First exactly one cell and its teacher, so the jobs finished before the interrupt are known.
    cell = results / "cells/synthetic/pretrain/cpu96/linear/random/none/seed0/record.json"
    first = snakemake(project, str(cell), *args)
    assert first.returncode == 0, first.stderr[-2000:]
    finished = {p: p.stat().st_mtime_ns for p in results.glob("**/record.json")}
    assert set(finished) == {cell, results / "teachers/synthetic/pretrain/cpu96/record.json"}
    # Then the whole grid, interrupted as Ctrl-C in a terminal does: SIGINT to the process group
    # (Snakemake, job shells, jobs) while a training job is frozen, which gets it on SIGCONT. A
    # shell without job control starts background commands with SIGINT ignored, and children
    # inherit that; restore the default.
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *args], cwd=project,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        job = freeze_a_training_job(psutil.Process(proc.pid), results)
        words = job.cmdline()
        interrupted = Path(words[words.index("-o") + 1]) / "record.json"
        os.killpg(proc.pid, signal.SIGINT)
        job.resume()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:               # the test failed: leave no workflow behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # a job that finished while Snakemake was stopping is marked incomplete and reruns
    in_flight = incomplete_outputs(project)
    done = {p: p.stat().st_mtime_ns for p in results.glob("**/record.json")
            if str(p) not in in_flight}
    assert finished.items() <= done.items() and interrupted not in done
    assert 1 <= len([p for p in done if "/cells/" in str(p)]) < cells
    resumed = snakemake(project, *args, "--rerun-incomplete")   # as the local profile does
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert all(p.stat().st_mtime_ns == t for p, t in done.items())   # finished jobs kept
    assert interrupted.is_file()
    assert len(list(results.glob("cells/**/record.json"))) == cells
    assert (results / "report.md").is_file()


def test_dense_target_fine_tunes_teacher_and_student_backbones(project):
    run = tiny(project, "dense")
    assert run.returncode == 0, run.stderr[-3000:]
    table = (project / "results" / "tables" / "dense.md").read_text()
    rows = [r for r in table.splitlines() if "| synthetic | pretrain | cpu96 |" in r]
    assert [r.split("|")[4].strip() for r in rows] == ["softmax teacher",
                                                       "linear copy_mlp+distill"]
    for row in rows:                       # mIoU, aAcc, box AP, mask AP: all measured
        assert all(re.match(r"\d+\.\d\d$", v.strip()) for v in row.split("|")[5:9]), row
    assert (project / "results" / "figures" / "dense.png").stat().st_size > 0
    assert "s per training step" in (project / "results" / "dense.md").read_text()
    # once the dense sub-grid has run, the main report carries it (and nothing else reruns)
    assert "## Dense tasks" not in (project / "results" / "report.md").read_text()
    plan = tiny(project, "-n")
    assert set(planned_outputs(plan.stdout)) == {"report"}, plan.stdout[-3000:]
    again = tiny(project)
    assert again.returncode == 0, again.stderr[-3000:]
    report = (project / "results" / "report.md").read_text()
    assert "## Dense tasks" in report and "![dense](figures/dense.png)" in report


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
    config.update(strategies=["copy_mlp+distill"], reference_strategies=[],
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
        cell = results / f"cells/synthetic/{teacher}/cpu96/linear/copy_mlp+distill/out/seed0"
        cfg = yaml.safe_load((cell / "config.yaml").read_text())["config"]
        assert cfg["teacher"] == f"results/teachers/synthetic/{teacher}/cpu96/model.safetensors"
    by_teacher = pd.read_csv(results / "tables" / "by_teacher.csv")
    assert {"pretrain", "wide", "ssl"} <= set(by_teacher.columns)
    main = (results / "tables" / "main.md").read_text()
    assert "teacher (selected)" in main and "teacher (imported, probed)" in main
