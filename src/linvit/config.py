"""Typed, validated configs for every CLI stage: YAML file + dotted overrides -> dataclasses.

Everything a run needs is checked here, before any data is read or any tensor is allocated:
unknown fields, wrong types, unknown registry names (with the allowed values), missing files,
numbers out of range (every float must be finite), and the model a run would build (its patch grid
must tile the images; distillation layers must exist in the teacher).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from linvit.attention import OPERATORS, check_options
from linvit.data import DATASETS
from linvit.errors import ConfigError
from linvit.io import load_yaml
from linvit.models import SIZES
from linvit.transfer.groups import GROUPS
from linvit.transfer.losses import LOSSES
from linvit.transfer.strategies import STRATEGIES


def _one_of(path: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}: {value!r} is not one of: {', '.join(map(str, allowed))}")


def _positive(path: str, value, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise ConfigError(f"{path}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def _existing_file(path: str, value) -> None:
    if value is not None and not Path(value).is_file():
        raise ConfigError(f"{path}: file not found: {value}")


def _in_range(path: str, value, low, high) -> None:
    if value is not None and not low <= value <= high:
        raise ConfigError(f"{path}: must be in [{low}, {high}], got {value}")


MAX_SEED = 2**63 - 1


def _image_size(p: str, data) -> int:
    """The image size a dataset will deliver, known without reading the data."""
    try:
        return DATASETS[data.dataset].image_size(data.img_size)
    except ValueError as e:
        raise ConfigError(f"{p}.img_size: {e}") from None


def _check_spec(p: str, spec) -> None:
    """The model this spec describes can be built (grid tiles the image, options typed)."""
    try:
        spec.check()
    except ValueError as e:
        raise ConfigError(f"{p}: {e}") from None


@dataclass
class ModelCfg:
    size: str | None = "cpu96"      # None in distill/finetune: the teacher's size
    operator: str = "softmax"
    # typed like the operator's declared defaults (int, float, bool): see check_options
    operator_options: dict[str, Any] = field(default_factory=dict)
    drop_path: float = 0.0

    def validate(self, p: str) -> None:
        if self.size is not None:
            _one_of(f"{p}.size", self.size, SIZES)
        _one_of(f"{p}.operator", self.operator, OPERATORS)
        try:
            self.operator_options = check_options(self.operator, self.operator_options)
        except ValueError as e:
            raise ConfigError(f"{p}.operator_options: {e}") from None
        if not 0 <= self.drop_path < 1:
            raise ConfigError(f"{p}.drop_path: must be in [0, 1), got {self.drop_path}")


@dataclass
class DataCfg:
    dataset: str = "fashion_mnist"
    root: str | None = None
    img_size: int | None = None       # folder datasets only
    train_subset: int | None = None   # a fixed random subset (the same for every run)
    test_subset: int | None = None
    batch_size: int = 128             # global, over all processes
    eval_batch_size: int = 500
    workers: int = 4                  # folder datasets only

    def validate(self, p: str) -> None:
        _one_of(f"{p}.dataset", self.dataset, DATASETS)
        for name in ("img_size", "train_subset", "test_subset", "batch_size", "eval_batch_size"):
            _positive(f"{p}.{name}", getattr(self, name))
        _positive(f"{p}.workers", self.workers, allow_zero=True)
        if self.train_subset is not None and self.train_subset < self.batch_size:
            raise ConfigError(f"{p}.train_subset: {self.train_subset} samples make no batch of "
                              f"{p}.batch_size={self.batch_size} (training drops partial batches)")
        _image_size(p, self)


@dataclass
class OptimCfg:
    opt: str = "adamw"                # any timm optimizer name
    lr: float = 1e-3
    weight_decay: float = 0.05
    epochs: int = 10
    warmup_epochs: int = 1
    sched: str = "cosine"             # any timm scheduler name
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6
    label_smoothing: float = 0.1
    clip_grad: float | None = None

    def validate(self, p: str) -> None:
        _positive(f"{p}.lr", self.lr)
        _positive(f"{p}.epochs", self.epochs)
        for name in ("weight_decay", "warmup_epochs", "min_lr", "warmup_lr"):
            _positive(f"{p}.{name}", getattr(self, name), allow_zero=True)
        if self.warmup_epochs >= self.epochs and self.warmup_epochs:
            raise ConfigError(f"{p}.warmup_epochs: {self.warmup_epochs} leaves no epoch after "
                              f"warm-up (epochs={self.epochs})")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"{p}.label_smoothing: must be in [0, 1)")
        _positive(f"{p}.clip_grad", self.clip_grad)
        from timm.optim import list_optimizers
        _one_of(f"{p}.opt", self.opt, list_optimizers())
        _one_of(f"{p}.sched", self.sched, ("cosine", "tanh", "step", "multistep", "plateau",
                                            "poly", "const"))


@dataclass
class RunCfg:
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: bool = True                  # bf16 autocast on CUDA; CPU runs stay in float32
    threads: int | None = None        # torch intra-op threads (None: torch's default)
    progress: bool = True
    eval_every: int = 1               # evaluate on the test split every k epochs (0: at the end)

    def validate(self, p: str) -> None:
        _in_range(f"{p}.seed", self.seed, 0, MAX_SEED)
        _positive(f"{p}.threads", self.threads)
        _positive(f"{p}.eval_every", self.eval_every, allow_zero=True)
        # device=cuda without CUDA is refused where the job runs (setup_runtime), not here: the
        # workflow builds every job's config on a submit host that may have no GPU


@dataclass
class DistillCfg:
    losses: dict[str, float] = field(default_factory=lambda: {"attn_out_mse": 1.0})
    layers: list[int] | None = None   # None: every block
    train: list[str] = field(default_factory=lambda: ["attn"])   # groups that learn
    attn_init: Literal["random", "teacher"] = "random"   # student attention before distilling
    temperature: float = 1.0          # logit_kd only

    def validate(self, p: str) -> None:
        if not self.losses or not any(self.losses.values()):
            raise ConfigError(f"{p}.losses: give at least one loss with a non-zero weight "
                              f"(allowed: {', '.join(LOSSES)})")
        for name, w in self.losses.items():
            _one_of(f"{p}.losses", name, LOSSES)
            _positive(f"{p}.losses.{name}", w, allow_zero=True)
        for g in self.train:
            _one_of(f"{p}.train", g, GROUPS)
        if not self.train:
            raise ConfigError(f"{p}.train: name at least one group to train")
        _positive(f"{p}.temperature", self.temperature)


@dataclass
class InitCfg:
    strategy: str = "copy_mlp+distill"
    copy: list[str] | None = None         # override the strategy's copied groups
    distilled: list[str] | None = None    # override the strategy's distilled groups

    def validate(self, p: str) -> None:
        _one_of(f"{p}.strategy", self.strategy, STRATEGIES)
        for name in ("copy", "distilled"):
            for g in getattr(self, name) or []:
                _one_of(f"{p}.{name}", g, GROUPS)

    def resolve(self):
        return STRATEGIES[self.strategy].with_groups(self.copy, self.distilled)


@dataclass
class KDCfg:
    weight: float = 0.0               # share of the loss given to logit KD from the teacher
    temperature: float = 1.0

    def validate(self, p: str) -> None:
        if not 0 <= self.weight <= 1:
            raise ConfigError(f"{p}.weight: must be in [0, 1], got {self.weight}")
        _positive(f"{p}.temperature", self.temperature)


@dataclass
class PretrainConfig:
    model: ModelCfg = field(default_factory=ModelCfg)
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        from linvit.models import ModelSpec

        if self.model.size is None:
            raise ConfigError("model.size: required for pretraining")
        spec = ModelSpec(self.model.size, self.model.operator, 1, _image_size("data", self.data),
                         1, self.model.operator_options, self.model.drop_path)
        _check_spec("model", spec)


@dataclass
class DistillConfig:
    teacher: str | None = None
    model: ModelCfg = field(default_factory=lambda: ModelCfg(size=None, operator="linear"))
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=lambda: OptimCfg(epochs=1, warmup_epochs=0,
                                                             weight_decay=0.0))
    distill: DistillCfg = field(default_factory=DistillCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        if self.teacher is None:
            raise ConfigError("teacher: required (a softmax teacher's model.safetensors)")
        _existing_file("teacher", self.teacher)
        _check_student(self)
        if self.model.size is not None:
            depth = SIZES[self.model.size].depth
            bad = [l for l in self.distill.layers or [] if not 0 <= l < depth]
            if bad:
                raise ConfigError(f"distill.layers: {bad} outside 0..{depth - 1} "
                                  f"({self.model.size} has {depth} blocks)")


def _check_student(cfg) -> None:
    """With model.size given, the student must be buildable on this data. The checks that need
    the teacher's own spec (size, classes, depth) run in the stage, before its first write."""
    from linvit.models import ModelSpec

    if cfg.model.size is not None:
        _check_spec("model", ModelSpec(cfg.model.size, cfg.model.operator, 1,
                                       _image_size("data", cfg.data), 1,
                                       cfg.model.operator_options, cfg.model.drop_path))


