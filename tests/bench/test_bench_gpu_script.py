"""scripts/bench_gpu.sh's wiring, run here with a stand-in Python that logs what it is asked.

The GPU parts themselves run only where a GPU is lent; what can break on the way there (the parts
chosen, the overrides passed, a time limit, the exit status) is checked without one.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_gpu.sh"

# Each call appends its arguments, one per line, then a line "--". `slow` in the arguments makes
# it wait to be stopped (and log the SIGINT it gets), `fail` makes it exit 3.
FAKE_PYTHON = """#!/usr/bin/env bash
{ printf '%s\\n' "$@"; echo --; } >> "$FAKE_LOG"
case " $* " in
  *" slow "*) trap 'kill $!; printf "SIGINT\\n--\\n" >> "$FAKE_LOG"; exit 130' INT
              sleep 30 > /dev/null 2>&1 & wait ;;
  *" fail "*) exit 3 ;;
esac
exit 0
"""


def run_script(tmp_path, **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    inherited = {k: v for k, v in os.environ.items()          # the caller's own choices out
                 if k not in ("PARTS", "BENCH_ARGS", "PART_TIMEOUT", "DATA_ROOT")
                 and not k.startswith("TIMEOUT_")}
    full_env = {**inherited, "PYTHON": str(fake), "FAKE_LOG": str(log), **env}
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env=full_env,
                          capture_output=True, text=True, timeout=60)
    calls = [c.strip("\n").split("\n") for c in log.read_text().split("--\n") if c.strip()]
    return proc, calls[1:]                        # calls[0]: the CUDA check


def test_parts_and_bench_args_reach_the_commands_as_given(tmp_path):
    proc, calls = run_script(tmp_path, PARTS="bench",
                             BENCH_ARGS="tokens=[4096]  repeats=1 models.batch=4")
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == 1 and calls[0][:3] == ["-m", "linvit.cli", "bench"]
    # after the script's own overrides, so they win; split at spaces only
    assert calls[0][-3:] == ["tokens=[4096]", "repeats=1", "models.batch=4"]
    assert "models.batch=64" in calls[0]


def test_every_part_runs_by_default_in_order(tmp_path):
    proc, calls = run_script(tmp_path, DATA_ROOT=str(tmp_path))   # no Fashion-MNIST there
    assert proc.returncode == 0, proc.stderr
    assert [c[1] if c[0] == "-m" else Path(c[0]).name for c in calls] == [
        "pytest", "linvit.cli", "bench_loader.py", "bench_step.py"]
    assert "=== demo: skipped" in proc.stdout


def test_an_unknown_part_stops_before_anything_runs(tmp_path):
    proc, _ = run_script(tmp_path, PARTS="bench benchh")
    assert proc.returncode == 2 and "unknown part 'benchh'" in proc.stderr
    assert (tmp_path / "calls.log").read_text() == ""             # not even the CUDA check


@pytest.mark.parametrize("args, limit, code", [("fail", "", "exit 3"),
                                               ("slow", "5", "exit 124")])
def test_a_failing_or_stopped_part_is_named_and_the_rest_still_run(tmp_path, args, limit, code):
    proc, calls = run_script(tmp_path, PARTS="bench loader", BENCH_ARGS=args,
                                  TIMEOUT_bench=limit)
    assert proc.returncode == 1
    assert f"failed: bench ({code})" in proc.stderr
    assert Path(calls[-1][0]).name == "bench_loader.py"          # the next part ran
    assert (["SIGINT"] in calls) == (args == "slow")              # stopped with SIGINT first
