"""linvit's C++ CPU kernels, built on first use: linear attention (csrc/linear_attention.cpp, its
autograd Function here), the delta rule (csrc/delta_rule.cpp, ops/delta_rule/cpp.py) and the gated
scan (csrc/gated_scan.cpp, ops/gated_scan/cpp.py).

Why a C++ kernel: on the CPU, the fused PyTorch path (fused_torch.py) spends about half its time
in memory-bound passes over (N, d) tensors around its matrix products (feature maps, their
derivatives, the normaliser). The kernel works on blocks of rows while they sit in cache, one
(head, block) per task, and calls BLAS once per block product; the measured gain is in
docs/2026-12-05-cpp-linear-attention.md. Same formulas as fused_torch.py, held to the einsum
reference by tests/ops/test_kernels.py.

Building: torch.utils.cpp_extension compiles it once (about 20 s on 2 cores) into
`$LINVIT_CACHE/cpp/<key>` (default ~/.cache/linvit), the key covering the source, torch, Python
and the CPU (it is compiled for the CPU it runs on); `./scripts/setup.sh` builds it ahead. It
needs a C++ compiler with OpenMP and the BLAS that torch's wheels export (MKL on x86). Where it
cannot be built or loaded, or with LINVIT_CPP=0, the fused PyTorch path runs instead: the reason
is logged once, and `status()` (metrics.json's env) says which path ran.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import platform
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from linvit.machine import cpu_model

log = logging.getLogger("linvit")

CSRC = Path(__file__).parent / "csrc"          # the .cpp files, one library; headers included
# -ffast-math at compile time only (not at link, which would set flush-to-zero process-wide):
# it lets GCC call glibc's vectorised exp. -fopenmp at compile time only: at::parallel_for's
# OpenMP pragmas then run on torch's own OpenMP runtime, which the kernel links through torch.
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
ROWS = 512           # rows per task: a block of q, k, v and its buffers stay in L2
# InLine's core takes the kernel from this many tokens (measured crossover: ~80, see
# docs/2026-12-05-cpp-linear-attention.md); the maps with passes to fuse take it at any length
CENTRED_MIN_TOKENS = 100
# feature_maps.h's Kind ("inline": InLine's centred core, identity features, p its scale)
FEATURE_CODES = {"identity": 0, "elu1": 1, "focused": 2, "hedgehog": 3, "inline": 4}

_STATE: dict[str, object] = {}     # "ok": bool, "reason": why not
_FAKES: list[bool] = []
_OFF = contextvars.ContextVar("linvit_cpp_kernel_off", default=False)      # disabled()


def kernel_files(source: str) -> list[Path]:
    """A kernel's .cpp under csrc/ and every header it includes, transitively (`#include "x"`):
    what its result depends on, for the code stamps of the jobs that can run it."""
    todo, seen = [CSRC / source], []
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a C++ source named by an operator or an #include "
                                    "is missing")
        seen.append(path)
        todo += [CSRC / name for name in re.findall(r'^\s*#include\s+"([^"]+)"',
                                                    path.read_text(), re.M)]
    return sorted(seen)


def kernel_ops(source: str) -> set[str]:
    """The torch ops a kernel's .cpp defines (its `m.def("name(...")` lines)."""
    return set(re.findall(r'm\.def\("(\w+)\(', (CSRC / source).read_text()))


def cache_dir() -> Path:
    return Path(os.environ.get("LINVIT_CACHE", Path.home() / ".cache" / "linvit"))


