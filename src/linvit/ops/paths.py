"""Which path one call of an attention core takes: decided by `choose`, which each core family's
own function calls with what its kernels take (linear attention: linear_attention.linear_path;
the gated scan: gated_scan.gated_path; the delta rule: delta_rule.delta_path; TTT: ttt.ttt_path),
as fla's layers pick a `mode`:

  reference  plain PyTorch + autograd: the readable definition (backend("reference"));
  torch      linvit's fused or chunked PyTorch path;
  cpp        linvit's C++ CPU kernel (linvit.ops.cpp_kernels): the torch path's form on the CPU
             for the inputs it takes, where the kernel loads (cpp_kernels.disabled() turns it off);
  triton     linvit's Triton kernels (linear attention) or flash-linear-attention's (gated scan,
             delta rule): CUDA.

The device picks (linvit.ops.backends: "auto"), or `backend(name)` forces reference, torch or
triton for a block. Each distinct decision (family, path, device, and why a faster path was not
taken) is logged once, at INFO, or at WARNING when a Triton or fla kernel asked for could not
take the call; not from inside a torch.compile trace (which would break the graph).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from linvit.ops import cpp_kernels
from linvit.ops.backends import resolve_backend

log = logging.getLogger("linvit")

PATHS = ("reference", "torch", "cpp", "triton")
_SAID: set[tuple] = set()


def choose(family: str, t: torch.Tensor, cpp: bool = False,
           triton: Callable[[], str | None] | None = None) -> str:
    """The path of a call of a `family` core on `t`. `cpp`: whether the C++ kernel takes these
    inputs; `triton`: the family's GPU kernels' check, returning None when they take the call
    or why not (None as the argument: the family has no kernel of its own there)."""
    name, why = resolve_backend(t), ""
    if name == "triton":
        why = triton() if triton is not None else ""
        if why is None:
            return _said(family, "triton", t)
        name = "torch"
    if name == "torch" and cpp and not t.is_cuda and cpp_kernels.load():
        name = "cpp"
    return _said(family, name, t, why)


def _said(family: str, path: str, t: torch.Tensor, why: str = "") -> str:
    if torch.compiler.is_compiling():
        return path
    key = (family, path, t.device.type, why)
    if key not in _SAID:
        _SAID.add(key)
        if why:
            log.warning("%s: %s; using the %s path", family, why, path)
        else:
            log.info("%s: the %s path on %s", family, path, t.device.type)
    return path


def forget() -> None:
    """Say every decision again (tests of what is said count from a clean slate)."""
    _SAID.clear()
