"""Typed, validated configs: YAML file + dotted overrides -> dataclasses.

This module holds the machinery (`load_config`, `build`) and the sections every stage shares
(model, data, optim, run). Each stage package declares its own config next to its code
(`linvit.train.config`, `linvit.transfer.config`, `linvit.dense.config`, `linvit.bench.config`);
the CLI's stage table names them. Everything a run needs is checked before any data is read or
any tensor is allocated:
unknown fields, wrong types, unknown registry names (with the allowed values), missing files,
numbers out of range (every float must be finite), and the model a run would build (its patch grid
must tile the images; distillation layers must exist in the teacher).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
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
from linvit.found_files import note_checked
from linvit.io import load_yaml
from linvit.models import SIZES, ModelSpec
from linvit.trees import deep_merge


def one_of(path: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}: {value!r} is not one of: {', '.join(map(str, allowed))}")


def positive(path: str, value, allow_zero: bool = False) -> None:
    if value is not None and (value < 0 or (value == 0 and not allow_zero)):
        raise ConfigError(f"{path}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def existing_file(path: str, value) -> None:
    if value is not None and not Path(value).is_file():
        raise ConfigError(f"{path}: file not found: {value}")
    if value is not None:
        note_checked(value)             # a stored verdict holds only while the file is there


def required_file(path: str, value, what: str = "") -> None:
    """A field naming an input file that must be given and must exist."""
    if value is None:
        raise ConfigError(f"{path}: required{f' ({what})' if what else ''}")
    existing_file(path, value)


def in_range(path: str, value, low, high) -> None:
    if value is not None and not low <= value <= high:
        raise ConfigError(f"{path}: must be in [{low}, {high}], got {value}")


MAX_SEED = 2**63 - 1


def image_size(p: str, data) -> int:
    """The image size a dataset will deliver, known without reading the data."""
    try:
        return DATASETS[data.dataset].image_size(data.img_size)
    except ValueError as e:
        raise ConfigError(f"{p}.img_size: {e}") from None


def check_spec(p: str, spec) -> None:
    """The model this spec describes can be built (grid tiles the image, options typed)."""
    try:
        spec.check()
    except ValueError as e:
        raise ConfigError(f"{p}: {e}") from None


@dataclass
class ModelCfg:
    """The model: its size, attention operator and operator options, and stochastic depth."""
    size: str | None = "cpu96"      # None in distill/finetune: the teacher's size
    operator: str = "softmax"       # the attention (`linvit list`): softmax, linear, focused, ...
    # typed like the operator's declared defaults (int, float, bool): see check_options
    operator_options: dict[str, Any] = field(default_factory=dict)
    drop_path: float = 0.0          # stochastic depth, linear from 0 to this at the last block

    def validate(self, p: str) -> None:
        if self.size is not None:
            one_of(f"{p}.size", self.size, SIZES)
        one_of(f"{p}.operator", self.operator, OPERATORS)
        try:
            self.operator_options = check_options(self.operator, self.operator_options)
        except ValueError as e:
            raise ConfigError(f"{p}.operator_options: {e}") from None
        if not 0 <= self.drop_path < 1:
            raise ConfigError(f"{p}.drop_path: must be in [0, 1), got {self.drop_path}")

@dataclass
class DataCfg:
    """The image dataset: where it is read from, its splits and subsets, batch sizes."""
    dataset: str = "fashion_mnist"    # a registry dataset (`linvit list`)
    # the dataset's folder (None: fashion_mnist reads Debian's package; mnist5k takes none)
    root: str | None = None
    img_size: int | None = None       # folder datasets only
    train_subset: int | None = None   # a fixed random subset (the same for every run)
    test_subset: int | None = None    # a fixed random subset of the scored split; None: all
    batch_size: int = 128             # global, over all processes
    eval_batch_size: int = 500        # evaluation's; global, over all processes
    workers: int = 4                  # folder datasets only
    # images held out of the training split as a validation set, never trained on (None: none)
    val_size: int | None = None
    val_seed: int = 0                 # draws the held-out images (same seed and size: same set)
    # the split a run is scored on: test, or val (the val_size held-out images); settings are
    # chosen on val, the test split gives the final numbers
    evaluate_on: Literal["test", "val"] = "test"

    def validate(self, p: str) -> None:
        one_of(f"{p}.dataset", self.dataset, DATASETS)
        positive(f"{p}.val_size", self.val_size)
        if self.evaluate_on == "val" and self.val_size is None:
            raise ConfigError(f"{p}.evaluate_on: val needs {p}.val_size (the images held out "
                              "of the training split)")
        if self.root is not None and not getattr(DATASETS[self.dataset], "reads_root", True):
            raise ConfigError(f"{p}.root: {self.dataset} reads no folder (its data ships with "
                              f"its package); leave {p}.root unset")
        for name in ("img_size", "train_subset", "test_subset", "batch_size", "eval_batch_size"):
            positive(f"{p}.{name}", getattr(self, name))
        positive(f"{p}.workers", self.workers, allow_zero=True)
        if self.train_subset is not None and self.train_subset < self.batch_size:
            raise ConfigError(f"{p}.train_subset: {self.train_subset} samples make no batch of "
                              f"{p}.batch_size={self.batch_size} (training drops partial batches)")
        image_size(p, self)

def check_model(model: ModelCfg, data: DataCfg) -> None:
    """A model of these sections can be built on this data: its patch grid tiles the images and
    its operator options are typed (class and channel counts do not matter here)."""
    check_spec("model", ModelSpec(model.size, model.operator, 1, image_size("data", data), 1,
                                  model.operator_options, model.drop_path))


@dataclass
class OptimCfg:
    """The optimizer and its learning-rate schedule (timm's; the rate changes every update)."""
    opt: str = "adamw"                # any timm optimizer name
    lr: float = 1e-3                  # the peak learning rate, after warm-up (not batch-scaled)
    weight_decay: float = 0.05        # biases, norms and no_weight_decay() tensors get none
    epochs: int = 10                  # passes over the training split
    warmup_epochs: int = 1            # linear warm-up from warmup_lr to lr; 0: none
    sched: str = "cosine"             # any timm scheduler name
    min_lr: float = 1e-5              # the schedule's floor (where cosine ends)
    warmup_lr: float = 1e-6           # the learning rate warm-up starts from
    label_smoothing: float = 0.1      # of the classification targets (Mixup's mixed ones too)
    clip_grad: float | None = None    # clip the gradients' total norm to this; None: no clipping
    layer_decay: float | None = None  # layer-wise lr decay (fine-tuning; timm's groups)
    ema_decay: float | None = None    # a model EMA (timm's ModelEmaV3), evaluated and saved

    def validate(self, p: str) -> None:
        positive(f"{p}.lr", self.lr)
        positive(f"{p}.epochs", self.epochs)
        for name in ("weight_decay", "warmup_epochs", "min_lr", "warmup_lr"):
            positive(f"{p}.{name}", getattr(self, name), allow_zero=True)
        if self.warmup_epochs >= self.epochs and self.warmup_epochs:
            raise ConfigError(f"{p}.warmup_epochs: {self.warmup_epochs} leaves no epoch after "
                              f"warm-up (epochs={self.epochs})")
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError(f"{p}.label_smoothing: must be in [0, 1)")
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ConfigError(f"{p}.layer_decay: must be in (0, 1], got {self.layer_decay}")
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ConfigError(f"{p}.ema_decay: must be in (0, 1), got {self.ema_decay}")
        positive(f"{p}.clip_grad", self.clip_grad)
        if self.opt not in COMMON_OPTIMIZERS:
            from timm.optim import list_optimizers
            one_of(f"{p}.opt", self.opt, list_optimizers())
        one_of(f"{p}.sched", self.sched, ("cosine", "tanh", "step", "multistep", "plateau",
                                            "poly", "const"))

# Optimizers timm has (a test holds it): these names are checked without importing timm.optim,
# which imports all of timm (seconds, paid by every Snakemake start, which checks every job's
# config).
COMMON_OPTIMIZERS = ("adamw", "adam", "sgd", "momentum", "lamb", "lion")


@dataclass
class RunCfg:
    """How the run executes: seed, device, precision, threads, evaluation, compile, loggers."""
    seed: int = 0                     # weight init, data order, augmentation draws
    device: Literal["auto", "cpu", "cuda"] = "auto"   # auto: CUDA where torch sees it, else CPU
    # the precision of training and evaluation: auto (bf16 autocast where it is faster: CUDA with
    # native bf16, CPUs with AVX512-BF16 and no AMX; runs.runtime.bf16_pays), bf16 (autocast on
    # any device) or float32. Not true/false: `true` meant float32 on CPUs before auto existed.
    amp: Literal["auto", "bf16", "float32"] = "auto"
    # CPU threads of the job on this node, shared by its processes (--nproc) (None: torch's default)
    threads: int | None = None
    progress: bool = True             # tqdm progress bars (main process only)
    eval_every: int = 1               # evaluate on the test split every k epochs (0: at the end)
    # torch.compile the training step's model and loss with this backend (None: eager), as timm's
    # --torchcompile does: "inductor" (torch's default), "aot_eager", ... (checked by the job)
    compile: str | None = None
    # live curves while the run trains (linvit.runs.loggers): tensorboard (event files in the run
    # folder's tensorboard/), wandb, mlflow (offline, in the run folder, unless their own
    # environment variables say otherwise); [] for none
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])

    def validate(self, p: str) -> None:
        from linvit.runs.loggers import LOGGERS

        in_range(f"{p}.seed", self.seed, 0, MAX_SEED)
        for name in self.loggers:
            one_of(f"{p}.loggers", name, LOGGERS)
            LOGGERS[name].check(f"{p}.loggers")
        if len(set(self.loggers)) < len(self.loggers):
            raise ConfigError(f"{p}.loggers: a logger named twice in {self.loggers}")
        positive(f"{p}.threads", self.threads)
        positive(f"{p}.eval_every", self.eval_every, allow_zero=True)
        # device=cuda without CUDA is refused where the job runs (setup_runtime), not here: the
        # workflow builds every job's config on a submit host that may have no GPU


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
            node[leaf] = copy.deepcopy(_yaml_value(raw))
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML "
                              f"({_one_line(e)})") from None
    return out


