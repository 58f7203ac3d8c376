"""The Snakemake workflow on a temporary copy of the project: the paper DAG, config validation,
a tiny grid end to end, code-change invalidation, failing cells, interruption."""
from __future__ import annotations

import base64
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    "bench": {"operators": ["softmax", "linear"], "tokens": [16, 64], "softmax_max_tokens": 64,
              "min_run_time": 0.01, "goal_tokens": 64,
              "models": {"sizes": ["deit_t"], "resolutions": [32], "min_run_time": 0.01}},
}


@pytest.fixture(scope="module")
def project(tmp_path_factory, mnist_root):
    path = copy_project(tmp_path_factory.mktemp("project"))
    dense_stage = {"data": {"batch_size": 2}, "optim": {"iters": 2, "checkpoint_every": 2},
                   "model": {"head_channels": 32}}
    config = {"results": str(path / "results"),
              "datasets": {"synthetic": {"dataset": "fashion_mnist", "root": str(mnist_root)}},
              **TINY,
              "dense": {"tasks": ["segment", "detect"], "operators": ["linear"],
                        "strategies": ["copy_mlp+distill"],
                        "scenes": {"train": 12, "val": 6, "sprites_root": str(mnist_root)},
                        "stages": {"segment": dense_stage, "detect": dense_stage}}}
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
    sizes, ops, seeds = len(paper["sizes"]), len(paper["operators"]), len(paper["seeds"])
    sub = paper["loss_grid"]
    sub_cells = sizes * len(sub["operators"]) * len(sub["strategies"]) * len(sub["losses"]) * seeds
    cells = sizes * ops * len(paper["strategies"]) * seeds + sizes * seeds + sub_cells
    distills = sizes * ops + sizes * len(sub["operators"]) * len(sub["losses"])
    report_jobs = 8   # grid_document, collect, tables, figures, attention_figure, bench, report, all
    total = int(re.search(r"^total\s+(\d+)$", run.stdout, re.M).group(1))
    assert total == sizes + distills + cells + report_jobs
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


def test_tiny_grid_runs_end_to_end_and_then_has_nothing_to_do(project):
    results = project / "results"
    report = (results / "report.md").read_text()
    assert "## Main table" in report and "## The paper's claims on this grid" in report
    assert "## Operator benchmark" in report and "linear/torch vs softmax at N=64" in report
    for name in ("main", "loss_design", "by_dataset", "by_size"):
        for ext in ("csv", "md", "tex"):
            assert (results / "tables" / f"{name}.{ext}").stat().st_size > 0
    for name in ("accuracy_by_init", "time_to_accuracy", "distill_layers", "attention_maps"):
        assert (results / "figures" / f"{name}.png").stat().st_size > 0
    records = list((results / "cells").rglob("record.json"))
    assert len(records) == 2 * 3 + 1 + 1
    assert "failed" not in (results / "results.csv").read_text()
    again = tiny(project)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


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


def test_editing_an_operator_reruns_exactly_its_cells(project):
    jobs = short(project, edit_and_plan(project, "attention/focused.py"))
    cells = "cells/synthetic/cpu96/focused"
    assert jobs == {
        "distill": {"distill/synthetic/cpu96/focused/out"},
        "finetune": {f"{cells}/random/none/seed0", f"{cells}/copy_mlp/none/seed0",
                     f"{cells}/copy_mlp+distill/out/seed0"},
        "attention_figure": {"figures/attention_maps.png"},
        **REPORTING}


def test_editing_a_loss_reruns_exactly_its_distillation_and_cells(project):
    jobs = short(project, edit_and_plan(project, "transfer/losses/attn_map_ce.py"))
    assert jobs == {"distill": {"distill/synthetic/cpu96/linear/map"},
                    "finetune": {"cells/synthetic/cpu96/linear/copy_mlp+distill/map/seed0"},
                    **REPORTING}


def test_editing_plotting_code_reruns_only_figures(project):
    jobs = short(project, edit_and_plan(project, "report/figures.py"))
    assert jobs == {"figures": {"figures/accuracy_by_init.png"}}
    assert tiny(project, "-n").stdout.count("Nothing to be done") == 1   # the edit is undone


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
        assert "| synthetic | cpu96 | copy_mlp | " in main
        rows = [r for r in main.splitlines() if "| copy_mlp |" in r or "| random |" in r]
        assert all(r.split("|")[5].strip() == "failed" for r in rows), main   # focused column
        assert all(re.match(r"\d+\.\d\d", r.split("|")[4].strip()) for r in rows), main
        report = (project / "results" / "report.md").read_text()
        assert "focused is broken" in report
    finally:
        path.write_text(original)
    fixed = tiny(project)                        # the fix reruns the failed jobs, and only them
    assert fixed.returncode == 0
    assert "failed" not in (project / "results" / "tables" / "main.md").read_text()


def test_an_interrupted_workflow_resumes_without_recomputing(project):
    results = project / "results-interrupted"
    # one core: jobs run one after another, so the interrupt lands mid-grid
    args = [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "config/tiny.yaml",
            "--config", f"results={results}"]
    # A shell without job control starts background commands with SIGINT ignored, and children
    # inherit that; restore the default so the interrupt below acts like Ctrl-C in a terminal.
    proc = subprocess.Popen(args, cwd=project, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 600
    while not list(results.glob("cells/**/record.json")) and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    # a job that finished while Snakemake was stopping is marked incomplete and reruns
    marks = project / ".snakemake" / "incomplete"
    in_flight = {base64.b64decode(p.name).decode() for p in marks.iterdir()} if marks.is_dir() else set()
    done = {p: p.stat().st_mtime_ns for p in results.glob("**/record.json")
            if str(p) not in in_flight}
    assert 1 <= len([p for p in done if "/cells/" in str(p)]) < 8
    resumed = snakemake(project, *args[3:], "--rerun-incomplete")   # as the local profile does
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert all(p.stat().st_mtime_ns == t for p, t in done.items())   # finished jobs kept
    assert len(list(results.glob("cells/**/record.json"))) == 8
    assert (results / "report.md").is_file()


def test_dense_target_fine_tunes_teacher_and_student_backbones(project):
    run = tiny(project, "dense")
    assert run.returncode == 0, run.stderr[-3000:]
    table = (project / "results" / "tables" / "dense.md").read_text()
    rows = [r for r in table.splitlines() if "| synthetic | cpu96 |" in r]
    assert [r.split("|")[3].strip() for r in rows] == ["softmax teacher",
                                                       "linear copy_mlp+distill"]
    for row in rows:                       # mIoU, aAcc, box AP, mask AP: all measured
        assert all(re.match(r"\d+\.\d\d$", v.strip()) for v in row.split("|")[4:8]), row
    assert (project / "results" / "figures" / "dense.png").stat().st_size > 0
    assert "s per training step" in (project / "results" / "dense.md").read_text()
