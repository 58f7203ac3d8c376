"""Where a run executes: device, process group, precision, seeding.

One process on the CPU or one GPU by default; under `torchrun` the same code joins a process group
(gloo on CPU, nccl on GPU) and every stage trains with DistributedDataParallel.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from linvit.errors import ConfigError

log = logging.getLogger("linvit")

# Runtime.precision's words for each autocast dtype of training and evaluation
PRECISIONS = {"float32": None, "bfloat16 autocast": torch.bfloat16}
# torch.cpu's (private) checks of the CPU's bf16 instructions, by the names runs record
CPU_CHECKS = {"avx512_bf16": "_is_avx512_bf16_supported", "amx": "_is_amx_tile_supported"}


@dataclass
class Runtime:
    device: torch.device
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    amp_dtype: torch.dtype | None = None
    seed: int = 0
    progress: bool = True
    compile: str | None = None     # torch.compile backend of the training step (trainer.fit)
    amp_auto: bool = False         # run.amp=auto: the precision may follow a resumed checkpoint

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def precision(self) -> str:
        """The training step's precision, in words (checkpoints record it)."""
        for words, dtype in PRECISIONS.items():
            if dtype == self.amp_dtype:
                return words
        raise ValueError(f"no words for autocast dtype {self.amp_dtype} (linvit uses "
                         f"{', '.join(PRECISIONS)})")

    def keep_precision(self, started: str | None) -> None:
        """run.amp=auto is decided when a run starts: resumed, on any machine, the run goes on
        in the precision it `started` in (a checkpoint's record), said in the log."""
        if self.amp_auto and started in PRECISIONS and started != self.precision:
            log.warning("run.amp=auto: continuing in %s, as this run started (this machine "
                        "would choose %s)", started, self.precision)
            self.amp_dtype = PRECISIONS[started]

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def gather(self, obj) -> list:
        """Every process's `obj`, in rank order, on every process (`[obj]` in one process). For
        small host-side state only (torch pickles it between this run's own processes)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def process_threads(threads: int | None, local_processes: int) -> int | None:
    """This process's share of `run.threads`, the CPU threads of the whole job on this node (a
    workflow job's cores: `linvit --nproc N` starts N processes on them, and N processes taking
    every core each would oversubscribe the allocation N times)."""
    return None if not threads else max(1, threads // max(1, local_processes))


def check_gpu_share(local_rank: int, visible: int) -> None:
    """Each local process trains on its own GPU: more processes than visible devices (e.g. a
    cluster job given fewer GPUs than its --nproc) is refused, naming what each side says."""
    if local_rank >= visible:
        raise ConfigError(
            f"process {local_rank} of this node has no GPU of its own: torch sees {visible} "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}); run --nproc at "
            "most the GPUs allocated to the job (a cluster job's gpu resource)")


def cuda_wanted(want: str) -> bool:
    """Whether run.device `want` (auto | cpu | cuda) runs on CUDA in this process; cuda where
    torch sees no CUDA device is refused (the one place that checks it)."""
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device: cuda, but torch sees no CUDA device (use auto or cpu)")
    return want == "cuda" or (want == "auto" and torch.cuda.is_available())


def setup_runtime(run_cfg) -> Runtime:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = cuda_wanted(run_cfg.device)
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        check_gpu_share(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(device)
    if threads := process_threads(run_cfg.threads,
                                  int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))):
        torch.set_num_threads(threads)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world)
    check_compile_backend(run_cfg.compile)
    amp = amp_dtype(run_cfg.amp, device)
    if world > 1:      # auto decides per machine: every rank follows rank 0, as the record does
        decided = torch.tensor([amp is not None], dtype=torch.int32, device=device)
        dist.broadcast(decided, src=0)
        amp = torch.bfloat16 if decided.item() else None
    return Runtime(device, rank, world, local_rank, amp, run_cfg.seed, run_cfg.progress,
                   run_cfg.compile, amp_auto=run_cfg.amp == "auto")


def bf16_pays(device: torch.device) -> bool:
    """Whether bf16 autocast speeds the training step up on `device` (run.amp=auto): on CUDA where
    bf16 is native (Ampere on; older GPUs emulate it); on a CPU with AVX512-BF16 and no AMX, where
    the step ran 1.5-2.1x faster than in float32 (docs/2026-12-04-cpu-bf16.md). On an AMX CPU the
    one measurement found it slower (docs/2026-12-03-default-grid-two-seeds.md), and CPUs without
    bf16 instructions emulate it: float32 there, as before."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    features = cpu_features()
    return features["avx512_bf16"] and not features["amx"]


def cpu_features() -> dict[str, bool]:
    """The CPU's bf16 instructions as torch.cpu reports them (private checks: absent -> False)."""
    cpu = getattr(torch, "cpu", None)
    return {name: bool(getattr(cpu, check, lambda: False)()) for name, check in CPU_CHECKS.items()}


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """run.amp: auto (bf16 where it pays), bf16 (autocast on any device), float32 (none)."""
    return torch.bfloat16 if (bf16_pays(device) if amp == "auto" else amp == "bf16") else None


def check_compile_backend(backend: str | None, field: str = "run.compile") -> None:
    """`field` names a torch.compile backend this torch has; refused before any compute."""
    if backend is None:
        return
    import torch._dynamo  # noqa: PLC0415 (only runs that compile pay for dynamo's import)
    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise ConfigError(f"{field}: unknown torch.compile backend {backend!r}; this torch "
                          f"has {', '.join(sorted({'aot_eager', *torch._dynamo.list_backends()}))}"
                          " (null: eager)")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The global RNG (dropout, drop-path) is reseeded from (seed, epoch, rank) at each epoch, so a
    resumed run draws exactly what an uninterrupted one would, for any number of processes."""
    return (seed * 1_000_003 + epoch * 7_919 + rank) % 2**63
