"""Which implementation an attention core runs: the backends every core shares, and the choice.

  reference  plain PyTorch + autograd: the readable definition;
  torch      fused autograd Functions and chunked paths in PyTorch: the CPU default;
  triton     fused kernels (linear attention), or flash-linear-attention's kernels (gated and
             delta-rule cores): CUDA.
`backend("name")` forces one for every core called inside the block (benchmarks and tests);
"auto" picks by device.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging

import torch

log = logging.getLogger("linvit")

BACKENDS = ("auto", "reference", "torch", "triton")
_BACKEND = contextvars.ContextVar("linvit_linear_attention_backend", default="auto")


@contextlib.contextmanager
def backend(name: str):
    """Force the backend of every attention core called inside the block."""
    if name not in BACKENDS:
        raise ValueError(f"unknown linear-attention backend {name!r}; allowed: {BACKENDS}")
    token = _BACKEND.set(name)
    try:
        yield
    finally:
        _BACKEND.reset(token)


# The answer, once known. A list rather than functools.cache: a compiled model asks on every
# trace, and dynamo ignores (and warns about) a functools cache, tracing the body each time.
_TRITON: list[bool] = []


def triton_available() -> bool:
    if not _TRITON:
        _TRITON.append(_load_triton())
    return _TRITON[0]


triton_available.cache_clear = _TRITON.clear   # as functools' caches have it (tests ask again)


def _load_triton() -> bool:
    try:
        import linvit.ops.triton_kernels  # noqa: F401
    except Exception as exc:              # no triton, or a triton that cannot load here
        # A missing triton is expected (CPU installs); any other failure would turn Triton off
        # unnoticed, so it is said once.
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == "triton"):
            log.warning("linear attention: Triton kernels unavailable (%s: %s); using the fused "
                        "PyTorch path", type(exc).__name__, exc)
        return False
    return True


def resolve_backend(t: torch.Tensor) -> str:
    name = _BACKEND.get()
    if name == "auto":
        return "triton" if t.is_cuda and triton_available() else "torch"
    if name == "triton" and not triton_available():
        raise RuntimeError("backend 'triton' requested but triton cannot be imported")
    return name
