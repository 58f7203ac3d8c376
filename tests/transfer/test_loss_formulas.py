"""Every distillation loss against its formula written out here, element by element in plain
Python, at a temperature other than 1: a loss normalised differently (a mean where a sum belongs,
T instead of T^2) fails."""
from __future__ import annotations

import math

import pytest
import torch

from linvit.transfer.distill import DistillObjective
from linvit.transfer.kd import LogitKDObjective
from linvit.transfer.losses import LOSSES

from conftest import make_model, perturb

T = 2.5


def softmax(row: list[float], t: float = 1.0) -> list[float]:
    top = max(x / t for x in row)
    e = [math.exp(x / t - top) for x in row]
    return [v / sum(e) for v in e]


def mean_squared(s: torch.Tensor, t: torch.Tensor) -> float:
    pairs = list(zip(s.flatten().tolist(), t.flatten().tolist()))
    return sum((a - b) ** 2 for a, b in pairs) / len(pairs)


def map_cross_entropy(a: torch.Tensor, p: torch.Tensor) -> float:
    """-sum_j P_ij log A_ij per row (batch, head, query), A floored at 1e-6, averaged over rows."""
    rows_a, rows_p = a.reshape(-1, a.shape[-1]).tolist(), p.reshape(-1, p.shape[-1]).tolist()
    per_row = [-sum(pj * math.log(max(aj, 1e-6)) for aj, pj in zip(ra, rp))
               for ra, rp in zip(rows_a, rows_p)]
    return sum(per_row) / len(per_row)


def logit_kd(s: torch.Tensor, t: torch.Tensor, temperature: float) -> float:
    """T^2 x the batch mean of KL(softmax(t / T) || softmax(s / T))."""
    kls = []
    for zs, zt in zip(s.tolist(), t.tolist()):
        ps, pt = softmax(zs, temperature), softmax(zt, temperature)
        kls.append(sum(b * (math.log(b) - math.log(a)) for a, b in zip(ps, pt)))
    return temperature ** 2 * sum(kls) / len(kls)


# per target: (the formula, example student and teacher quantities)
def _maps():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(2, 2, 4, 4, generator=g) * 2, -1)
    a[0, 0, 0] = torch.tensor([0.0, 0.5, 0.5, 0.0])            # entries under the floor
    return a, torch.softmax(torch.randn(2, 2, 4, 4, generator=g), -1)


def _tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)


def _logits():
    g = torch.Generator().manual_seed(2)
    return 3 * torch.randn(4, 10, generator=g), 3 * torch.randn(4, 10, generator=g)


FORMULAS = {
    "attn_map": (map_cross_entropy, _maps),
    "attn_out": (mean_squared, _tokens),
    "block_out": (mean_squared, _tokens),
    "logits": (lambda s, t: logit_kd(s, t, T), _logits),
}


@pytest.mark.parametrize("name", list(LOSSES))
def test_each_loss_is_its_formula_at_a_temperature_other_than_one(name):
    loss = LOSSES[name]
    formula, example = FORMULAS[loss.target]          # a new target needs its formula here
    student, teacher = example()
    got = loss.fn(student, teacher, temperature=T).item()
    assert got == pytest.approx(formula(student, teacher), rel=1e-5, abs=1e-7)


def test_the_temperature_changes_logit_kd_as_t_squared_times_the_softened_kl():
    s, t = _logits()
    fn = LOSSES["logit_kd"].fn
    values = {temp: fn(s, t, temperature=temp).item() for temp in (1.0, 2.5, 4.0)}
    assert len({round(v, 6) for v in values.values()}) == 3
    for temp, value in values.items():
        assert value == pytest.approx(logit_kd(s, t, temp), rel=1e-5)


def test_the_distillation_passes_its_temperature_to_logit_kd(tiny_spec):
    teacher = perturb(make_model(tiny_spec, "softmax", seed=1)).eval()
    student = perturb(make_model(tiny_spec, "linear", seed=2), seed=3)
    images = torch.randn(3, 1, 28, 28)
    objective = DistillObjective(student, teacher, {"logit_kd": 1.0}, temperature=3.0)
    total, logs = objective(images)
    with torch.no_grad():
        want = logit_kd(student(images), teacher(images), 3.0)
    assert logs["logit_kd"].item() == pytest.approx(want, rel=1e-4)
    assert total.item() == pytest.approx(want, rel=1e-4)


def test_fine_tuning_kd_mixes_cross_entropy_and_the_softened_kl_by_its_weight(tiny_spec):
    teacher = perturb(make_model(tiny_spec, "softmax", seed=1)).eval()
    model = perturb(make_model(tiny_spec, "linear", seed=2), seed=3)
    images, labels = torch.randn(3, 1, 28, 28), torch.tensor([1, 4, 7])
    objective = LogitKDObjective(model, 0.0, teacher, weight=0.3, temperature=2.0).eval()
    total, logs = objective(images, labels)
    with torch.no_grad():
        logits, target = model(images), teacher(images)
    ce = sum(-math.log(softmax(row)[y]) for row, y in zip(logits.tolist(), labels.tolist())) / 3
    kd = logit_kd(logits, target, 2.0)
    assert logs["kd"].item() == pytest.approx(kd, rel=1e-4)
    assert total.item() == pytest.approx(0.7 * ce + 0.3 * kd, rel=1e-4)
