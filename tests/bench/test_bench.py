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
from linvit.bench.ratios import flop_bound, flop_table, goals, slopes, speedups
from linvit.cli import main
from linvit.config import load_config
from linvit.ops import cpp_kernels
from linvit.ops.backends import backend
from markdown_rows import has_row

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
              device: str = "cpu", passes: tuple = (1.0,)) -> pd.DataFrame:
    """Exact power laws: softmax time and memory = N^2 / 2^20; the linear core's time grows as N
    and is `ops_speed` times softmax's at N=4096, its memory is N^memory_power / 2^10. With
    powers of two, the speedups 32 (N=4096) and 2 (N=256) of the default are exact floats.
    `passes`: one pass per factor, in which the machine runs softmax that much slower."""
    fast = {"cpu": "torch", "cuda": "triton"}[device]
    rows = []
    for repeat, slow in enumerate(passes):
        for n in (256, 1024, 4096, 16384):
            common = {"tokens": n, "batch": 1, "heads": 6, "head_dim": 64, "device": device,
                      "part": "core", "repeat": repeat}
            if n <= 4096:
                rows.append({**common, "operator": "softmax", "backend": "sdpa",
                             "ms": slow * n * n / 2**20, "peak_mib": n * n / 2**20})
            rows.append({**common, "operator": "linear", "backend": fast,
                         "ms": 4096 * n / 2**20 / ops_speed,
                         "peak_mib": n**memory_power / 2**10})
    return pd.DataFrame(rows)


def test_a_point_slow_on_its_first_two_calls_is_timed_warm():
    """Two cold calls (a forward and a backward that each compile once) outlast min_run_time:
    neither may be the timed one."""
    import time

    from linvit.bench.measure import median_seconds
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= 2:
            time.sleep(0.05)
    assert median_seconds(fn, min_run_time=0.01) < 0.025


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


BOUND = 4096 * 64 / (64 * 64 + 32)         # linear: softmax's 4 N^2 d over 4 N d^2 + 2 N d
SHARE_GOAL = f"linear/torch share of its FLOP bound ({BOUND:.1f}x) at N=4096"
SLOPE_GOAL = "linear/torch memory slope, N=256..16384"


@pytest.mark.parametrize("speed, goal, holds", [
    (32.0, 32.0 / BOUND, "yes"),        # exactly at the target: ">=" holds
    (32.0, 0.45, "yes"),
    (16.0, 0.45, "NO"),
    (64.0, 0.75, "yes"),
    (40.0, 0.75, "NO"),
])
def test_share_goal_verdicts_on_known_speedups(speed, goal, holds):
    assert flop_bound("linear", 4096, 64) == pytest.approx(BOUND)
    cfg = load_config(BenchConfig, None, [f"goal_share={{default: 1.0, linear: {goal!r}}}"])
    result = {g["goal"]: g for g in goals(synthetic(speed), cfg)}
    assert set(result) == {SHARE_GOAL, SLOPE_GOAL}
    assert result[SHARE_GOAL] == {"goal": SHARE_GOAL, "measured": f"{speed / BOUND:.2f}",
                                  "target": f">= {goal:g}", "holds": holds}


