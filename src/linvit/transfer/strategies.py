"""The init-strategy registry: which component groups a student takes from where.

A strategy names the groups copied from the softmax teacher, the groups taken from a distilled
student (the teacher with its attention swapped for the student's operator and distilled, see
linvit.transfer.distill), and its mechanisms (linvit.transfer.mechanisms: mimetic attention,
the teacher's maps driving the student). Everything else starts new (timm's initialisation under
the run's seed).

The "stem" (embeddings, norms, head) travels with every copy strategy, so that copy_mlp and
copy_attn differ from the copy_embed control only by the MLP or attention weights themselves.
Adding a strategy: one entry in STRATEGIES.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from linvit.registry import Registry
from linvit.transfer.groups import check_groups
from linvit.transfer.mechanisms import Mechanism, MimeticAttention, TeacherMaps

STEM = frozenset({"embed", "norm", "head"})


@dataclass(frozen=True)
class InitStrategy:
    name: str
    copy: frozenset[str]
    distilled: frozenset[str] = frozenset()
    description: str = ""
    mechanisms: tuple[Mechanism, ...] = ()

    def __post_init__(self):
        check_groups(self.copy, f"strategy {self.name}: copy")
        check_groups(self.distilled, f"strategy {self.name}: distilled")
        if self.copy & self.distilled:
            raise ValueError(f"strategy {self.name}: groups both copied and distilled: "
                             f"{sorted(self.copy & self.distilled)}")
        for m in self.mechanisms:
            if m.takes_groups & (self.copy | self.distilled):
                raise ValueError(f"strategy {self.name}: {m.name} forms "
                                 f"{sorted(m.takes_groups)}, which cannot also be copied or "
                                 "distilled")

    @property
    def needs_distilled(self) -> bool:
        return bool(self.distilled)

    def uses(self, mechanism: str) -> bool:
        return any(m.name == mechanism for m in self.mechanisms)

    def with_groups(self, copy=None, distilled=None) -> InitStrategy:
        """The same strategy with its groups overridden by config (init.copy / init.distilled)."""
        return replace(self, copy=frozenset(self.copy if copy is None else copy),
                       distilled=frozenset(self.distilled if distilled is None else distilled))


STRATEGIES: Registry[InitStrategy] = Registry.by_name(
    "init strategy",
    InitStrategy("random", frozenset(), description="nothing from the teacher"),
    InitStrategy("copy_embed", STEM, description="control: embeddings, norms and head only"),
    InitStrategy("copy_attn", STEM | {"attn"}, description="stem + Q/K/V/proj"),
    InitStrategy("copy_mlp", STEM | {"mlp"}, description="stem + MLPs"),
    InitStrategy("copy_all", STEM | {"attn", "mlp"}, description="every tensor the teacher has"),
    InitStrategy("distill", frozenset(), frozenset({"attn"}),
                 description="distilled attention, everything else new"),
    InitStrategy("copy_mlp+distill", STEM | {"mlp"}, frozenset({"attn"}),
                 description="the paper's recipe: stem + MLPs copied, attention distilled"),
    InitStrategy("copy_embed+distill", STEM, frozenset({"attn"}),
                 description="control of the recipe: stem copied, attention distilled, MLPs "
                             "new (what distillation recovers without the MLPs)"),
    InitStrategy("mimetic", frozenset(), mechanisms=(MimeticAttention(),),
                 description="data-free baseline: mimetic attention, everything else new"),
    InitStrategy("copy_mlp+mimetic", STEM | {"mlp"}, mechanisms=(MimeticAttention(),),
                 description="stem + MLPs copied, mimetic attention (no distillation)"),
    InitStrategy("attn_copy", frozenset(), mechanisms=(TeacherMaps(),),
                 description="attention transfer, copy mode: a new softmax student whose "
                             "attention maps are the teacher's, in training and at test time"),
)
get_strategy = STRATEGIES.lookup
