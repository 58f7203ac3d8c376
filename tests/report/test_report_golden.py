"""Golden test of the reporting chain, record -> collect -> tables -> report, on a stored results
folder (no training, a few seconds).

tests/report/golden/fixture/ is a small results folder as the workflow leaves it (grid.json,
run folders with verified metrics.json, record.json per job, jobs.json listing the jobs in the
workflow's order), written by tests/report/golden/make_fixture.py; tests/report/golden/expected/
holds what the steps must write from it (results.csv, curves.csv, distill_layers.csv,
tables/*, report.md), compared byte for byte, with a diff on failure.

After a deliberate change of the reporting output, regenerate the expected files and review the
diff before committing it:

    LINVIT_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/report/test_report_golden.py
    git diff tests/report/golden/expected

After changing make_fixture.py (or what a record holds), rewrite the fixture first:
`.venv/bin/python tests/report/golden/make_fixture.py`, then regenerate the expected files as above.
"""
from __future__ import annotations

import difflib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from markdown_rows import has_row

GOLDEN = Path(__file__).resolve().parent / "golden"
FIXTURE = GOLDEN / "fixture"
EXPECTED = GOLDEN / "expected"
UPDATE = os.environ.get("LINVIT_UPDATE_GOLDEN") == "1"
FIGURES = ["fixture/figures/accuracy_by_init.png", "fixture/figures/attention_maps.png",
           "fixture/figures/claims.png"]


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def differences(expected: dict[str, bytes], produced: dict[str, bytes], where: str) -> list[str]:
    """A unified diff per differing file, and the files only one side has."""
    out = []
    for name in sorted(set(expected) | set(produced)):
        if name not in produced:
            out.append(f"{name}: expected in {where}, not written")
        elif name not in expected:
            out.append(f"{name}: written, but not in {where}")
        elif expected[name] != produced[name]:
            diff = difflib.unified_diff(
                expected[name].decode(errors="replace").splitlines(keepends=True),
                produced[name].decode(errors="replace").splitlines(keepends=True),
                fromfile=f"{where}/{name}", tofile=f"produced/{name}")
            out.append("".join(diff))
    return out


def report_cli(root: Path, *args: str) -> None:
    """One step as the workflow runs it: `python -m linvit.report.cli ...` from the project."""
    run = subprocess.run([sys.executable, "-m", "linvit.report.cli", *args], cwd=root,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"{args[0]} failed:\n{run.stdout}\n{run.stderr}"


def test_fixture_is_what_make_fixture_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_fixture", GOLDEN / "make_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make(tmp_path)
    diffs = differences(files_under(FIXTURE), files_under(tmp_path / "fixture"),
                        "tests/report/golden/fixture")
    assert not diffs, ("tests/report/golden/fixture is not what make_fixture.py writes; rerun "
                       "`.venv/bin/python tests/report/golden/make_fixture.py` after a deliberate "
                       "change:\n" + "\n".join(diffs))


def test_collect_tables_report_match_the_expected_files(tmp_path, monkeypatch):
    from linvit.report.cli import main

    root = tmp_path / "project with spaces"
    shutil.copytree(FIXTURE, root / "fixture")
    jobs = json.loads((root / "fixture" / "jobs.json").read_text())

    # record: each job's record.json, from its run folder and log, as stored
    monkeypatch.chdir(root)
    for job in jobs:
        main(["record", "--kind", job["kind"], "--key", json.dumps(job["key"]),
              "--run-dir", job["run_dir"], "--status", str(job["status"]), "--out", job["out"],
              *(["--log", job["log"]] if job["log"] else [])])
    records = {j["out"][len("fixture/"):] for j in jobs}
    diffs = differences({k: v for k, v in files_under(FIXTURE).items() if k in records},
                        {k: v for k, v in files_under(root / "fixture").items() if k in records},
                        "tests/report/golden/fixture")
    assert not diffs, "the record step no longer writes the stored records:\n" + "\n".join(diffs)

    before = set(files_under(root / "fixture"))
    report_cli(root, "collect", "--grid", "fixture/grid.json", "--out", "fixture",
               *[j["out"] for j in jobs])
    report_cli(root, "tables", "--grid", "fixture/grid.json", "--results", "fixture/results.csv",
               "--curves", "fixture/curves.csv", "--layers", "fixture/distill_layers.csv",
               "--out", "fixture/tables")
    report_cli(root, "report", "--grid", "fixture/grid.json", "--results", "fixture/results.csv",
               "--tables", "fixture/tables", "--figures", *FIGURES, "--out", "fixture/report.md")
    produced = {k: v for k, v in files_under(root / "fixture").items() if k not in before}

    # what the fixture is for, whatever the expected files say
    main_md = produced["tables/main.md"].decode()
    for text in ("teacher (pretrained)", " ± ", "missing", "(1/2 seeds)"):
        assert text in main_md, text
    assert has_row(produced["tables/loss_design.md"].decode(), "failed")
    report = produced["report.md"].decode()
    assert "## Failed or missing jobs" in report and has_row(report, "**does not hold**")
    assert "](figures/attention_maps.png)" in report and "](figures/claims.png)" in report
    # the claims' verdict table: a paired contrast over 2 seeds, one of 1 seed, a pooled row
    claims = produced["tables/claims.md"].decode()
    assert has_row(claims, "2", "-2.47 ± 1.02 (0: -2.39, 1: -2.55)", "**does not hold**")
    assert "pooled (1 student)" in claims
    # time to target: copy_mlp+distill reaches it, random does not within its training
    cost = produced["tables/time_to_target.md"].decode()
    assert "not reached within the budget" in cost and "(random: not reached)" in cost
    # one dataset, teacher and size: no table of those axes
    assert not any(name.startswith("tables/by_") for name in produced)

    if UPDATE:
        shutil.rmtree(EXPECTED, ignore_errors=True)
        for name, data in produced.items():
            (EXPECTED / name).parent.mkdir(parents=True, exist_ok=True)
            (EXPECTED / name).write_bytes(data)
        pytest.skip("LINVIT_UPDATE_GOLDEN=1: rewrote tests/report/golden/expected; review its "
                    "git diff")
    diffs = differences(files_under(EXPECTED), produced, "tests/report/golden/expected")
    assert not diffs, ("the reporting steps' outputs differ from tests/report/golden/expected "
                       "(after a deliberate change: LINVIT_UPDATE_GOLDEN=1, see this module's "
                       "docstring):\n" + "\n".join(diffs))
