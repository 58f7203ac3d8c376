"""Every operator's token mixing against the number of tokens, forward+backward.

Two parts of an operator are timed, forward and backward with respect to q, k, v and the
operator's own parameters (the qkv and output projections, which every operator shares, are not):

    core   global_mix: feature maps and the global token mixing, what softmax attention (torch's
           fused SDPA) does and what the goals compare with it;
    mix    core plus the operator's token-local term (the depthwise convs of focused and inline),
           reported for the operators that have one.

Each linear operator runs on every backend of linvit.ops that applies to the device, so the
reference rows show what the fused paths buy. The operators named in `compiled` are also timed as
backend `compiled`: the fused PyTorch path under torch.compile, which fuses the elementwise passes
around the matrix products into generated loops (what run.compile gives the core inside a model).
Its compile time is spent before the timing and reported as compile_s.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time

import torch

from linvit.attention import OPERATORS, AttentionOperator
from linvit.bench.measure import median_seconds, peak_bytes
from linvit.ops.backends import backend, triton_available

log = logging.getLogger("linvit")


def backends_for(operator: str, device: torch.device, compiled=()) -> list[str]:
    if operator == "softmax":
        return ["sdpa"]
    names = ["reference", "torch"]
    if device.type == "cuda" and triton_available():
        names.append("triton")
    if operator in compiled:
        names.append("compiled")
    return names


def make_operator(name: str, heads: int, head_dim: int, tokens: int, device: torch.device):
    side = math.isqrt(tokens)
    op = OPERATORS[name](heads * head_dim, num_heads=heads).to(device)
    op.set_token_layout(0, (side, side))                  # all tokens are patches, a square grid
    return op


def parts_of(name: str) -> list[str]:
    """core alone, plus core and local term where the operator adds one (through local_mix, or
    a mix of its own such as ttt's conv branch)."""
    cls = OPERATORS[name]
    has_local = (cls.local_mix is not AttentionOperator.local_mix
                 or cls.mix is not AttentionOperator.mix)
    return ["core", "mix"] if has_local else ["core"]


def make_step(op, batch: int, tokens: int, head_dim: int, device: torch.device, part: str,
              seed: int = 0, compile_backend: str | None = None):
    """One forward+backward of the part on fixed random q, k, v (its forward compiled with
    `compile_backend`, if given, for these shapes alone)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (batch, op.num_heads, tokens, head_dim)
    q, k, v = (torch.randn(shape, generator=gen).to(device).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=gen).to(device)
    own = set(op.operator_specific_parameters())          # qkv/proj are outside mix()
    inputs = [q, k, v, *(p for n, p in op.named_parameters() if n in own)]
    fn = op.global_mix if part == "core" else op.mix
    if compile_backend is not None:
        fn = torch.compile(fn, backend=compile_backend, dynamic=False)

    def step():
        out = fn(q, k, v)
        return torch.autograd.grad(out, inputs, grad, allow_unused=True)
    return step


OPS_BACKEND = {"sdpa": "auto", "compiled": "torch"}     # the linvit.ops backend of a bench row


def bench_operator(name: str, backend_name: str, part: str, tokens: int, cfg,
                   device: torch.device, memory: bool = True, steps: dict | None = None) -> dict:
    """One point: the median time of forward+backward and (with `memory`) its peak memory.
    `steps` keeps compiled steps from one pass to the next (each is compiled once)."""
    key, compile_s = (name, backend_name, part, tokens), None
    with backend(OPS_BACKEND.get(backend_name, backend_name)):
        step = None if steps is None else steps.get(key)
        if step is None:
            op = make_operator(name, cfg.heads, cfg.head_dim, tokens, device)
            compiled = cfg.compile_backend if backend_name == "compiled" else None
            step = make_step(op, cfg.batch, tokens, cfg.head_dim, device, part,
                             compile_backend=compiled)
            if compiled:
                start = time.perf_counter()
                step()                                       # the compile, outside the timing
                compile_s = time.perf_counter() - start
                if steps is not None:
                    steps[key] = step
        seconds = median_seconds(step, cfg.min_run_time, warmup=memory)   # first pass only
        peak = peak_bytes(step, device) if memory else None
    return {"operator": name, "backend": backend_name, "part": part, "tokens": tokens,
            "batch": cfg.batch,
            "heads": cfg.heads, "head_dim": cfg.head_dim, "device": device.type,
            "ms": seconds * 1e3, "peak_mib": None if peak is None else peak / 2**20,
            "compile_s": compile_s}


def skip(name: str, backend_name: str, part: str, tokens: int, cfg) -> bool:
    if name == "softmax":
        return tokens > cfg.softmax_max_tokens
    if backend_name == "reference":               # the baseline of the core, not a product
        # a token-by-token recurrence (gla, deltanet, ...) is timed on short sequences only
        own = OPERATORS[name].reference_max_tokens or tokens
        return part == "mix" or tokens > min(cfg.reference_max_tokens, own)
    return False


def sweep_operators(cfg, device: torch.device, on_row=None) -> list[dict]:
    """Every point `cfg.repeats` times, one pass over all points after another (interleaved: a
    slow spell of the machine lands on every operator of a pass, not on one operator's repeats).
    Peak memory is exact (measure.py), so the first pass measures it and the others reuse it.
    `on_row(rows)` is called after every point with the rows so far."""
    rows, peaks, steps = [], {}, {}
    jobs = [(n, b, p, t) for n in cfg.operators for b in backends_for(n, device, cfg.compiled)
            for p in parts_of(n) for t in cfg.tokens if not skip(n, b, p, t, cfg)]
    total = len(jobs) * cfg.repeats
    with compiled_steps_kept(sum(job[1] == "compiled" for job in jobs)):
        for repeat in range(cfg.repeats):
            for i, job in enumerate(jobs, repeat * len(jobs) + 1):
                row = bench_operator(*job, cfg, device, memory=job not in peaks, steps=steps)
                peaks.setdefault(job, row["peak_mib"])
                row.update(repeat=repeat, peak_mib=peaks[job])
                log.info("[%d/%d] %-8s %-9s %-4s N=%-6d %9.2f ms %9.1f MiB", i, total, *job,
                         row["ms"], row["peak_mib"])
                rows.append(row)
                if on_row:
                    on_row(rows)
    return rows


def compiled_steps_kept(count: int):
    """Room in dynamo's cache for every compiled point at once. The operators' global_mix share
    one wrapper's code (the float32-under-autocast wrapper), and dynamo keeps 8 compiled versions
    of a code object by default: past that it would run later points eagerly, unsaid, under the
    name `compiled`. A point that still finds no room is an error, not an eager row. What the
    process compiled before is dropped first (torch._dynamo.reset): the sweep owns the room."""
    if not count:
        return contextlib.nullcontext()
    import torch._dynamo  # noqa: PLC0415 (only a bench that compiles pays for dynamo's import)
    torch._dynamo.reset()
    config = torch._dynamo.config
    return config.patch(recompile_limit=max(config.recompile_limit, count),
                        accumulated_recompile_limit=max(config.accumulated_recompile_limit,
                                                        count),
                        fail_on_recompile_limit_hit=True)
