"""What a model is: a small `ModelSpec` (size, operator, data shape), which travels inside every
checkpoint's metadata so a checkpoint file alone rebuilds its model (linvit.models.vit).

Apart from the model code so that configs check specs without importing timm (the workflow
checks every job's config each time Snakemake reads the Snakefile).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from linvit.attention import check_options
from linvit.models.sizes import get_size


@dataclass(frozen=True)
class ModelSpec:
    size: str
    operator: str
    num_classes: int
    img_size: int
    in_chans: int
    operator_options: dict = field(default_factory=dict)
    drop_path: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"model spec has unknown fields {unknown}")
        return cls(**d)

    def check(self) -> None:
        """ValueError naming the field when no model can be built from this spec."""
        size = get_size(self.size)
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

    def with_operator(self, operator: str, operator_options: dict | None = None) -> ModelSpec:
        return ModelSpec(**{**self.as_dict(), "operator": operator,
                            "operator_options": dict(operator_options or {})})