def test_the_share_goal_is_the_median_of_interleaved_passes_with_their_range():
    """Three passes, softmax slowed 0.5x, 1x and 4x in them: speedups 16, 32 and 128. The
    median decides, the range is shown; one slow pass cannot pass the goal."""
    cfg = load_config(BenchConfig)
    assert cfg.share_goal("linear") == 0.75 and cfg.share_goal("gla") == 0.6    # by family
    ops = synthetic(32.0, passes=(0.5, 1.0, 4.0))
    result = {g["goal"]: g for g in goals(ops, cfg)}[SHARE_GOAL]
    assert result["measured"] == (f"{32 / BOUND:.2f} (range {16 / BOUND:.2f}-{128 / BOUND:.2f} "
                                  "over 3 passes)")
    assert result["holds"] == "NO"                        # 0.50 < 0.75, though 2.02 in one
    assert speedups(ops).loc[("linear", "torch", "core"), 4096] == 32.0
    table = flop_table(ops, cfg)
    assert table.loc["linear", "share"] == pytest.approx(32 / BOUND)
    assert table.loc["linear", "share range"] == f"{16 / BOUND:.2f}-{128 / BOUND:.2f} (3)"
    assert table.loc["linear", "goal"] == 0.75


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
    assert set(result) == {f"linear/triton share of its FLOP bound ({BOUND:.1f}x) at N=4096",
                           "linear/triton memory slope, N=256..16384",
                           "linear/triton vs reference at N=4096",
                           "linear/triton vs reference at N=16384"}
    assert result["linear/triton vs reference at N=4096"]["measured"] == "3.00x"
    assert result["linear/triton vs reference at N=4096"]["holds"] == "yes"
    assert result["linear/triton vs reference at N=16384"]["measured"] == "1.50x"
    assert result["linear/triton vs reference at N=16384"]["holds"] == "NO"


TINY = ["tokens=[16,64]", "softmax_max_tokens=64", "min_run_time=0.01", "goal_tokens=64",
        "repeats=2",
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
    # softmax + (reference, torch) cores + the fused mix of operators with a local term, x 2 N,
    # x 2 passes
    assert len(ops) == 2 * 2 * (1 + 2 * len(linear_ops) + len(local))
    assert (ops.ms > 0).all() and (ops.peak_mib > 0).all()
    models = pd.read_csv(out / "models.csv")
    assert set(models.operator) == set(OPERATORS) and (models.tokens == 5).all()
    text = (out / "ratios.md").read_text()
    assert "## Goals" in text and "linear/torch share of its FLOP bound" in text
    assert "## Goals" in capsys.readouterr().out
    for stem in ("ops_scaling", "ops_share", "models_throughput"):
        assert (out / f"{stem}.png").stat().st_size > 0
    assert not list(out.glob("*.partial.csv"))                  # replaced by the complete files
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics["goals"]) == 2 * len(linear_ops)           # share and memory slope
    assert set(ops.repeat) == {0, 1}                             # TINY: 2 interleaved passes
    assert ops.groupby(["operator", "backend", "part", "tokens"]).peak_mib.nunique().max() == 1
    assert isinstance(metrics["goals_hold"], bool)      # its value: the test below


@pytest.mark.parametrize("sweep", ["ops", "models"])
def test_a_stopped_bench_keeps_the_rows_it_measured_and_claims_nothing(tmp_path, monkeypatch,
                                                                       sweep):
    """A time limit (a short GPU lease) stops the run inside a sweep: the points measured so far
    are in <sweep>.partial.csv; no complete table, ratios or metrics say it finished."""
    import linvit.bench.models as models_mod
    import linvit.bench.operators as ops_mod

    module, name = (ops_mod, "bench_operator") if sweep == "ops" else (models_mod, "bench_model")
    real, calls = getattr(module, name), []

    def stopped_at_the_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt                   # what SIGINT from `timeout -s INT` raises
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, stopped_at_the_third)
    out = tmp_path / "bench"
    with pytest.raises(KeyboardInterrupt):
        main(["bench", "-o", str(out), *TINY, "operators=[softmax,linear]",
              "models.operators=[softmax,linear]", "models.resolutions=[32,48]"])
    assert len(pd.read_csv(out / f"{sweep}.partial.csv")) == 2
    assert not (out / f"{sweep}.csv").exists()
    assert not (out / "ratios.md").exists() and not (out / "metrics.json").exists()


