"""The chunk length of the chunked CPU paths (gated scan, delta rule): as few chunks as the longest
chunk allows, padding under one token per chunk, and the paths run the length it picks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linvit.ops.delta_rule as dr
import linvit.ops.gated_scan as gs
from linvit.ops.backends import backend
from linvit.ops.chunks import chunk_size


@pytest.mark.parametrize("longest", [1, 3, 32, 64])
def test_chunk_size_takes_the_fewest_chunks_and_pads_under_a_token_each(longest):
    for tokens in range(1, 300):
        size = chunk_size(tokens, longest)
        chunks = -(-tokens // size)
        assert size <= longest
        assert chunks == -(-tokens // longest), (tokens, size)
        assert 0 <= chunks * size - tokens < chunks, (tokens, size)


def test_chunk_size_of_the_shapes_linvit_trains_on():
    # 28 px in 4 px patches + cls; 224 px in 16 px patches + cls; a power of two
    assert [chunk_size(n, 64) for n in (50, 197, 4096)] == [50, 50, 64]
    assert [chunk_size(n, 32) for n in (50, 197, 4096)] == [25, 29, 32]
    assert chunk_size(0, 64) == 1                       # no tokens: no chunks, any length
    for tokens, longest in ((-1, 64), (50, 0)):
        with pytest.raises(ValueError, match="tokens >= 0 and longest >= 1"):
            chunk_size(tokens, longest)


@pytest.mark.parametrize("module, picked", [(gs, 50), (dr, 25)], ids=["gated_scan", "delta_rule"])
def test_the_chunked_paths_run_the_chunk_size_picks(module, picked, monkeypatch):
    """50 tokens: one chunk of 50 (longest 64), two of 25 (longest 32), not padded to 64."""
    seen = []

    def spy(real):
        return lambda *args: seen.append(args[-1]) or real(*args)

    for path in ("chunked_scan", "cpp_scan"):          # the PyTorch chunks, or the C++ kernel's
        monkeypatch.setattr(module, path, spy(getattr(module, path)))
    q, k, v = (torch.randn(1, 2, 50, 8) for _ in range(3))
    with backend("torch"):
        if module is gs:
            gs.gated_scan(q, k, v, -torch.rand(2, 1, 2, 50, 8))
        else:
            dr.delta_rule(q, F.normalize(k, dim=-1), v, *torch.rand(2, 1, 2, 50), scale=1.0)
    assert seen == [picked]
