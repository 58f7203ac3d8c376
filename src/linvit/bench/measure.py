"""Time and peak memory of one call, on the CPU or a GPU.

Time: the median of torch.utils.benchmark's blocked runs (it warms up, synchronises CUDA and sets
the thread count), so a ratio of two medians from one process compares like with like.

Peak memory: the most bytes live at once during the call, beyond what existed before it.
On CUDA that is torch's own high-water mark. On the CPU torch keeps no such counter, so the call
runs once under the profiler with memory recording and the allocation/free records are replayed in
time order: exact bytes, independent of the allocator's caching and of the process's RSS.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

import torch
import torch.utils.benchmark as benchmark

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3        # glibc's mallopt parameters


def keep_freed_memory() -> bool:
    """Have glibc keep freed blocks for reuse instead of returning each to the OS.

    torch's CPU allocator does not cache: every tensor of a few MiB is a fresh mmap, so its first
    touch page-faults, and at N=4096 that alone costs more than the arithmetic of a linear
    attention's elementwise passes. PyTorch's CPU tuning guide swaps in jemalloc or tcmalloc for
    this reason; the benchmark gets the same effect from glibc itself, for every row alike
    (softmax included). Returns False where glibc is not the allocator.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30) and
                    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))
    except (OSError, AttributeError):
        return False


def median_seconds(fn: Callable[[], object], min_run_time: float, warmup: bool = True) -> float:
    # One untimed call first (`warmup`; a later pass over the same point may skip it): a new
    # shape's first call pays for kernel selection and (GPU) Triton compilation or fla's
    # autotuning. blocked_autorange's own sizing calls are not measured either, but when one call
    # outlasts min_run_time the sizing is that single call and the first timed block is the
    # second call: a point that is slow twice (forward, then backward compiling) was timed cold.
    # The first point of a sweep came out several times too slow.
    if warmup:
        fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn},
                            num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    return _cpu_peak_bytes(fn)


@contextlib.contextmanager
def _quiet_stderr():
    """Kineto prints two lines per profiler start/stop straight to fd 2; the call itself is the
    timed one that already ran cleanly, so nothing of value is hidden."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _cpu_peak_bytes(fn: Callable[[], object]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    records = [e for e in prof.profiler.kineto_results.events()
               if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    live = peak = 0
    for e in sorted(records, key=lambda e: e.start_ns()):
        live += e.nbytes()                                  # negative for a free
        peak = max(peak, live)
    return peak