def test_a_softmax_only_bench_times_the_models_and_claims_no_goal(tmp_path):
    """operators=[softmax] is how a short GPU lease times whole models only: the tables of the
    linear cores are empty (not an error after the compute), and no goal is said to hold."""
    out = tmp_path / "bench"
    assert main(["bench", "-o", str(out), *TINY, "operators=[softmax]",
                 "models.operators=[softmax,linear]"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["goals"] == [] and metrics["goals_hold"] is None
    text = (out / "ratios.md").read_text()
    assert has_row(text, "deit_t", "linear") and "## Goals" in text
    from linvit.report.document import bench_section
    section = "".join(bench_section({"status": "ok", "run_dir": str(out), "metrics": metrics},
                                    rel=str))
    assert "Goals hold: none measured" in section


@pytest.mark.parametrize("speed, goals_hold", [(32.0, True), (16.0, False)])
def test_bench_cli_reports_whether_the_goals_hold(tmp_path, monkeypatch, speed, goals_hold):
    """The CLI on a measured frame whose verdicts are known: 32x is a share of 0.50 of linear's
    bound, which meets a goal of 0.45, 16x (0.25) does not; the memory slope (1.0 <= 1.1) holds
    either way."""
    import linvit.bench.stage as stage

    monkeypatch.setattr(stage, "sweep_operators",
                        lambda cfg, device, on_row=None: synthetic(speed).to_dict("records"))
    out = tmp_path / "bench"
    assert main(["bench", "-o", str(out), "goal_share={default: 0.45}", "models=null",
                 "run.threads=1", "operators=[softmax,linear]"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    verdicts = {g["goal"]: (g["measured"], g["holds"]) for g in metrics["goals"]}
    assert verdicts == {SHARE_GOAL: (f"{speed / BOUND:.2f}", "yes" if goals_hold else "NO"),
                        SLOPE_GOAL: ("1.00", "yes")}
    assert metrics["goals_hold"] is goals_hold
    assert (out / "ops_share.png").stat().st_size > 0


@pytest.mark.parametrize("override, message", [
    ("tokens=[16,50]", "tokens[1]: 50 is not a positive square"),
    ("operators=[linear]", "operators: must include softmax"),
    ("models.resolutions=[40]", "models.resolutions[0]: 40 is not a positive multiple"),
    ("operators=[softmax,lineer]", "operators[1]: 'lineer' is not one of"),
    ("goal_share={gated: 0.5}", "goal_share: needs a `default`"),
    ("goal_share={default: 0.6, gatd: 0.5}", "goal_share: 'gatd' is not one of"),
    ("repeats=0", "repeats"),
    ("compiled=[softmax]", "compiled[0]: 'softmax' is not one of"),
    ("compiled=[gla]", "compiled[0]: 'gla' is not one of"),      # not among the operators
    ("compile_backend=nope", "compile_backend: unknown torch.compile backend 'nope'"),
])
def test_bench_config_errors_name_the_field_before_any_output(tmp_path, capsys, override, message):
    out = tmp_path / "bench"
    extra = ["operators=[softmax,linear]", "compiled=[linear]"] if "compile" in override else []
    assert main(["bench", "-o", str(out), *extra, override]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_compiled_share_goals_read_the_compiled_rows():
    """A compiled core twice as fast as the fused one: its own share goal, at twice the share;
    the fused core's verdict is unchanged."""
    ops = synthetic(16.0)
    fast = ops[ops.backend == "torch"]
    ops = pd.concat([ops, fast.assign(backend="compiled", ms=fast.ms / 2)], ignore_index=True)
    cfg = load_config(BenchConfig, None, ["goal_share={default: 1.0, linear: 0.45}"])
    result = {g["goal"]: g for g in goals(ops, cfg)}
    compiled = f"linear/compiled share of its FLOP bound ({BOUND:.1f}x) at N=4096"
    assert set(result) == {SHARE_GOAL, SLOPE_GOAL, compiled}
    assert (result[SHARE_GOAL]["measured"], result[SHARE_GOAL]["holds"]) == (
        f"{16 / BOUND:.2f}", "NO")
    assert (result[compiled]["measured"], result[compiled]["holds"]) == (f"{32 / BOUND:.2f}", "yes")
    table = flop_table(ops, cfg)
    assert table.loc["linear", "share"] == pytest.approx(16 / BOUND)
    assert table.loc["linear", "compiled share"] == pytest.approx(32 / BOUND)


def test_bench_cli_times_compiled_cores_once_compiled(tmp_path):
    """`compiled`: the named operator's core gets compiled rows (aot_eager here: no C++ compiler
    needed), its compile time on the first pass only, and gradients equal to the eager step's."""
    out = tmp_path / "bench"
    assert main(["bench", "-o", str(out), *TINY, "models=null", "operators=[softmax,linear]",
                 "compiled=[linear]", "compile_backend=aot_eager"]) == 0
    ops = pd.read_csv(out / "ops.csv")
    compiled = ops[ops.backend == "compiled"]
    assert len(compiled) == 4 and set(compiled.operator) == {"linear"}     # 2 N x 2 passes
    assert compiled[compiled.repeat == 0].compile_s.gt(0).all()
    assert compiled[compiled.repeat == 1].compile_s.isna().all()           # compiled once
    assert "linear/compiled share of its FLOP bound" in (out / "ratios.md").read_text()
    from linvit.bench.operators import make_step
    op = make_operator("linear", 2, 8, 16, CPU)
    eager = make_step(op, 1, 16, 8, CPU, "core")()
    again = make_step(op, 1, 16, 8, CPU, "core", compile_backend="aot_eager")()
    for a, b in zip(eager, again):
        torch.testing.assert_close(a, b)


def test_compiled_points_beyond_dynamos_default_cache_are_compiled_too(tmp_path):
    """Three operators x 3 N compiled: 9 versions of the shared global_mix wrapper, one more
    than dynamo keeps by default. Every frame dynamo is given must compile, none fall back to
    eager (seen failing without the bench's cache room: 11 of 12 frames, the 9th point's wrapper
    run eagerly after "hit config.recompile_limit (8)")."""
    from torch._dynamo.utils import counters

    counters.clear()
    out = tmp_path / "bench"
    assert main(["bench", "-o", str(out), "tokens=[16,64,256]", "softmax_max_tokens=64",
                 "min_run_time=0.01", "goal_tokens=64", "repeats=1", "models=null",
                 "run.threads=1", "operators=[softmax,linear,inline,hedgehog]",
                 "compiled=[linear,inline,hedgehog]", "compile_backend=aot_eager"]) == 0
    compiled = pd.read_csv(out / "ops.csv").query("backend == 'compiled' and part == 'core'")
    assert len(compiled) == 9
    assert counters["frames"]["total"] >= 9
    assert counters["frames"]["ok"] == counters["frames"]["total"]


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
def test_flop_counts_are_the_matmuls_the_fast_path_runs(name, monkeypatch):
    """core_flops against the matrix products the CPU fast path runs (softmax: its explicit map
    times V, as SDPA's CPU kernel is one opaque op), at a length of whole chunks (320 tokens:
    5 x 64, 10 x 32); padded lengths are counted in tests/ops. Counted on the PyTorch paths:
    linvit's C++ kernels run inside ops the counter cannot open (tests/ops holds them to the same
    results; docs/2026-12-05-cpp-scans.md says which products they run)."""
    monkeypatch.setattr(cpp_kernels, "load", lambda: False)
    heads, d, n = 2, 32, 320
    op = make_operator(name, heads, d, 324, CPU)          # an 18 x 18 grid for local terms
    q, k, v = (torch.randn(1, heads, n, d) for _ in range(3))
    with backend("torch"), MatmulFlops() as counter:
        if name == "softmax":
            op.attention_map(q, k) @ v
        else:
            op.global_mix(q, k, v)
    assert op.core_flops(n, d) == pytest.approx(counter.flops / heads, rel=0.02)


@pytest.mark.parametrize("name", [o for o in OPERATORS if o != "softmax"])
def test_every_operator_has_a_family_and_so_a_share_goal(name):
    from linvit.attention.base import FAMILIES
    assert OPERATORS[name].family in FAMILIES[1:]
    assert BenchConfig().share_goal(name) == (0.75 if OPERATORS[name].family == "feature map"
                                              else 0.6)


def test_an_operator_outside_the_families_is_refused_at_definition():
    from linvit.attention.base import AttentionOperator
    with pytest.raises(TypeError, match="family 'kernel' not one of"):
        type("Odd", (AttentionOperator,), {"name": "odd", "family": "kernel"})
