"""gla's log-sigmoid of its gates (ops.definitions.log_sigmoid), the CPU path written out: values
and gradients are F.logsigmoid's, over the whole range and at the extremes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linvit.ops.definitions import log_sigmoid


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-14), (torch.float32, 2e-6)])
def test_log_sigmoid_is_f_logsigmoid_forward_and_backward(dtype, tol):
    x = torch.cat([torch.linspace(-120, 120, 20001, dtype=dtype),
                   torch.tensor([-1e4, -1e-8, 0.0, 1e-8, 1e4], dtype=dtype)])
    mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = log_sigmoid(mine), F.logsigmoid(theirs)
    grad = torch.rand_like(x)
    got.backward(grad)
    want.backward(grad)
    # absolute in value (logsigmoid grows like x below 0), relative to 1 in the gradient
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(mine.grad, theirs.grad, rtol=tol, atol=tol)
    assert torch.isfinite(got).all() and torch.isfinite(mine.grad).all()


def test_log_sigmoid_passes_gradcheck():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True) * 6
    assert torch.autograd.gradcheck(log_sigmoid, (x.detach().requires_grad_(),))
