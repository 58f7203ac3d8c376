"""The Snakemake workflow on a temporary copy of the project, around one shared run of a tiny
grid: end to end, code-change invalidation, failing cells, a results path full of shell syntax,
the dense target. (Tests with runs of their own: test_snakemake_alone.py; an interrupted and
resumed run: test_slurm.py.)"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from markdown_rows import rows_with

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
    "strategies": ["random", "copy_mlp+distill"], "reference_strategies": ["copy_all"],
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
            "export": {"operators": ["linear"], "strategies": ["copy_mlp+distill"]},
            "dense": {"tasks": ["segment", "detect"], "operators": ["linear"],
                      "strategies": ["copy_mlp+distill"],
                      "scenes": {"train": 12, "val": 6, "sprites_root": str(mnist_root)},
                      "stages": {"segment": dense_stage, "detect": dense_stage}}}


def small_config(results: str, mnist_root: Path, **axes) -> dict:
    """The tiny grid with one operator and without its loss grid, dense tasks, robustness and
    benchmark: for tests of one workflow behaviour, which need a few jobs, not every kind."""
    config = tiny_config(results, mnist_root)
    for key in ("loss_grid", "dense", "robustness", "bench", "export"):
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


# A results path that a shell would split, unquote and run commands from.
HOSTILE = "res ults/it's $(touch MARKER) `touch MARK2`"


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
    assert "## Operator benchmark" in report and "linear/torch share of its FLOP bound" in report
    assert "## Robustness" in report and "ImageNet-C-style" in report
    robust = pd.read_csv(results / "tables" / "robustness.csv")
    assert len(robust) == 1 + 2 * 2 + 1 + 1            # teacher, main cells, reference, loss grid
    assert not robust.isin(["failed", "missing"]).any().any()
    for name in ("main", "loss_design", "claims", "time_to_target", "robustness"):
        for ext in ("csv", "md", "tex"):
            assert (results / "tables" / f"{name}.{ext}").stat().st_size > 0
    # one dataset, teacher and size: no table of those axes, in the folder or the report
    assert not list((results / "tables").glob("by_*")) and "## By " not in report
    for name in ("accuracy_by_init", "time_to_accuracy", "distill_layers", "attention_maps",
                 "robustness", "claims"):
        assert (results / "figures" / f"{name}.png").stat().st_size > 0
    maps = {p.parent.name: json.loads(p.read_text())
            for p in (results / "maps/synthetic/pretrain/cpu96").glob("*/record.json")}
    assert {name: (r["kind"], r["status"]) for name, r in maps.items()} == {
        name: ("maps", "ok") for name in ("teacher", "linear", "focused")}
    assert (Path(maps["focused"]["run_dir"]) / "maps.safetensors").is_file()
    records = list((results / "cells").rglob("record.json"))
    assert len(records) == 2 * 2 + 1 + 1
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
    for name in ("main.md", "loss_design.md", "claims.md", "time_to_target.md", "report.md",
                 "accuracy_by_init.png", "time_to_accuracy.png", "distill_layers.png",
                 "claims.png",
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


FOCUSED = "cells/synthetic/pretrain/cpu96/focused"
# Every job that the focused operator's code reaches.
FOCUSED_JOBS = {
    "distill": {"distill/synthetic/pretrain/cpu96/focused/out"},
    "finetune": {f"{FOCUSED}/random/none/seed0", f"{FOCUSED}/copy_mlp+distill/out/seed0"},
    "attention_maps": {"maps/synthetic/pretrain/cpu96/focused"},
    "attention_figure": {"figures/attention_maps.png"},
    "robustness_cell": {f"robustness/{FOCUSED}/random/none/seed0",
                        f"robustness/{FOCUSED}/copy_mlp+distill/out/seed0"},
    **ROBUSTNESS_REPORT, **REPORTING}


def test_editing_an_operator_reruns_exactly_its_cells(project):
    assert short(project, edit_and_plan(project, "attention/focused.py")) == FOCUSED_JOBS


def test_editing_a_cpp_kernel_reruns_exactly_the_jobs_of_the_operators_that_run_it(project):
    """linear_attention.cpp runs under linear and focused (their cpp_sources): an edit to it
    reruns what an edit to both operators' own files does, and gated_scan.cpp, which neither
    runs, reruns nothing."""
    by_cpp = short(project, edit_and_plan(project, "ops/csrc/linear_attention.cpp",
                                          "\n// an edit\n"))
    by_python = {}
    for rel in ("attention/linear.py", "attention/focused.py"):
        for rule, outs in short(project, edit_and_plan(project, rel)).items():
            by_python.setdefault(rule, set()).update(outs)
    assert by_cpp == by_python and FOCUSED_JOBS["finetune"] <= by_cpp["finetune"]
    assert short(project, edit_and_plan(project, "ops/csrc/gated_scan.cpp",
                                        "\n// an edit\n")) == {}


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


def test_dense_target_fine_tunes_teacher_and_student_backbones(project):
    run = tiny(project, "dense")
    assert run.returncode == 0, run.stderr[-3000:]
    table = (project / "results" / "tables" / "dense.md").read_text()
    rows = rows_with(table, "synthetic", "pretrain", "cpu96")
    assert [r[3] for r in rows] == ["softmax teacher", "linear copy_mlp+distill"]
    for row in rows:                       # mIoU, aAcc, box AP, mask AP: all measured
        assert all(re.match(r"\d+\.\d\d$", v) for v in row[4:8]), row
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


def test_a_code_stamp_that_cannot_be_written_stops_the_plan_instead_of_shrinking_it(project):
    stamps = project / ".snakemake" / "linvit" / "code"
    folder = sorted(p for p in stamps.iterdir() if p.name.startswith("finetune-"))[0]
    kept = folder.with_name(folder.name + ".kept")
    folder.rename(kept)
    folder.write_text("a file where the stamp's folder was")
    try:
        run = tiny(project, "-n", "--forceall")
        assert run.returncode != 0, run.stdout[-2000:]
        assert "cannot write the code stamp" in run.stdout + run.stderr
    finally:
        folder.unlink()
        kept.rename(folder)
    assert tiny(project, "-n").returncode == 0


def test_export_target_makes_timm_folders_of_the_chosen_cells_only(project):
    import timm
    import torch

    from linvit.models import load_model

    run = tiny(project, "export")
    assert run.returncode == 0, run.stderr[-3000:]
    made = sorted(p.parent for p in (project / "results" / "export").rglob("metrics.json"))
    cell = "synthetic/pretrain/cpu96/linear/copy_mlp+distill/out/seed0"
    assert made == [project / "results" / "export" / cell]
    model = timm.create_model(f"local-dir:{made[0]}", pretrained=True).eval()
    want = load_model(project / "results" / "cells" / cell / "model.safetensors").eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(model(x), want(x), atol=1e-6)
    assert "copy_mlp+distill" in (made[0] / "README.md").read_text()
    again = tiny(project, "export")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_a_second_grid_naming_the_jobs_folder_trains_nothing_it_shares(project):
    """Grids that name one jobs_folder share its teachers, distillations and cells
    (linvit.workflow.shared): a grid that differs only in its results folder plans none of them,
    only what it keeps itself; one that gives a shared job other settings is refused."""
    config = yaml.safe_load((project / "config" / "tiny.yaml").read_text())
    config.update(results=str(project / "results b"), jobs_folder=str(project / "results"))
    (project / "config" / "b.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    run = snakemake(project, "-n", "--cores", "2", "--configfile", "config/b.yaml")
    assert run.returncode == 0, run.stderr[-3000:]
    planned = planned_outputs(run.stdout)
    shared = {"teacher", "import_teacher", "distill", "finetune", "select_cell"}
    assert not shared & set(planned), {r: planned[r] for r in shared & set(planned)}
    assert {"collect", "tables", "report"} <= set(planned)
    assert all(o.startswith(str(project / "results b")) for outs in planned.values()
               for o in outs)
    config["stages"]["finetune"]["optim"]["lr"] = 0.5
    (project / "config" / "b.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    refused = snakemake(project, "-n", "--cores", "2", "--configfile", "config/b.yaml")
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr                  # Snakemake prints its error on stdout
    assert "with other settings than this grid" in said and "cells/synthetic" in said, said[-2000:]


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
        rows = rows_with(main, "random") + rows_with(main, "copy_mlp+distill")
        assert len(rows) == 2, main
        assert all(r[5] == "failed" for r in rows), main                   # focused column
        assert all(re.match(r"\d+\.\d\d", r[4]) for r in rows), main
        report = (project / "results" / "report.md").read_text()
        assert "focused is broken" in report
        failed = project / "results/maps/synthetic/pretrain/cpu96/focused/record.json"
        assert json.loads(failed.read_text())["status"] == "failed"    # the figure leaves it out
        figure = project / "results" / "figures" / "attention_maps.png"
        assert figure.stat().st_mtime_ns > failed.stat().st_mtime_ns     # and is drawn anyway
    finally:
        path.write_text(original)
    # The fix reruns the failed jobs, and only them. (Planned, not run: the fixture's run already
    # showed these jobs pass, and this test comes last in the file, as it leaves them failed.)
    fixed = tiny(project, "-n")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert short(project, planned_outputs(fixed.stdout)) == FOCUSED_JOBS