def build_key() -> str:
    """What the binary depends on: the sources, the flags, torch, Python and the CPU."""
    sources = sorted(CSRC.glob("*.[ch]*"))
    parts = [*(f.read_bytes() for f in sources), " ".join(CFLAGS).encode(),
             torch.__version__.encode(), sys.version.encode(), platform.machine().encode(),
             cpu_model().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


# Under torch.compile the first call may come inside a trace: dynamo then runs it eagerly and
# takes its answer as a constant (no graph break, and the build does not happen in the graph).
@torch._dynamo.assume_constant_result
def load() -> bool:
    """Build (once) and load the kernel; False, with the reason logged once, where it cannot
    (and inside `disabled()`)."""
    if _OFF.get():
        return False
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


@contextlib.contextmanager
def disabled():
    """The PyTorch paths inside the block, as LINVIT_CPP=0 gives a whole process: the kernels
    timed against what they replace in one run (scripts/bench_step.py, cpp_kernel_ab.py).
    `disabled()(fn)` is fn with the kernels off on every call."""
    token = _OFF.set(True)
    try:
        yield
    finally:
        _OFF.reset(token)


def _build() -> None:
    key = build_key()
    directory = cache_dir() / "cpp" / key
    library = directory / f"linvit_cpu_{key}.so"
    if library.is_file():               # built before for these sources, torch and CPU: load it
        try:                            # as it is (cpp_extension would rebuild it for a clone
            torch.ops.load_library(str(library))        # at another path, ~10 s per process)
            return _register_fake()
        except OSError as exc:          # a broken file: build it again
            log.warning("rebuilding linvit's C++ CPU kernels (%s)", exc)
    # its import warns that a CPU-only machine has no CUDA runtime: true, and nothing to act on
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension
    directory.mkdir(parents=True, exist_ok=True)
    log.info("building linvit's C++ CPU kernels (once, ~20 s) in %s", directory)
    cpp_extension.load(name=f"linvit_cpu_{key}", sources=sorted(map(str, CSRC.glob("*.cpp"))),
                       extra_cflags=CFLAGS,
                       build_directory=str(directory), is_python_module=False, verbose=False)
    _register_fake()


def _unavailable(reason: str, quiet: bool = False) -> bool:
    _STATE.update(ok=False, reason=reason)
    (log.info if quiet else log.warning)(
        "linvit's C++ CPU kernels not used (%s); using the PyTorch paths", reason)
    return False


def status() -> str:
    """Which CPU path linear attention took in this process (metrics.json's env): asks nothing
    new, so a run that never reached it says so rather than building the kernel."""
    if "ok" not in _STATE:
        return "not used"
    return "C++ kernels" if _STATE["ok"] else f"PyTorch ({_STATE['reason']})"


def _register_fake() -> None:
    """Shapes for torch.compile's tracing: the ops are opaque to it, as any extension's are.
    Once per process (a second registration is an error; load() may be asked again in tests)."""
    if _FAKES:
        return
    _FAKES.append(True)
    lib = "linvit_cpu::"

    @torch.library.register_fake(lib + "linear_forward")
    def _(q, k, v, kind, normalize, eps, rows, params, p):
        bh, n, dx = q.shape
        dk, dv = (2 * dx if kind == FEATURE_CODES["hedgehog"] else dx), v.shape[-1]
        z = q.new_empty(bh, dk) if normalize else q.new_empty(0)
        if kind == FEATURE_CODES["inline"]:              # the means of k and v
            z = q.new_empty(bh, dk + dv)
        return q.new_empty(bh, n, dv), q.new_empty(bh, dk, dv), z

    @torch.library.register_fake(lib + "linear_backward")
    def _(g, q, k, v, out, s, z, kind, normalize, eps, rows, params, p):
        return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
                [torch.empty_like(t) for t in params])

    @torch.library.register_fake(lib + "delta_forward")
    def _(q, k, v, beta, chunk):        # out; per direction A, T, P, W, N and the states
        bh, n, dk = q.shape
        m, dv = n // chunk, v.shape[-1]
        return [q.new_empty(bh, n, dv), *(q.new_empty(2, bh, m, chunk, chunk) for _ in range(3)),
                q.new_empty(2, bh, n, dk), q.new_empty(2, bh, n, dv), q.new_empty(2, bh, m, dk, dv)]

    @torch.library.register_fake(lib + "gated_forward")
    def _(q, k, v, log_a, w, chunk, strict):     # out, the states, Q K^T (scalar decays)
        bh, n, dk = q.shape
        scalar = log_a.shape[-1] == 1
        return [q.new_empty(bh, n, v.shape[-1]), q.new_empty(2, bh, n // chunk, dk, v.shape[-1]),
                q.new_empty(bh if scalar else 0, n // chunk, chunk, chunk)]

    @torch.library.register_fake(lib + "gated_backward")
    def _(g, q, k, v, log_a, w, states, qk, chunk, strict):
        return [torch.empty_like(t) for t in (q, k, v, log_a, w)]

    @torch.library.register_fake(lib + "delta_backward")
    def _(g, q, k, v, beta, saved, chunk):
        return [torch.empty_like(t) for t in (q, k, v, beta)]


class CppLinearAttention(torch.autograd.Function):
    """The kernel's forward and backward on (B*H, N, d) float32 views; q, k, v, the output, S
    and z are kept for backward, where the feature maps are recomputed. `params` are the map's
    parameters as the operator holds them, one set per head: focused (s,) of (1, H, 1, d), with
    its power p; hedgehog (Wq, bq, Wk, bk) of (H, d, d) and (H, 1, d)."""

    @staticmethod
    def forward(ctx, q, k, v, kind: str, normalize: bool, eps: float, p: float, *params):
        shape, dtype = q.shape[:-2], v.dtype
        q3, k3, v3 = (t.float().reshape(-1, *t.shape[-2:]).contiguous() for t in (q, k, v))
        flat = _per_row(kind, params, shape)
        code = FEATURE_CODES[kind]
        out, s, z = torch.ops.linvit_cpu.linear_forward(q3, k3, v3, code, normalize, eps, ROWS,
                                                        flat, p)
        ctx.save_for_backward(q3, k3, v3, out, s, z, *flat, *params)
        ctx.args = (kind, normalize, eps, p, len(flat), (q.shape, k.shape, v.shape),
                    (q.dtype, k.dtype, dtype))
        return out.view(*shape, *out.shape[-2:]).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        q3, k3, v3, out, s, z, *rest = ctx.saved_tensors
        kind, normalize, eps, p, n_flat, shapes, dtypes = ctx.args
        flat, params = rest[:n_flat], rest[n_flat:]
        g = grad.float().reshape(out.shape).contiguous()
        *grads, d_flat = torch.ops.linvit_cpu.linear_backward(
            g, q3, k3, v3, out, s, z, FEATURE_CODES[kind], normalize, eps, ROWS, flat, p)
        dq, dk, dv = (d.view(sh).to(dt) for d, sh, dt in zip(grads, shapes, dtypes))
        return (dq, dk, dv, None, None, None, None, *_param_grads(kind, d_flat, params))


def _per_row(kind: str, params, shape) -> list[torch.Tensor]:
    """The maps' parameters as the kernel takes them: float32, one row per (batch, head)."""
    def rows(t, width):                  # (.., H, .., d) per head -> (B*H, ..) per (b, h)
        t = t.float().reshape(1, shape[1], *width)
        return t.expand(shape[0], *t.shape[1:]).reshape(-1, *width).contiguous()
    if kind == "focused":                # softplus(s): the kernel divides by it
        scale, = params
        return [rows(F.softplus(scale.float()), (scale.shape[-1],))]
    if kind == "hedgehog":
        return [rows(t, t.shape[1:] if i % 2 == 0 else (t.shape[-1],))
                for i, t in enumerate(params)]
    return []


def _param_grads(kind: str, d_flat, params) -> list[torch.Tensor]:
    """The kernel's per-(batch, head) gradients summed over the batch, in the parameters' shapes
    and dtypes (the focused map's through its softplus)."""
    grads = []
    for d, t in zip(d_flat, params):
        # hedgehog's are (H, ..) per head; focused's s is (1, H, 1, d)
        d = d.view(-1, *t.shape).sum(0) if kind == "hedgehog" else \
            d.view(-1, *t.shape[1:]).sum(0, keepdim=True)
        if kind == "focused":
            d = d * torch.sigmoid(t.float())
        grads.append(d.reshape(t.shape).to(t.dtype))
    return grads


def cpp_linear_attention(q, k, v, kind: str, normalize: bool, eps: float, p: float = 0.0,
                         *params) -> torch.Tensor:
    return CppLinearAttention.apply(q, k, v, kind, normalize, eps, p, *params)
