"""Apply an init strategy to a freshly built student, and keep a checked record of it.

The record (saved as copied.json beside the student) lists every tensor of the student with its
group and its source: "teacher" (bit-identical copy), "distilled" (bit-identical copy from the
distilled student), a mechanism's name (formed by it, e.g. "mimetic": linvit.transfer.mechanisms)
or "new" (with the
reason when a copied group could not supply it).
`verify_init` re-checks a record against the tensors; `apply_init` runs it before returning.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from linvit.errors import CheckpointError
from linvit.models import attention_modules
from linvit.transfer.groups import group_of
from linvit.transfer.strategies import InitStrategy


def operator_specific_reasons(model: nn.Module) -> dict[str, str]:
    """Each operator-specific tensor's full name -> why it is new (and, where the operator
    declares it, why it starts where it does)."""
    reasons = {}
    for i, attn in enumerate(attention_modules(model)):
        for n in attn.operator_specific_parameters():
            note = attn.init_note(n)
            reasons[f"blocks.{i}.attn.{n}"] = (f"operator-specific ({attn.name}): a softmax "
                                               "teacher has no such tensor"
                                               + (f"; init: {note}" if note else ""))
    return reasons


def plan_init(student: nn.Module, strategy: InitStrategy, teacher: dict[str, torch.Tensor],
              distilled: dict[str, torch.Tensor] | None) -> dict[str, dict]:
    """Decide each student tensor's source; fail on anything a declared group cannot supply."""
    if strategy.needs_distilled and distilled is None:
        raise ValueError(f"strategy {strategy.name!r} takes {sorted(strategy.distilled)} from a "
                         "distilled student, but none was given")
    own_only = operator_specific_reasons(student)
    formed = {name: (m.name, reason) for m in strategy.mechanisms
              for name, reason in m.formed(student).items()}
    plan, problems = {}, []
    for name, tensor in student.state_dict().items():
        group = group_of(name)
        entry = {"group": group, "source": "new", "shape": list(tensor.shape)}
        if name in own_only:                  # new unless a distilled student supplies it
            entry["reason"] = own_only[name]
        if name in formed:                    # set by a mechanism of the strategy
            source, reason = formed[name]
            plan[name] = {**entry, "source": source, "reason": reason}
            continue
        if group in strategy.distilled:
            src, label = distilled, "distilled"
        elif group in strategy.copy:
            src, label = teacher, "teacher"
        else:
            plan[name] = entry
            continue
        if name in src and src[name].shape == tensor.shape:
            entry["source"] = label
            entry.pop("reason", None)
        elif label == "teacher" and name in own_only and name not in src:
            pass                              # new, with the reason given above
        elif label == "teacher" and group == "head" and name not in src:
            entry["reason"] = "the teacher has no head (a headless, self-supervised backbone)"
        elif label == "teacher" and group == "head" and name in src:
            entry["reason"] = (f"teacher head {tuple(src[name].shape)} does not fit "
                               f"{tuple(tensor.shape)} (another class count)")
        else:
            found = tuple(src[name].shape) if name in src else "missing"
            problems.append(f"{name} ({group}) from {label}: {found} vs {tuple(tensor.shape)}")
        plan[name] = entry
    if problems:
        raise CheckpointError("cannot initialise the student as declared:\n  "
                              + "\n  ".join(problems[:20]))
    return plan


def apply_init(student: nn.Module, strategy: InitStrategy, teacher: dict[str, torch.Tensor],
               distilled: dict[str, torch.Tensor] | None = None) -> dict:
    plan = plan_init(student, strategy, teacher, distilled)
    sources = {"teacher": teacher, "distilled": distilled}
    for mechanism in strategy.mechanisms:
        mechanism.apply(student)
    state = student.state_dict()
    with torch.no_grad():
        for name, entry in plan.items():
            if entry["source"] in sources:
                state[name].copy_(sources[entry["source"]][name])
    record = {
        "strategy": strategy.name,
        "copy_groups": sorted(strategy.copy),
        "distilled_groups": sorted(strategy.distilled),
        "summary": dict(Counter(e["source"] for e in plan.values())),
        "tensors": plan,
    }
    verify_init(student, record, teacher, distilled)
    return record


def verify_init(student: nn.Module, record: dict, teacher: dict[str, torch.Tensor],
                distilled: dict[str, torch.Tensor] | None = None) -> None:
    """Check a record against the tensors: it covers the model exactly, copies are bit-identical."""
    state = student.state_dict()
    listed = record["tensors"]
    if set(listed) != set(state):
        raise AssertionError(f"record/model tensor sets differ: only in record "
                             f"{sorted(set(listed) - set(state))[:5]}, only in model "
                             f"{sorted(set(state) - set(listed))[:5]}")
    sources = {"teacher": teacher, "distilled": distilled}
    for name, entry in listed.items():
        if entry["source"] not in sources:        # new, or formed here (mimetic)
            continue
        src = sources[entry["source"]]
        if src is None or not torch.equal(state[name], src[name].to(state[name].dtype)):
            raise AssertionError(f"{name} is recorded as copied from {entry['source']} but "
                                 "differs from it")
