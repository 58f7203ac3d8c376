"""linvit's C++ CPU kernel for linear attention (csrc/linear_attention.cpp), built on first use.

Why a C++ kernel: on the CPU, the fused PyTorch path (fused_torch.py) spends about half its time
in memory-bound passes over (N, d) tensors around its matrix products (feature maps, their
derivatives, the normaliser). The kernel works on blocks of rows while they sit in cache, one
(head, block) per task, and calls BLAS once per block product; the measured gain is in
docs/2026-12-05-cpp-linear-attention.md. Same formulas as fused_torch.py, held to the einsum
reference by tests/ops/test_kernels.py.

Building: torch.utils.cpp_extension compiles it once (about 10 s) into
`$LINVIT_CACHE/cpp/<key>` (default ~/.cache/linvit), the key covering the source, torch, Python
and the CPU (it is compiled for the CPU it runs on); `./scripts/setup.sh` builds it ahead. It
needs a C++ compiler with OpenMP and the BLAS that torch's wheels export (MKL on x86). Where it
cannot be built or loaded, or with LINVIT_CPP=0, the fused PyTorch path runs instead: the reason
is logged once, and `status()` (metrics.json's env) says which path ran.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger("linvit")

SOURCE = Path(__file__).parent / "csrc" / "linear_attention.cpp"      # includes feature_maps.h
# -ffast-math at compile time only (not at link, which would set flush-to-zero process-wide):
# it lets GCC call glibc's vectorised exp. -fopenmp at compile time only: at::parallel_for's
# OpenMP pragmas then run on torch's own OpenMP runtime, which the kernel links through torch.
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
ROWS = 512           # rows per task: a block of q, k, v and its buffers stay in L2
FEATURE_CODES = {"identity": 0, "elu1": 1, "focused": 2}    # csrc/feature_maps.h's Kind

_STATE: dict[str, object] = {}     # "ok": bool, "reason": why not


def cache_dir() -> Path:
    return Path(os.environ.get("LINVIT_CACHE", Path.home() / ".cache" / "linvit"))


def _cpu_name() -> str:
    from linvit.runs.environment import cpu_model
    return cpu_model()


def build_key() -> str:
    """What the binary depends on: the sources, the flags, torch, Python and the CPU."""
    sources = sorted(SOURCE.parent.glob("*.[ch]*"))
    parts = [*(f.read_bytes() for f in sources), " ".join(CFLAGS).encode(),
             torch.__version__.encode(), sys.version.encode(), platform.machine().encode(),
             _cpu_name().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def load() -> bool:
    """Build (once) and load the kernel; False, with the reason logged once, where it cannot."""
    if "ok" in _STATE:
        return bool(_STATE["ok"])
    if os.environ.get("LINVIT_CPP", "1") == "0":
        return _unavailable("LINVIT_CPP=0", quiet=True)
    try:
        _build()
    except Exception as exc:                 # no compiler, no OpenMP, no BLAS symbols, ...
        return _unavailable(f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1:]}")
    _STATE["ok"] = True
    return True


def _build() -> None:
    # its import warns that a CPU-only machine has no CUDA runtime: true, and nothing to act on
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension
    key = build_key()
    directory = cache_dir() / "cpp" / key
    directory.mkdir(parents=True, exist_ok=True)
    if not any(directory.glob("*.so")):
        log.info("building linvit's C++ CPU kernel for linear attention (once, ~10 s) in %s",
                 directory)
    cpp_extension.load(name=f"linvit_cpu_{key}", sources=[str(SOURCE)], extra_cflags=CFLAGS,
                       build_directory=str(directory), is_python_module=False, verbose=False)
    _register_fake()


def _unavailable(reason: str, quiet: bool = False) -> bool:
    _STATE.update(ok=False, reason=reason)
    (log.info if quiet else log.warning)(
        "linear attention: C++ CPU kernel not used (%s); using the fused PyTorch path", reason)
    return False


def status() -> str:
    """Which CPU path linear attention took in this process (metrics.json's env): asks nothing
    new, so a run that never reached it says so rather than building the kernel."""
    if "ok" not in _STATE:
        return "not used"
    return "C++ kernel" if _STATE["ok"] else f"fused PyTorch ({_STATE['reason']})"


def _register_fake() -> None:
    """Shapes for torch.compile's tracing: the ops are opaque to it, as any extension's are."""
    lib = "linvit_cpu::"

    @torch.library.register_fake(lib + "linear_forward")
    def _(q, k, v, kind, normalize, eps, rows, sp, p):
        bh, _, dk = q.shape
        dv = v.shape[-1]
        z = q.new_empty(bh, dk) if normalize else q.new_empty(0)
        return q.new_empty(bh, q.shape[1], dv), q.new_empty(bh, dk, dv), z

    @torch.library.register_fake(lib + "linear_backward")
    def _(g, q, k, v, out, s, z, kind, normalize, eps, rows, sp, p):
        dsp = q.new_empty(q.shape[0], q.shape[2]) if sp is not None else q.new_empty(0, q.shape[2])
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsp


class CppLinearAttention(torch.autograd.Function):
    """The kernel's forward and backward on (B*H, N, d) float32 views; q, k, v, the output, S
    and z are kept for backward, where the feature maps are recomputed. `scale` is the focused
    map's per-(head, channel) s, (1, H, 1, Dk), with its power p."""

    @staticmethod
    def forward(ctx, q, k, v, kind: str, normalize: bool, eps: float, scale=None, p: float = 0.0):
        shape, dtype = q.shape[:-2], v.dtype
        q3, k3, v3 = (t.float().reshape(-1, *t.shape[-2:]).contiguous() for t in (q, k, v))
        sp = None
        if scale is not None:             # softplus(s), one row per (batch, head)
            sp = F.softplus(scale.float()).expand(*shape, 1, q.shape[-1])
            sp = sp.reshape(q3.shape[0], q.shape[-1]).contiguous()
        code = FEATURE_CODES[kind]
        out, s, z = torch.ops.linvit_cpu.linear_forward(q3, k3, v3, code, normalize, eps, ROWS,
                                                        sp, p)
        ctx.save_for_backward(q3, k3, v3, out, s, z, sp, scale)
        ctx.args = (code, normalize, eps, p, (q.shape, k.shape, v.shape),
                    (q.dtype, k.dtype, dtype))
        return out.view(*shape, *out.shape[-2:]).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        q3, k3, v3, out, s, z, sp, scale = ctx.saved_tensors
        code, normalize, eps, p, shapes, dtypes = ctx.args
        g = grad.float().reshape(out.shape).contiguous()
        *grads, dsp = torch.ops.linvit_cpu.linear_backward(g, q3, k3, v3, out, s, z, code,
                                                           normalize, eps, ROWS, sp, p)
        dq, dk, dv = (d.view(sh).to(dt) for d, sh, dt in zip(grads, shapes, dtypes))
        dscale = None
        if scale is not None:             # summed over the batch, through the softplus
            dscale = dsp.view(-1, *scale.shape[1:]).sum(0, keepdim=True)
            dscale = (dscale * torch.sigmoid(scale.float())).to(scale.dtype)
        return dq, dk, dv, None, None, None, dscale, None


def cpp_linear_attention(q, k, v, kind: str, normalize: bool, eps: float, scale=None,
                         p: float = 0.0) -> torch.Tensor:
    return CppLinearAttention.apply(q, k, v, kind, normalize, eps, scale, p)
