"""scripts/core_profile.py: the time split of an operator's core into products and the rest."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from linvit.ops import cpp_kernels

SCRIPT = Path(__file__).parents[2] / "scripts" / "core_profile.py"


@pytest.fixture(scope="module")
def core_profile():
    spec = importlib.util.spec_from_file_location("core_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_products_share_counts_the_cores_matrix_products(core_profile, monkeypatch):
    """linear's core is products and elementwise passes (elu+1, the normaliser): both take
    time, and no product is among the other ops listed. (On the fused PyTorch path: the C++
    kernel is one op to the profiler, which the script's docstring says.)"""
    monkeypatch.setattr(cpp_kernels, "load", lambda: False)
    ms, products, rest = core_profile.split("linear", 64, 1)
    assert ms > 0 and 0.0 < products < 1.0
    assert rest and all(0.0 < share < 1.0 for _, share in rest)
    assert not any(f"aten::{name.rstrip('_')}" in core_profile.PRODUCTS for name, _ in rest)


def test_ceiling_is_the_share_over_the_products_share(core_profile, capsys, monkeypatch):
    monkeypatch.setattr(core_profile, "split", lambda name, tokens, calls: (1.0, 0.5, []))
    monkeypatch.setattr("sys.argv", ["core_profile.py", "--shares", "linear=0.3", "--",
                                     "linear"])
    core_profile.main()
    assert "| linear | 1.0 | 0.50 | 0.3 | 0.60 |" in capsys.readouterr().out
