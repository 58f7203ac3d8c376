"""`linvit bench`: the memory meter, the ratio arithmetic and a tiny real run of the CLI."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from linvit.attention import OPERATORS
from linvit.bench.config import BenchConfig
from linvit.bench.measure import peak_bytes
from linvit.bench.operators import make_operator
from linvit.bench.ratios import flop_bound, goals, slopes, speedups
from linvit.cli import main
from linvit.config import load_config
from linvit.ops.backends import backend

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


def synthetic(ops_speed: float = 32.0, memory_power: float = 1.0,
              device: str = "cpu") -> pd.DataFrame:
    """Exact power laws: softmax time and memory = N^2 / 2^20; the linear core's time grows as N
    and is `ops_speed` times softmax's at N=4096, its memory is N^memory_power / 2^10. With
    powers of two, the speedups 32 (N=4096) and 2 (N=256) of the default are exact floats."""
    fast = {"cpu": "torch", "cuda": "triton"}[device]
    rows = []
    for n in (256, 1024, 4096, 16384):
        common = {"tokens": n, "batch": 1, "heads": 6, "head_dim": 64, "device": device,
                  "part": "core"}
        if n <= 4096:
            rows.append({**common, "operator": "softmax", "backend": "sdpa",
                         "ms": n * n / 2**20, "peak_mib": n * n / 2**20})
        rows.append({**common, "operator": "linear", "backend": fast,
                     "ms": 4096 * n / 2**20 / ops_speed, "peak_mib": n**memory_power / 2**10})
    return pd.DataFrame(rows)


def test_speedups_and_slopes_of_known_power_laws():
    ops = synthetic(ops_speed=32.0)
    sp = speedups(ops)
    assert sp.loc[("linear", "torch", "core"), 4096] == 32.0         # 16 ms / 0.5 ms
    assert sp.loc[("linear", "torch", "core"), 1024] == 8.0          # 1 ms / 0.125 ms
    assert sp.loc[("linear", "torch", "core"), 256] == 2.0           # 1/16 ms / 1/32 ms
    assert 16384 not in sp.columns                            # no softmax row to compare with
    sl = slopes(ops)
    assert sl.loc[("softmax", "sdpa", "core"), "time_slope"] == pytest.approx(2.0)
    assert sl.loc[("softmax", "sdpa", "core"), "memory_slope"] == pytest.approx(2.0)
    assert sl.loc[("linear", "torch", "core"), "time_slope"] == pytest.approx(1.0)
    assert sl.loc[("linear", "torch", "core"), "memory_slope"] == pytest.approx(1.0)
    assert tuple(sl.loc[("linear", "torch", "core"), ["from", "to"]]) == (256, 16384)
    steep = slopes(synthetic(memory_power=1.5))
    assert steep.loc[("linear", "torch", "core"), "memory_slope"] == pytest.approx(1.5)


SPEED_GOAL = "linear/torch vs softmax at N=4096"
SLOPE_GOAL = "linear/torch memory slope, N=256..16384"


@pytest.mark.parametrize("speed, goal, measured, holds", [
    (32.0, 32.0, "32.00x", "yes"),      # exactly at the target: ">=" holds
    (32.0, 30.0, "32.00x", "yes"),
    (16.0, 30.0, "16.00x", "NO"),
    (16.0, 16.5, "16.00x", "NO"),
    (64.0, 30.0, "64.00x", "yes"),
])
def test_speedup_goal_verdicts_on_known_speedups(speed, goal, measured, holds):
    cfg = load_config(BenchConfig, None, [f"goal_speedup={goal}"])
    result = {g["goal"]: g for g in goals(synthetic(speed), cfg)}
    assert set(result) == {SPEED_GOAL, SLOPE_GOAL}
    assert result[SPEED_GOAL] == {"goal": SPEED_GOAL, "measured": measured,
                                  "target": f">= {goal:g}x", "holds": holds}


@pytest.mark.parametrize("power, goal, measured, holds", [
    (1.0, 1.1, "1.00", "yes"),
    (1.5, 1.1, "1.50", "NO"),
    (1.5, 1.6, "1.50", "yes"),
    (1.0, 0.9, "1.00", "NO"),
])
def test_memory_slope_goal_verdicts_on_known_slopes(power, goal, measured, holds):
    cfg = load_config(BenchConfig, None, [f"goal_slope={goal}"])
    result = {g["goal"]: g for g in goals(synthetic(memory_power=power), cfg)}
    assert result[SLOPE_GOAL] == {"goal": SLOPE_GOAL, "measured": measured,
                                  "target": f"<= {goal:g}", "holds": holds}


def test_kernel_goals_compare_triton_with_the_reference():
    """On a GPU frame: reference / triton time at N >= goal_tokens, 3x at 4096, 1.5x at 16384."""
    ops = synthetic(device="cuda")
    fast = ops[ops.backend == "triton"]
    reference = fast.assign(backend="reference",
                            ms=fast.ms * fast.tokens.map({256: 1.0, 1024: 1.0, 4096: 3.0,
                                                          16384: 1.5}))
    ops = pd.concat([ops, reference], ignore_index=True)
    result = {g["goal"]: g for g in goals(ops, load_config(BenchConfig))}
    assert set(result) == {"linear/triton vs softmax at N=4096",
                           "linear/triton memory slope, N=256..16384",
                           "linear/triton vs reference at N=4096",
                           "linear/triton vs reference at N=16384"}
    assert result["linear/triton vs reference at N=4096"]["measured"] == "3.00x"
    assert result["linear/triton vs reference at N=4096"]["holds"] == "yes"
    assert result["linear/triton vs reference at N=16384"]["measured"] == "1.50x"
    assert result["linear/triton vs reference at N=16384"]["holds"] == "NO"
    assert result["linear/triton vs softmax at N=4096"]["holds"] == "yes"


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
    assert {"focused", "inline"} <= set(local)
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
    shares = BenchConfig().goal_flop_share                  # speed + slope, + a share goal
    assert len(metrics["goals"]) == 2 * len(linear_ops) + len(shares)
    assert isinstance(metrics["goals_hold"], bool)      # its value: the test below


@pytest.mark.parametrize("speed, goals_hold", [(32.0, True), (16.0, False)])
def test_bench_cli_reports_whether_the_goals_hold(tmp_path, monkeypatch, speed, goals_hold):
    """The CLI on a measured frame whose verdicts are known: 32x meets goal_speedup=32, 16x does
    not; the memory slope (1.0 <= 1.1) holds either way."""
    import linvit.bench.stage as stage

    monkeypatch.setattr(stage, "sweep_operators",
                        lambda cfg, device: synthetic(speed).to_dict("records"))
    out = tmp_path / "bench"
    assert main(["bench", "-o", str(out), "goal_speedup=32", "models=null", "run.threads=1",
                 "operators=[softmax,linear]"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    verdicts = {g["goal"]: (g["measured"], g["holds"]) for g in metrics["goals"]}
    assert verdicts == {SPEED_GOAL: (f"{speed:.2f}x", "yes" if goals_hold else "NO"),
                        SLOPE_GOAL: ("1.00", "yes")}
    assert metrics["goals_hold"] is goals_hold


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


# matrix products by ATen op: FLOPs = 2 x output entries x inner dimension (a triangular solve
# with an m x m matrix: m x output entries, its m^2 n / 2 multiply-adds); in-place and out=
# variants count too (torch's FlopCounterMode misses those and the solves)
INNER = {"mm": lambda a: a[0].shape[-1], "bmm": lambda a: a[0].shape[-1],
         "addmm": lambda a: a[1].shape[-1], "baddbmm": lambda a: a[1].shape[-1],
         "linalg_solve_triangular": lambda a: a[0].shape[-1] / 2}


class MatmulFlops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.flops = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__.rstrip("_")
        if name in INNER:
            self.flops += 2 * out.numel() * INNER[name](args)
        elif "mm" in name or "matmul" in name or "solve" in name:
            raise AssertionError(f"uncounted matrix op {func}: add it to INNER")
        return out


@pytest.mark.parametrize("name", list(OPERATORS))
def test_flop_counts_are_the_matmuls_the_fast_path_runs(name):
    """core_flops against the matrix products the CPU fast path runs (softmax: its explicit map
    times V, as SDPA's CPU kernel is one opaque op), on whole chunks (padding is not counted)."""
    heads, d, n = 2, 32, 320
    op = make_operator(name, heads, d, 324, CPU)          # an 18 x 18 grid for local terms
    q, k, v = (torch.randn(1, heads, n, d) for _ in range(3))
    with backend("torch"), MatmulFlops() as counter:
        if name == "softmax":
            op.attention_map(q, k) @ v
        else:
            op.global_mix(q, k, v)
    assert op.core_flops(n, d) == pytest.approx(counter.flops / heads, rel=0.02)


def test_flop_share_goal_divides_the_speedup_by_the_flop_bound():
    bound = flop_bound("linear", 4096, 64)                  # softmax 4 N^2 d over 4 N d^2 + 2 N d
    assert bound == pytest.approx(4096 * 64 / (64 * 64 + 32))
    for speed, holds in ((32.0, "yes"), (30.0, "NO")):     # 32 / 63.5 = 0.504, 30 / 63.5 = 0.47
        cfg = load_config(BenchConfig, None, ["goal_flop_share={linear: 0.5}"])
        result = {g["goal"]: g for g in goals(synthetic(speed), cfg)}
        share = result[f"linear/torch share of its FLOP bound ({bound:.1f}x) at N=4096"]
        assert (share["measured"], share["holds"]) == (f"{speed / bound:.2f}", holds)
