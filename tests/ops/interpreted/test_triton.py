"""The Triton kernels against the PyTorch reference: on a GPU when there is one, else on the CPU
under Triton's interpreter.

Collected only on a CUDA machine or when TRITON_INTERPRET=1 was set before anything imported
triton (the interpreter cannot be switched on later): tests/ops/test_kernels.py runs this folder in
such a process.
"""
from __future__ import annotations

import os

import pytest
import torch

from kernel_cases import VARIANTS, assert_match, inputs, run

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not (INTERPRETED or torch.cuda.is_available()):
    # named on the command line, this folder escapes conftest's collect_ignore
    pytest.skip("needs a GPU or TRITON_INTERPRET=1 before triton's import "
                "(tests/ops/test_kernels.py runs this folder so)", allow_module_level=True)

from linvit.ops.triton_kernels import MAX_HEAD_DIM  # noqa: E402  (after the skip: needs triton)

DEVICE = "cpu" if INTERPRETED else "cuda"


def on_device(qkv, grad):
    return [t.to(DEVICE) for t in qkv], grad.to(DEVICE)


@pytest.mark.parametrize("kind,normalize", VARIANTS)
@pytest.mark.parametrize("shape,dv,splits", [
    ((2, 3, 63, 24), 24, None),          # N=63 and head dim 24: every tile is partly masked
    ((1, 2, 63, 24), 40, 2),             # Dv != Dk, the token reduction split over 2 programs
    ((1, 1, 200, 64), 64, 3),            # several BLOCK_N steps per split, a ragged last one
])
def test_triton_matches_reference(kind, normalize, shape, dv, splits):
    qkv, grad = on_device(*inputs(shape, dv, kind=kind, normalize=normalize))
    want = run("reference", qkv, grad, kind, normalize)
    got = run("triton-direct", qkv, grad, kind, normalize, splits=splits, block_n=16)
    assert_match(got, want)


@pytest.mark.parametrize("kind,normalize", VARIANTS)
def test_triton_bf16_inputs_keep_dtypes(kind, normalize):
    qkv, grad = on_device(*inputs((1, 2, 63, 24), 24, dtype=torch.bfloat16, kind=kind,
                                  normalize=normalize))
    want = run("reference", qkv, grad, kind, normalize)
    got = run("triton-direct", qkv, grad, kind, normalize, block_n=32)
    assert_match(got, want, rtol=2e-2)             # outputs and grads are rounded to bf16


def test_triton_rejects_head_dims_over_its_limit():
    qkv, grad = on_device(*inputs((1, 1, 16, MAX_HEAD_DIM + 1), 16))
    with pytest.raises(ValueError, match=f"head dims <= {MAX_HEAD_DIM}, got Dk={MAX_HEAD_DIM + 1}"):
        run("triton-direct", qkv, grad, "elu1", True)
