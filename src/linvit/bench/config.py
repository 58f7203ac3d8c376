"""Config of `linvit bench`."""
from __future__ import annotations

from dataclasses import dataclass, field

from linvit.attention import OPERATORS
from linvit.attention.base import FAMILIES
from linvit.config import RunCfg, one_of, positive
from linvit.errors import ConfigError
from linvit.models import SIZES
from linvit.runs.runtime import check_compile_backend


@dataclass
class BenchModelsCfg:
    """Whole-model inference throughput against image resolution (random weights, forward)."""
    sizes: list[str] = field(default_factory=lambda: ["deit_t", "deit_s"])   # `linvit list`
    # image sides in px, each a multiple of every size's patch size
    resolutions: list[int] = field(default_factory=lambda: [224, 384, 512, 768, 1024])
    operators: list[str] = field(default_factory=lambda: list(OPERATORS))   # in every model
    batch: int = 1                     # images per forward pass
    min_run_time: float = 0.5          # seconds of timed calls per point

    def validate(self, p: str) -> None:
        for i, s in enumerate(self.sizes):
            one_of(f"{p}.sizes[{i}]", s, SIZES)
        for i, o in enumerate(self.operators):
            one_of(f"{p}.operators[{i}]", o, OPERATORS)
        for i, r in enumerate(self.resolutions):
            bad = [s for s in self.sizes if r <= 0 or r % SIZES[s].patch_size]
            if bad:
                raise ConfigError(f"{p}.resolutions[{i}]: {r} is not a positive multiple of "
                                  f"{bad[0]}'s patch size {SIZES[bad[0]].patch_size}")
        positive(f"{p}.batch", self.batch)
        positive(f"{p}.min_run_time", self.min_run_time)


@dataclass
class BenchConfig:
    """`linvit bench`: operator scaling against tokens, model throughput against resolution.
    run.device picks the device, run.threads the CPU threads; run.amp is not used (float32)."""
    # the operators timed; softmax is required (every ratio is against it)
    operators: list[str] = field(default_factory=lambda: list(OPERATORS))
    # the sequence lengths N timed, each a square (a patch grid)
    tokens: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384])
    softmax_max_tokens: int = 4096     # SDPA's time grows as N^2
    # the PyTorch reference backend's longest N (an operator may set a lower cap of its own)
    reference_max_tokens: int = 16384
    batch: int = 1                     # sequences per timed call
    heads: int = 6                     # attention heads: the operator's width is heads x head_dim
    head_dim: int = 64                 # channels per head
    min_run_time: float = 1.0          # seconds of timed calls per point and repeat
    repeats: int = 3                   # interleaved passes over every point; ratios are medians
    tf32: bool = False                 # CUDA: let float32 matmuls (torch's and Triton's) use TF32
    # operators whose core (and mix) is also timed under torch.compile, as backend `compiled`:
    # what fusing the elementwise passes around the products buys, as run.compile gives a model
    compiled: list[str] = field(default_factory=list)
    compile_backend: str = "inductor"  # torch.compile's backend for those rows
    goal_tokens: int = 4096            # the goals: at this N, each core's share of the speedup
    # its FLOPs allow over softmax (FLOP-ratio bound), by operator name, else family, else
    # "default", ...
    goal_share: dict[str, float] = field(
        default_factory=lambda: {"default": 0.6, "feature map": 0.75})
    goal_slope: float = 1.1            # ... memory log-log slope over `tokens`, ...
    goal_kernel_speedup: float = 2.0   # ... and (GPU) Triton over the PyTorch reference
    models: BenchModelsCfg | None = field(default_factory=BenchModelsCfg)  # null: skip
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        for i, o in enumerate(self.operators):
            one_of(f"operators[{i}]", o, OPERATORS)
        for i, o in enumerate(self.compiled):
            one_of(f"compiled[{i}]", o, [n for n in self.operators if n != "softmax"])
        if self.compiled:
            check_compile_backend(self.compile_backend, "compile_backend")
        if "softmax" not in self.operators:
            raise ConfigError("operators: must include softmax (every ratio is against it)")
        for i, n in enumerate(self.tokens):
            if n <= 0 or int(n ** 0.5) ** 2 != n:
                raise ConfigError(f"tokens[{i}]: {n} is not a positive square (a patch grid)")
        for name, share in self.goal_share.items():
            if name != "default" and name not in FAMILIES:
                one_of("goal_share", name, OPERATORS)
            positive(f"goal_share.{name}", share)
        if "default" not in self.goal_share:
            raise ConfigError("goal_share: needs a `default` (the goal of operators and families "
                              "it does not name)")
        for name in ("softmax_max_tokens", "reference_max_tokens", "batch", "heads", "head_dim",
                     "min_run_time", "repeats", "goal_tokens", "goal_slope",
                     "goal_kernel_speedup"):
            positive(name, getattr(self, name))

    def share_goal(self, operator: str) -> float:
        """The share of its FLOP bound `operator`'s core must reach at goal_tokens."""
        goals = self.goal_share
        return goals.get(operator, goals.get(OPERATORS[operator].family, goals["default"]))