@dataclass
class FinetuneConfig:
    teacher: str | None = None
    distilled: str | None = None
    init: InitCfg = field(default_factory=InitCfg)
    model: ModelCfg = field(default_factory=lambda: ModelCfg(size=None, operator="linear"))
    data: DataCfg = field(default_factory=DataCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    kd: KDCfg = field(default_factory=KDCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        if self.teacher is None:
            raise ConfigError("teacher: required (the softmax teacher's model.safetensors; "
                              "strategy 'random' uses it for the model shape)")
        _existing_file("teacher", self.teacher)
        _existing_file("distilled", self.distilled)
        _check_student(self)
        if self.init.resolve().needs_distilled and self.distilled is None:
            raise ConfigError(f"distilled: strategy {self.init.strategy!r} needs a distilled "
                              "student (the output of `linvit distill`)")


@dataclass
class EvaluateConfig:
    checkpoint: str | None = None
    data: DataCfg = field(default_factory=DataCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        if self.checkpoint is None:
            raise ConfigError("checkpoint: required")
        _existing_file("checkpoint", self.checkpoint)


@dataclass
class ImportConfig:
    size: str = "deit_t"
    file: str | None = None           # None: timm's pretrained loader (cache or network)
    reset_head: bool = False          # new head when the class count differs
    data: DataCfg = field(default_factory=lambda: DataCfg(dataset="imagefolder"))

    def validate(self, p: str) -> None:
        from linvit.models import ModelSpec

        _one_of("size", self.size, SIZES)
        _existing_file("file", self.file)
        _check_spec("size", ModelSpec(self.size, "softmax", 1, _image_size("data", self.data), 1))


@dataclass
class ScenesConfig:
    """`linvit make-scenes`: the embedded dense data (see linvit.dense.scenes)."""
    size: int = 64
    train: int = 800
    val: int = 200
    max_objects: int = 4
    min_scale: float = 0.35
    max_scale: float = 0.75
    seed: int = 0
    sprites_root: str | None = None     # Fashion-MNIST files (None: Debian's package)

    def validate(self, p: str) -> None:
        # sprites are at least 8 px and placed at most a quarter outside the scene
        _in_range("size", self.size, 16, 4096)
        _in_range("train", self.train, 1, 10**7)
        _in_range("val", self.val, 1, 10**7)
        _in_range("max_objects", self.max_objects, 1, 64)
        _in_range("seed", self.seed, 0, 2**63 - 2)          # the val split uses seed + 1
        if not 0 < self.min_scale <= self.max_scale <= 1:
            raise ConfigError("min_scale/max_scale: need 0 < min_scale <= max_scale <= 1")


@dataclass
class DenseDataCfg:
    kind: Literal["scenes", "ade20k", "coco"] = "scenes"
    root: str | None = None           # scenes folder (make-scenes), or ADE20K / COCO root
    img_size: int = 64                # images are resized to img_size x img_size
    batch_size: int = 4
    workers: int = 0

    def validate(self, p: str) -> None:
        if self.root is None:
            raise ConfigError(f"{p}.root: required (a folder from `linvit make-scenes`, or an "
                              "ADE20K / COCO root)")
        if not Path(self.root).is_dir():
            raise ConfigError(f"{p}.root: folder not found: {self.root}")
        for name in ("img_size", "batch_size"):
            _positive(f"{p}.{name}", getattr(self, name))
        _positive(f"{p}.workers", self.workers, allow_zero=True)
        if self.img_size % 32:
            raise ConfigError(f"{p}.img_size: {self.img_size} is not a multiple of 32 (the "
                              "coarsest feature stride)")


@dataclass
class DenseModelCfg:
    head_channels: int = 64           # width of the UPerHead / FPN / RoI heads

    def validate(self, p: str) -> None:
        _positive(f"{p}.head_channels", self.head_channels)


@dataclass
class DenseOptimCfg:
    lr: float = 2.0e-4
    weight_decay: float = 0.05
    iters: int = 300
    checkpoint_every: int = 100       # iterations between mmengine checkpoints (resume points)

    def validate(self, p: str) -> None:
        for name in ("lr", "iters", "checkpoint_every"):
            _positive(f"{p}.{name}", getattr(self, name))
        _positive(f"{p}.weight_decay", self.weight_decay, allow_zero=True)


@dataclass
class DenseConfig:
    """`linvit segment` (UperNet) and `linvit detect` (Mask R-CNN) on a linvit backbone."""
    checkpoint: str | None = None     # any linvit model.safetensors: teacher or student
    pretrain_dataset: str = "fashion_mnist"   # whose normalisation the backbone learned with
    data: DenseDataCfg = field(default_factory=DenseDataCfg)
    model: DenseModelCfg = field(default_factory=DenseModelCfg)
    optim: DenseOptimCfg = field(default_factory=DenseOptimCfg)
    run: RunCfg = field(default_factory=lambda: RunCfg(eval_every=0))

    def validate(self, p: str) -> None:
        if self.checkpoint is None:
            raise ConfigError("checkpoint: required (a linvit model.safetensors)")
        _existing_file("checkpoint", self.checkpoint)
        _one_of("pretrain_dataset", self.pretrain_dataset, DATASETS)


@dataclass
class BenchModelsCfg:
    sizes: list[str] = field(default_factory=lambda: ["deit_t", "deit_s"])
    resolutions: list[int] = field(default_factory=lambda: [224, 384, 512, 768, 1024])
    operators: list[str] = field(default_factory=lambda: list(OPERATORS))
    batch: int = 1
    min_run_time: float = 0.5          # seconds of timed calls per point

    def validate(self, p: str) -> None:
        for i, s in enumerate(self.sizes):
            _one_of(f"{p}.sizes[{i}]", s, SIZES)
        for i, o in enumerate(self.operators):
            _one_of(f"{p}.operators[{i}]", o, OPERATORS)
        for i, r in enumerate(self.resolutions):
            bad = [s for s in self.sizes if r <= 0 or r % SIZES[s].patch_size]
            if bad:
                raise ConfigError(f"{p}.resolutions[{i}]: {r} is not a positive multiple of "
                                  f"{bad[0]}'s patch size {SIZES[bad[0]].patch_size}")
        _positive(f"{p}.batch", self.batch)
        _positive(f"{p}.min_run_time", self.min_run_time)


@dataclass
class BenchConfig:
    """`linvit bench`: operator scaling against tokens, model throughput against resolution.
    run.device picks the device, run.threads the CPU threads; run.amp is not used (float32)."""
    operators: list[str] = field(default_factory=lambda: list(OPERATORS))
    tokens: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384])
    softmax_max_tokens: int = 4096     # SDPA on a CPU: ~1 s at 4096, ~14 s at 16384
    reference_max_tokens: int = 16384
    batch: int = 1
    heads: int = 6
    head_dim: int = 64
    min_run_time: float = 1.0          # seconds of timed calls per point
    tf32: bool = False                 # CUDA: let float32 matmuls (torch's and Triton's) use TF32
    goal_tokens: int = 4096            # the goals: speedup over softmax at this N, ...
    goal_speedup: float = 30.0
    goal_slope: float = 1.1            # ... memory log-log slope over `tokens`, ...
    goal_kernel_speedup: float = 2.0   # ... and (GPU) Triton over the PyTorch reference
    models: BenchModelsCfg | None = field(default_factory=BenchModelsCfg)  # null: skip
    run: RunCfg = field(default_factory=RunCfg)

    def validate(self, p: str) -> None:
        for i, o in enumerate(self.operators):
            _one_of(f"operators[{i}]", o, OPERATORS)
        if "softmax" not in self.operators:
            raise ConfigError("operators: must include softmax (every ratio is against it)")
        for i, n in enumerate(self.tokens):
            if n <= 0 or int(n ** 0.5) ** 2 != n:
                raise ConfigError(f"tokens[{i}]: {n} is not a positive square (a patch grid)")
        for name in ("softmax_max_tokens", "reference_max_tokens", "batch", "heads", "head_dim",
                     "min_run_time", "goal_tokens", "goal_speedup", "goal_slope",
                     "goal_kernel_speedup"):
            _positive(name, getattr(self, name))


STAGE_CONFIGS = {"pretrain": PretrainConfig, "distill": DistillConfig, "finetune": FinetuneConfig,
                 "evaluate": EvaluateConfig, "import-teacher": ImportConfig,
                 "make-scenes": ScenesConfig, "segment": DenseConfig, "detect": DenseConfig,
                 "bench": BenchConfig}


# --- generic machinery -------------------------------------------------------------------------
def parse_overrides(items: list[str]) -> dict:
    """['optim.lr=3e-4', 'distill.layers=[0,1]'] -> nested dict; values parsed as YAML."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. optim.lr=3e-4")
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part} is set twice")
        try:
            node[leaf] = load_yaml(raw) if raw.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML "
                              f"({_one_line(e)})") from None
    return out


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def deep_merge(base: dict, over: dict) -> dict:
    merged = dict(base)
    for k, v in over.items():
        both = isinstance(v, dict) and isinstance(merged.get(k), dict)
        merged[k] = deep_merge(merged[k], v) if both else v
    return merged


def load_config(cls, path: str | Path | None = None, overrides: list[str] = ()) -> Any:
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = load_yaml(path.read_text()) or {}
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not a text file (a YAML config is UTF-8 text)") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {_one_line(e)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of fields")
    return build(cls, deep_merge(data, parse_overrides(list(overrides))))


def build(cls, data: dict, path: str = "") -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{path.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{path}{unknown[0]}: unknown field; allowed: {', '.join(fields)}")
    kwargs = {name: _coerce(hints[name], _with_defaults(fields[name], data[name]),
                            f"{path}{name}")
              for name in fields if name in data}
    obj = cls(**kwargs)
    for name in fields:                       # validate children first, then the whole
        child = getattr(obj, name)
        if dataclasses.is_dataclass(child) and hasattr(child, "validate"):
            child.validate(f"{path}{name}")
    if hasattr(obj, "validate") and not path:
        obj.validate("")
    return obj


def _with_defaults(f: dataclasses.Field, value):
    """A partial mapping for a nested config completes the field's own default (DistillConfig's
    optim has epochs=1), not the nested class's defaults (OptimCfg's epochs=10)."""
    if isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
        if dataclasses.is_dataclass(default):
            return _complete(default, value)
    return value


def _complete(default, value: dict) -> dict:
    """`value` over the fields of the config instance `default`: nested configs field by field,
    every other field whole (a mapping of loss weights replaces the default one, it does not
    join it). Unknown keys pass through for `build` to report."""
    out = dict(value)
    for f in dataclasses.fields(default):
        base = getattr(default, f.name)
        if f.name not in value:
            out[f.name] = dataclasses.asdict(base) if dataclasses.is_dataclass(base) else base
        elif dataclasses.is_dataclass(base) and isinstance(value[f.name], dict):
            out[f.name] = _complete(base, value[f.name])
    return out


def _coerce(tp, value, path: str):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is Literal:
        _one_of(path, value, args)
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value if value is not None else {}, f"{path}.")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {str(k): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp is float and isinstance(value, str):
        try:                                  # YAML 1.1 reads "3e-4" (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    # bool is a subclass of int in Python; `epochs: true` must still be rejected.
    if not isinstance(value, tp) or (tp in (int, float) and isinstance(value, bool)):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number, got {value}")
    return value


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
