"""The compute path of each core family, decided in one function per family (linvit.ops.paths)
and said once: which inputs take the C++ kernel, what a forced backend gives, and the log."""
from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from linvit.ops import cpp_kernels, paths
from linvit.ops.backends import backend
from linvit.ops.delta_rule import delta_path
from linvit.ops.gated_scan import gated_path
from linvit.ops.linear_attention import linear_path
from linvit.ops.ttt import ttt_path


def x(n=50, dtype=torch.float32):
    return torch.zeros(1, 2, n, 8, dtype=dtype)


def decisions(kernel: bool) -> dict[str, str]:
    """Each family's path on the CPU for typical and edge inputs, kernel loading or not."""
    long = x(cpp_kernels.CENTRED_MIN_TOKENS)
    channel, scalar = torch.zeros(2, 1, 2, 50, 8), torch.zeros(2, 1, 2, 50, 1)
    cases = {
        "elu1": lambda: linear_path(x(), x(), "elu1", True),
        "identity, no normaliser": lambda: linear_path(x(), x(), "identity", False),
        "inline, short": lambda: linear_path(x(), x(), "inline", False),
        "inline, long": lambda: linear_path(long, long, "inline", False),
        "hedgehog": lambda: linear_path(x(), x(), "hedgehog", True),
        "gla": lambda: gated_path(x(), channel, None),
        "gla with key scales": lambda: gated_path(x(), channel, torch.ones(2, 1, 2, 50, 1)),
        "mamba2": lambda: gated_path(x(), scalar, torch.ones(2, 1, 2, 50, 1)),
        "gla float64": lambda: gated_path(x(dtype=torch.float64), channel, None),
        "deltanet": lambda: delta_path(x()),
        "deltanet bf16": lambda: delta_path(x(dtype=torch.bfloat16)),
        "deltanet float64": lambda: delta_path(x(dtype=torch.float64)),
        "ttt": lambda: ttt_path(x(), "swiglu"),
    }
    with cpp_kernels.disabled() if not kernel else contextlib.nullcontext():
        return {name: case() for name, case in cases.items()}


def test_the_cpu_takes_the_kernel_for_what_it_computes_and_the_torch_path_otherwise():
    if not cpp_kernels.load():
        pytest.skip(f"the C++ kernels do not load here: {cpp_kernels.status()}")
    torch_only = {"identity, no normaliser", "inline, short", "gla with key scales",
                  "gla float64", "deltanet float64", "ttt"}
    assert decisions(kernel=True) == {name: "torch" if name in torch_only else "cpp"
                                      for name in decisions(kernel=True)}
    assert set(decisions(kernel=False).values()) == {"torch"}


def test_a_forced_backend_is_each_family_s_path():
    with backend("reference"):
        assert set(decisions(kernel=True).values()) == {"reference"}
    with backend("torch"):
        assert set(decisions(kernel=False).values()) == {"torch"}


def test_each_decision_is_said_once(caplog):
    paths.forget()
    with caplog.at_level(logging.INFO, logger="linvit"), cpp_kernels.disabled():
        for _ in range(3):
            linear_path(x(), x(), "elu1", True)
            delta_path(x())
    said = [r.getMessage() for r in caplog.records]
    assert said == ["linear attention (elu1): the torch path on cpu",
                    "delta rule: the torch path on cpu"]