@functools.lru_cache(maxsize=4096)
def _yaml_value(raw: str) -> Any:
    """One override's value, parsed once: a workflow start builds every job's config from mostly
    the same few hundred values (copied out, as a caller may change what it gets)."""
    return load_yaml(raw) if raw.strip() else None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def load_config(cls, path: str | Path | None = None, overrides: list[str] = (),
                stage: str | None = None) -> Any:
    """A config dataclass from a YAML file (a plain config, or a run folder's config.yaml, which
    wraps it with its stage: taken for that stage only) and dotted overrides."""
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
        data = _unwrap_saved(data, path, stage)
    return build(cls, deep_merge(data, parse_overrides(list(overrides))))


def _unwrap_saved(data: dict, path: Path, stage: str | None) -> dict:
    """A run folder's config.yaml, {stage: ..., config: {...}}, as the config it holds."""
    if set(data) != {"stage", "config"} or not isinstance(data["config"], dict):
        return data
    if stage is not None and data["stage"] != stage:
        raise ConfigError(f"{path}: the saved config of a {data['stage']} run, not of {stage}")
    return data["config"]


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


def check_field(cls, dotted: str, value) -> Any:
    """`value` as field `dotted` (e.g. "optim.lr") of the config class `cls` would take it, or
    a ConfigError naming the field (an unknown one with the allowed names). Types only: the
    rules a whole config obeys (ranges, cross-field checks) are checked where it is built."""
    node, path = cls, ""
    *parents, leaf = dotted.split(".")
    for part in parents:
        tp = _field_type(node, part, path)
        if not dataclasses.is_dataclass(tp):
            rest = dotted.removeprefix(f"{path}{part}.")
            raise ConfigError(f"{path}{part}: a {getattr(tp, '__name__', tp)} field, not a "
                              f"section of fields (it has no {rest})")
        node, path = tp, f"{path}{part}."
    tp = _field_type(node, leaf, path)
    field_ = next(f for f in dataclasses.fields(node) if f.name == leaf)
    return _coerce(tp, _with_defaults(field_, value), f"{path}{leaf}")


def _field_type(cls, name: str, path: str):
    names = [f.name for f in dataclasses.fields(cls)]
    if name not in names:
        raise ConfigError(f"{path}{name}: unknown field; allowed: {', '.join(names)}")
    return typing.get_type_hints(cls)[name]


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
        one_of(path, value, args)
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
        # YAML 1.1 reads "3e-4" (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    # bool is a subclass of int in Python; `epochs: true` must still be rejected.
    if not isinstance(value, tp) or (tp in (int, float) and isinstance(value, bool)):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise ConfigError(f"{path}: must be a finite number, got {value}")
    return value
