"""What an init strategy does beyond copying component groups, as hooks: a mechanism forms
tensors without data (mimetic attention) or wires the teacher into the student (attention
transfer's copy mode). A strategy lists its mechanisms (linvit.transfer.strategies); the init
(linvit.transfer.init), the student's build and the config check call the hooks, so a new
mechanism is one class here and a strategy line, not a flag in each of them.

Light to import (the workflow reads strategies): the hooks import torch and the models lazily.
"""
from __future__ import annotations


class Mechanism:
    name = ""
    takes_groups: frozenset[str] = frozenset()   # groups it forms: not also copied or distilled

    def check(self, cfg) -> str | None:
        """A problem with the finetune config (`cfg`) that the mechanism cannot run with."""
        return None

    def formed(self, student) -> dict[str, str]:
        """The student tensors it sets (copied.json's source: its name), each with why."""
        return {}

    def apply(self, student) -> None:
        """Set the tensors `formed` names, in place."""

    def attach(self, student, cfg, info) -> dict:
        """After the init: wire anything else in; returns entries for the init record."""
        return {}


MIMETIC_REASON = ("mimetic attention (data-free, arXiv 2305.09828): per head W_q^T W_k ~ "
                  "0.7 Z + 0.7 I and W_proj W_v ~ 0.4 Z' - 0.4 I, biases zero")


class MimeticAttention(Mechanism):
    """Attention's qkv/proj weights formed data-free (linvit.transfer.mimetic)."""
    name = "mimetic"
    takes_groups = frozenset({"attn"})

    def formed(self, student) -> dict[str, str]:
        from linvit.models import attention_modules

        return {f"blocks.{i}.attn.{layer}.{kind}": MIMETIC_REASON
                for i, attn in enumerate(attention_modules(student))
                for layer in ("qkv", "proj") for kind in ("weight", "bias")
                if getattr(getattr(attn, layer), kind) is not None}

    def apply(self, student) -> None:
        from linvit.models import attention_modules
        from linvit.transfer.mimetic import mimetic_init_

        for attn in attention_modules(student):
            mimetic_init_(attn)


class TeacherMaps(Mechanism):
    """Attention transfer, copy mode (arXiv 2411.09702): the teacher's maps drive a softmax
    student, in training and at test time (linvit.models.attention_copy)."""
    name = "teacher_maps"

    def check(self, cfg) -> str | None:
        if cfg.model.operator != "softmax":
            return (f"init.strategy: {cfg.init.strategy!r} drives a softmax student with the "
                    "teacher's attention maps; model.operator must be softmax, not "
                    f"{cfg.model.operator!r}")
        return None

    def attach(self, student, cfg, info) -> dict:
        from linvit.models.attention_copy import drive_with_teacher

        drive_with_teacher(student, maps_teacher(cfg.teacher, info))
        return {"teacher_maps": cfg.teacher}


def maps_teacher(path: str, info):
    """The teacher whose maps drive an attention-copy student: it must read the same images."""
    from linvit.errors import ConfigError
    from linvit.models.checkpoint import ModelFile

    teacher = ModelFile(path)
    spec = teacher.spec
    if (spec.img_size, spec.in_chans) != (info.img_size, info.in_chans):
        raise ConfigError(f"teacher: {path} reads {spec.img_size} px x {spec.in_chans} channels, "
                          f"the data is {info.img_size} px x {info.in_chans}; attention copy "
                          "runs the teacher on the student's own input")
    return teacher.load()
