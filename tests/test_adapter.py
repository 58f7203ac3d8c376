"""ViT-Adapter as the dense neck: it starts as the copied ViT (zero injections), gives the four
maps at every patch size, trains end to end, and refuses interactions that do not cover the
blocks before any compute."""
from __future__ import annotations

import pytest
import torch

from linvit.config import ConfigError
from linvit.dense.adapter import check_interactions, even_interactions
from linvit.models import ModelSpec, create_vit, save_model
from test_dense import dense_cfg

from conftest import perturb


def backbone(ckpt, **adapter):
    from linvit.dense.backbone import LinViTBackbone

    torch.manual_seed(0)
    return LinViTBackbone(str(ckpt), img_size=64, in_chans=3, neck="adapter",
                          adapter={"interactions": [[0, 1], [2, 5]], **adapter})


def block_outputs(model, run) -> list[torch.Tensor]:
    outputs = []
    hooks = [b.register_forward_hook(lambda m, i, o: outputs.append(o)) for b in model.blocks]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return outputs


def test_before_training_the_vit_computes_what_the_checkpoint_computes(backbone_ckpt):
    """Every injector's gamma is zero at init: each block's output inside the adapter equals the
    plain ViT's, to the bit; the extractors read it without changing it."""
    net = backbone(backbone_ckpt)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        inside = block_outputs(net.vit, lambda: net(x))
        plain = block_outputs(net.vit, lambda: net.vit.forward_features(x))
    assert len(inside) == len(plain) == 6
    for a, b in zip(inside, plain):
        assert torch.equal(a, b)


@pytest.mark.parametrize("size, operator", [("cpu96", "linear"), ("deit_t", "mamba2")])
def test_four_maps_at_strides_4_to_32_for_any_patch_size(size, operator, tmp_path):
    """Patch 4 (the CPU sizes) and 16 (DeiT): the same four strides, the ViT's width."""
    from linvit.dense.backbone import LinViTBackbone

    torch.manual_seed(0)
    ckpt = tmp_path / "model.safetensors"
    save_model(perturb(create_vit(ModelSpec(size, operator, 10, 32, 3))), ckpt)
    net = LinViTBackbone(str(ckpt), img_size=64, in_chans=3, neck="adapter", adapter={})
    maps = net(torch.randn(2, 3, 64, 64))
    width = net.vit.embed_dim
    assert [tuple(m.shape) for m in maps] == [(2, width, 64 // s, 64 // s)
                                              for s in (4, 8, 16, 32)]
    assert net.adapter.spec.interactions == even_interactions(len(net.vit.blocks))


def test_gradients_reach_the_injections_prior_and_vit(backbone_ckpt):
    net = backbone(backbone_ckpt)
    loss = sum(m.square().mean() for m in net(torch.randn(2, 3, 64, 64)))
    loss.backward()
    adapter = net.adapter
    # gamma's gradient is what lets training open the injection
    for p in (*(i.gamma for i in adapter.injectors), adapter.prior.stages[0][0].weight,
              adapter.level_embed, net.vit.blocks[0].attn.qkv.weight,
              adapter.extractors[-1].fc2.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_even_interactions_split_the_blocks_as_the_reference_configs():
    assert even_interactions(12) == ((0, 2), (3, 5), (6, 8), (9, 11))
    assert even_interactions(6) == ((0, 0), (1, 2), (3, 3), (4, 5))
    assert even_interactions(3) == ((0, 0), (1, 1), (2, 2))


@pytest.mark.parametrize("interactions", [[[0, 2], [4, 5]], [[0, 3], [3, 5]], [[0, 4]],
                                          [[1, 5]], [[0, 2], [3, 6]]])
def test_interactions_that_miss_or_repeat_blocks_are_refused(interactions):
    with pytest.raises(ValueError, match="interactions"):
        check_interactions(interactions, 6)


def test_bad_adapter_settings_fail_before_any_compute(backbone_ckpt, tmp_path, monkeypatch):
    from linvit.dense import stages

    monkeypatch.setattr(stages, "train_and_validate", lambda *a: pytest.fail("computed"))
    for override, message in (("model.adapter.interactions=[[0,2],[4,5]]", "interactions"),
                              ("model.adapter.heads=5", "does not divide")):
        cfg = dense_cfg("segment", tmp_path, backbone_ckpt, tmp_path, "model.neck=adapter",
                        override)
        with pytest.raises(ConfigError, match=message):
            stages.run_dense("segment", cfg, tmp_path / "run")
