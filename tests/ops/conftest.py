"""Fixtures of the ops tests."""
from __future__ import annotations

import os
import shutil

import pytest

from linvit.ops import cpp_kernels


@pytest.fixture(params=["cpp", "fused"])
def cpu_path(request, monkeypatch):
    """The torch backend's two CPU implementations: linvit's C++ kernel, and the fused PyTorch
    Function that runs where the kernel cannot be built. The kernel's cases fail, not skip, where
    a compiler exists and the kernel still does not load."""
    if request.param == "fused":
        monkeypatch.setattr(cpp_kernels, "load", lambda: False)
    elif shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler to build linvit's CPU kernel")
    else:
        assert cpp_kernels.load(), cpp_kernels.status()
    return request.param
