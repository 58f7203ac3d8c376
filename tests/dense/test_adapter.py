"""ViT-Adapter as the dense neck: it starts as the copied ViT (zero injections), gives the four
maps at every patch size, trains end to end, and refuses interactions that do not cover the
blocks before any compute."""
from __future__ import annotations

import pytest
import torch
from test_dense import dense_cfg

from linvit.dense.adapter_spec import check_interactions, even_interactions
from linvit.errors import ConfigError
from linvit.models import ModelSpec, create_vit, save_model

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
                              ("model.adapter.heads=5", "does not divide the backbone's width"),
                              ("model.adapter.deform_ratio=0.3", "value width"),
                              ("model.adapter.channels=12", "multiple of 8")):
        with pytest.raises(ConfigError, match=message):
            cfg = dense_cfg("segment", tmp_path, backbone_ckpt, tmp_path, "model.neck=adapter",
                            override)
            stages.run_dense("segment", cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_levels_lay_non_square_maps_end_to_end_with_x_y_centres():
    from linvit.dense.adapter import Levels

    levels = Levels([(3, 5), (2, 7)], "cpu")
    assert levels.starts.tolist() == [0, 15]
    centres = levels.centres[0, :, 0]
    assert centres.shape == (29, 2)
    # token k of a level is row k // w, column k % w; its centre is ((col+.5)/w, (row+.5)/h)
    assert torch.allclose(centres[7], torch.tensor([(2 + 0.5) / 5, (1 + 0.5) / 3]))
    assert torch.allclose(centres[15 + 9], torch.tensor([(2 + 0.5) / 7, (1 + 0.5) / 2]))
    maps = levels.split(torch.arange(29.0).reshape(1, 29, 1))
    assert [tuple(m.shape) for m in maps] == [(1, 1, 3, 5), (1, 1, 2, 7)]
    assert maps[0][0, 0, 1, 2] == 7 and maps[1][0, 0, 1, 2] == 15 + 9


def test_deformable_attention_without_offsets_reads_each_query_s_own_position():
    """With zero sampling offsets, identity value/output projections and one point, a query
    reads the value map at its reference point: a map of each pixel's (x, y) returns the query's
    own centre, on a non-square level, so swapped axes cannot pass."""
    from linvit.dense.adapter import AdapterSpec, Levels, _deformable

    spec = AdapterSpec(interactions=((0, 0),), heads=1, points=1)
    attention = _deformable(2, spec, 1)
    with torch.no_grad():
        attention.sampling_offsets.weight.zero_()
        attention.sampling_offsets.bias.zero_()
        for linear in (attention.value_proj, attention.output_proj):
            linear.weight.copy_(torch.eye(2))
            linear.bias.zero_()
    level = Levels([(4, 6)], "cpu")
    coordinates = level.centres[:, :, 0]                         # (1, 24, 2): x, y per pixel
    out = level.attend(attention, torch.zeros(1, 24, 2), coordinates, level)
    assert torch.allclose(out, coordinates, atol=1e-5)


def test_with_the_injections_open_the_outputs_stay_finite_and_change(backbone_ckpt):
    net = backbone(backbone_ckpt)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        closed = net(x)
        for injector in net.adapter.injectors:
            injector.gamma.fill_(1.0)
        opened = net(x)
    assert all(torch.isfinite(o).all() for o in opened)
    assert not torch.allclose(closed[2], opened[2])


def test_a_frozen_vit_stays_in_eval_mode_when_training(backbone_ckpt):
    from linvit.dense.backbone import LinViTBackbone

    net = LinViTBackbone(str(backbone_ckpt), img_size=64, frozen_vit=True).train()
    assert net.training and not net.vit.training and not any(
        p.requires_grad for p in net.vit.parameters())
    assert all(p.requires_grad for p in net.levels.parameters())
    assert LinViTBackbone(str(backbone_ckpt), img_size=64).train().vit.training
