"""What a model is: a small `ModelSpec` (size, operator, data shape), which travels inside every
checkpoint's metadata so a checkpoint file alone rebuilds its model (linvit.models.vit).

Apart from the model code so that configs check specs without importing timm (the workflow
checks every job's config each time Snakemake reads the Snakefile).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from linvit.attention import check_options
from linvit.models.sizes import ModelSize, get_size

# More parameters than this in one attention layer (4 GiB in float32; a ViT-B layer has 2.4 M) is
# an operator option of absurd size (a gate rank of 10^12), refused before anything is allocated.
MAX_LAYER_PARAMETERS = 10**9


@dataclass(frozen=True)
class ModelSpec:
    size: str                 # a registry size, or the timm model an architecture was read from
    operator: str
    num_classes: int
    img_size: int
    in_chans: int
    operator_options: dict = field(default_factory=dict)
    drop_path: float = 0.0
    # a ModelSize's fields read from a timm model (linvit.models.architecture); None: `size` is
    # a registry size
    architecture: dict | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        if d["architecture"] is None:       # registry sizes: the records of before it existed
            del d["architecture"]
        return d

    @property
    def model_size(self) -> ModelSize:
        """The transformer's shape: the architecture it carries, or its registry size's."""
        if self.architecture is not None:
            return ModelSize.from_dict(dict(self.architecture))
        return get_size(self.size)

    def derive(self, **changes) -> ModelSpec:
        """This spec with `changes` (its architecture kept): a student of a teacher, a backbone
        at another image size."""
        return ModelSpec(**{**self.as_dict(), **changes})

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model spec has unknown fields {unknown}")
        return cls(**d)

    def check(self) -> None:
        """ValueError naming the field when no model can be built from this spec."""
        size = self.model_size
        check_options(self.operator, dict(self.operator_options))
        for name, low in (("num_classes", 0), ("img_size", 1), ("in_chans", 1)):  # 0: no head
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
        if self.img_size % size.patch_size:
            raise ValueError(f"image size {self.img_size} is not a multiple of {self.size}'s "
                             f"patch size {size.patch_size}: the last "
                             f"{self.img_size % size.patch_size} pixel rows and columns would "
                             "be dropped")
        if not (isinstance(self.drop_path, (int, float)) and math.isfinite(self.drop_path)
                and 0 <= self.drop_path < 1):
            raise ValueError(f"drop_path: must be in [0, 1), got {self.drop_path!r}")
        if self.operator_options and (n := layer_parameters(self, size)) > MAX_LAYER_PARAMETERS:
            raise ValueError(f"operator_options {dict(self.operator_options)}: one attention "
                             f"layer would hold {n:.3g} parameters ({4 * n / 2**30:.3g} GiB in "
                             f"float32; at most {MAX_LAYER_PARAMETERS:.0e} are allowed)")

    def with_operator(self, operator: str, operator_options: dict | None = None) -> ModelSpec:
        return self.derive(operator=operator, operator_options=dict(operator_options or {}))


def layer_parameters(spec: ModelSpec, size: ModelSize) -> int:
    """Parameters of one of the spec's attention layers, counted on the meta device (nothing is
    allocated, whatever the options ask for)."""
    import torch

    from linvit.attention import operator_class

    try:
        with torch.device("meta"):
            layer = operator_class(spec.operator, **spec.operator_options)(
                size.width, num_heads=size.heads, qkv_bias=True)
    except (RuntimeError, OverflowError):     # a tensor beyond what torch can even describe
        return 2**63 - 1
    return sum(p.numel() for p in layer.parameters())
