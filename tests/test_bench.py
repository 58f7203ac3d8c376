"""`linvit bench`: the memory meter, the ratio arithmetic and a tiny real run of the CLI."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from linvit.bench.measure import peak_bytes
from linvit.bench.ratios import goals, slopes, speedups
from linvit.cli import main
from linvit.config import BenchConfig, load_config

CPU = torch.device("cpu")
MIB = 2**20


def test_cpu_peak_counts_live_bytes_not_the_sum_of_allocations():
    def one_at_a_time():
        for _ in range(3):
            torch.ones(MIB // 4)                      # 1 MiB, freed at once
    def all_at_once():
        keep = [torch.ones(MIB // 4) for _ in range(3)]
        return len(keep)
    assert MIB <= peak_bytes(one_at_a_time, CPU) < 1.2 * MIB
    assert 3 * MIB <= peak_bytes(all_at_once, CPU) < 3.2 * MIB


def synthetic(ops_speed: float = 100.0) -> pd.DataFrame:
    """softmax: time and memory ~ N^2; linear: ~ N, `ops_speed` times faster at N=4096."""
    rows = []
    for n in (256, 1024, 4096, 16384):
        common = {"tokens": n, "batch": 1, "heads": 6, "head_dim": 64, "device": "cpu",
                  "part": "core"}
        if n <= 4096:
            rows.append({**common, "operator": "softmax", "backend": "sdpa",
                         "ms": 1e-4 * n * n, "peak_mib": 1e-5 * n * n})
        rows.append({**common, "operator": "linear", "backend": "torch",
                     "ms": 1e-4 * 4096 * n / ops_speed, "peak_mib": 1e-3 * n})
    return pd.DataFrame(rows)


def test_speedups_and_slopes_of_known_power_laws():
    ops = synthetic(ops_speed=100.0)
    sp = speedups(ops)
    assert sp.loc[("linear", "torch", "core"), 4096] == pytest.approx(100.0)
    assert sp.loc[("linear", "torch", "core"), 256] == pytest.approx(100.0 / 16)
    assert 16384 not in sp.columns                            # no softmax row to compare with
    sl = slopes(ops)
    assert sl.loc[("softmax", "sdpa", "core"), "time_slope"] == pytest.approx(2.0)
    assert sl.loc[("linear", "torch", "core"), "memory_slope"] == pytest.approx(1.0)


@pytest.mark.parametrize("speed, holds", [(100.0, "yes"), (10.0, "NO")])
def test_goals_report_what_was_measured(speed, holds):
    cfg = load_config(BenchConfig)
    result = {g["goal"]: g for g in goals(synthetic(speed), cfg)}
    assert result["linear/torch vs softmax at N=4096"]["holds"] == holds
    assert result["linear/torch memory slope, N=256..16384"]["holds"] == "yes"
    steep = synthetic(speed).assign(peak_mib=lambda d: d.peak_mib * np.sqrt(d.tokens))
    assert {g["goal"]: g for g in goals(steep, cfg)}[
        "linear/torch memory slope, N=256..16384"]["holds"] == "NO"


TINY = ["tokens=[16,64]", "softmax_max_tokens=64", "min_run_time=0.01", "goal_tokens=64",
        "models.sizes=[deit_t]", "models.resolutions=[32]", "models.min_run_time=0.01",
        "run.threads=1"]


def test_bench_cli_writes_measurements_ratios_and_figures(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "-o", str(out), *TINY]) == 0
    ops = pd.read_csv(out / "ops.csv")
    from linvit.attention import OPERATORS
    from linvit.bench.operators import parts_of
    linear_ops = [o for o in OPERATORS if o != "softmax"]
    local = [o for o in linear_ops if parts_of(o) == ["core", "mix"]]
    assert local == ["focused", "inline"]
    # softmax + (reference, torch) cores + the fused mix of operators with a local term, x 2 N
    assert len(ops) == 2 * (1 + 2 * len(linear_ops) + len(local))
    assert (ops.ms > 0).all() and (ops.peak_mib > 0).all()
    models = pd.read_csv(out / "models.csv")
    assert set(models.operator) == set(OPERATORS) and (models.tokens == 5).all()
    text = (out / "ratios.md").read_text()
    assert "## Goals" in text and "linear/torch vs softmax at N=64" in text
    assert "## Goals" in capsys.readouterr().out
    for stem in ("ops_scaling", "models_throughput"):
        assert (out / f"{stem}.png").stat().st_size > 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["goals"]) == 2 * len(linear_ops)
    assert metrics["goals_hold"] == all(g["holds"] == "yes" for g in metrics["goals"])


@pytest.mark.parametrize("override, message", [
    ("tokens=[16,50]", "tokens[1]: 50 is not a positive square"),
    ("operators=[linear]", "operators: must include softmax"),
    ("models.resolutions=[40]", "models.resolutions[0]: 40 is not a positive multiple"),
    ("operators=[softmax,lineer]", "operators[1]: 'lineer' is not one of"),
])
def test_bench_config_errors_name_the_field_before_any_output(tmp_path, capsys, override, message):
    out = tmp_path / "bench"
    assert main(["bench", "-o", str(out), override]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
