"""timm ViTs with swapped operators; checkpoints that load strictly and safely."""
from __future__ import annotations

import os
import pickle

import pytest
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

from linvit.attention import OPERATORS
from linvit.errors import CheckpointError
from linvit.models import (
    SIZES,
    ModelSpec,
    create_vit,
    load_model,
    load_strict,
    read_spec,
    read_state_dict,
    save_model,
)
from linvit.models.timm_import import import_timm_weights

from conftest import make_model, perturb


@pytest.mark.parametrize("operator", list(OPERATORS))
def test_every_operator_builds_a_timm_vit_that_trains(tiny_spec, operator):
    model = make_model(tiny_spec, operator)
    assert isinstance(model, VisionTransformer)
    x = torch.randn(3, 1, 28, 28)
    logits = model(x)
    assert logits.shape == (3, 10)
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("size", [s for s in SIZES if s != "deit_b"])
def test_sizes_build_with_their_shapes(size):
    spec = ModelSpec(size, "linear", 10, 28 if size.startswith("cpu") else 224, 3)
    model = create_vit(spec)
    s = SIZES[size]
    assert model.embed_dim == s.width and len(model.blocks) == s.depth
    assert model.blocks[0].attn.num_heads == s.heads


def test_a_model_carries_its_spec_and_only_such_a_model_is_saved(tmp_path, tiny_spec):
    """The spec travels with the model that create_vit built (and into its file); a module without
    one, such as timm's own ViT, is refused rather than saved without a spec."""
    from timm.models.vision_transformer import VisionTransformer

    model = create_vit(tiny_spec)
    assert model.spec == tiny_spec and "spec" not in model.state_dict()
    save_model(model, tmp_path / "m.safetensors")
    assert read_spec(tmp_path / "m.safetensors") == tiny_spec
    plain = VisionTransformer(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=96,
                              depth=1, num_heads=2)
    with pytest.raises(TypeError, match="built by create_vit"):
        save_model(plain, tmp_path / "plain.safetensors")
    assert not (tmp_path / "plain.safetensors").exists()


def assert_same_tensors(loaded: dict, saved: dict) -> None:
    """Every saved tensor came back, bit for bit, with its dtype and shape, and nothing else."""
    assert sorted(loaded) == sorted(saved)
    for k, v in saved.items():
        assert (loaded[k].dtype, loaded[k].shape) == (v.dtype, v.shape), k
        assert torch.equal(loaded[k], v), \
            f"{k} differs, by up to {(loaded[k].double() - v.double()).abs().max().item():.3g}"


def test_save_and_load_round_trip_rebuilds_the_model(tmp_path, tiny_spec):
    # perturbed, so that no tensor (norms and biases included) equals what a fresh model holds
    model = perturb(make_model(tiny_spec, "focused")).eval()
    save_model(model, tmp_path / "m.safetensors")
    again = load_model(tmp_path / "m.safetensors").eval()
    assert again.spec == model.spec
    assert_same_tensors(again.state_dict(), model.state_dict())
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(model(x), again(x))


def test_wrong_key_or_shape_fails_naming_it(tmp_path, tiny_spec):
    model = make_model(tiny_spec)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["blocks.0.attn.qkv.weightt"] = state.pop("blocks.0.attn.qkv.weight")
    state["head.weight"] = torch.zeros(7, 96)
    with pytest.raises(CheckpointError) as err:
        load_strict(make_model(tiny_spec), state, "ckpt")
    msg = str(err.value)
    assert "missing (1): blocks.0.attn.qkv.weight" in msg
    assert "unexpected (1): blocks.0.attn.qkv.weightt" in msg
    assert "head.weight: checkpoint (7, 96) vs model (10, 96)" in msg


def test_torch_files_load_with_weights_only_and_wrappers_unwrapped(tmp_path, tiny_spec):
    model = perturb(make_model(tiny_spec)).eval()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"model": {f"module.{k}": v for k, v in saved.items()}, "epoch": 3},
               tmp_path / "ckpt.pth")
    state = read_state_dict(tmp_path / "ckpt.pth")
    assert_same_tensors(state, saved)
    again = make_model(tiny_spec, seed=5).eval()
    load_strict(again, state, "ckpt.pth")
    assert_same_tensors(again.state_dict(), saved)
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(again(x), model(x))


class Boom:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")   # pickle.dump's default
@pytest.mark.parametrize("writer", ["pickle", "torch"])
def test_pickled_code_is_refused(tmp_path, writer):
    marker = tmp_path / "pickled-code-ran"
    if writer == "torch":
        torch.save({"model": {"w": torch.zeros(1), "x": Boom(marker)}}, tmp_path / "evil.pth")
    else:
        with open(tmp_path / "evil.pth", "wb") as f:
            pickle.dump({"model": Boom(marker)}, f)
    with pytest.raises(CheckpointError, match="weights_only"):
        read_state_dict(tmp_path / "evil.pth")
    assert not marker.exists()


def test_bad_files_fail_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        read_state_dict(tmp_path / "nope.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        read_state_dict(tmp_path / "junk.safetensors")
    with pytest.raises(CheckpointError, match="unknown checkpoint format"):
        (tmp_path / "w.npz").write_bytes(b"")
        read_state_dict(tmp_path / "w.npz")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(CheckpointError, match="no linvit model spec"):
        load_model(tmp_path / "plain.safetensors")


@pytest.mark.parametrize("suffix", [".safetensors", ".pth", ".pth.tar"])
def test_timm_weights_import_from_a_local_file(tmp_path, tiny_spec, suffix):
    """A plain timm ViT (timm's own Attention) becomes a linvit teacher with identical outputs."""
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=96,
                            depth=6, num_heads=3).eval()
    path = tmp_path / f"timm{suffix}"
    if suffix != ".safetensors":           # .pth.tar: MoCo v3's and DeiT's own checkpoints
        torch.save({"model": ref.state_dict()}, path)
    else:
        save_file(ref.state_dict(), str(path))
    model, report = import_timm_weights(tiny_spec, path)
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(model.eval()(x), ref(x), rtol=1e-5, atol=1e-5)
    assert report["reset"] == []


def test_non_finite_weights_stop_at_import(tmp_path, tiny_spec):
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=28, patch_size=4, in_chans=1, num_classes=10, embed_dim=96,
                            depth=6, num_heads=3)
    state = ref.state_dict()
    state["blocks.3.mlp.fc1.weight"][0, 0] = float("nan")
    save_file(state, str(tmp_path / "nan.safetensors"))
    with pytest.raises(CheckpointError, match="non-finite weights .* blocks.3.mlp.fc1.weight"):
        import_timm_weights(tiny_spec, tmp_path / "nan.safetensors")


def test_timm_import_head_mismatch_needs_reset(tmp_path, tiny_spec):
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=28, patch_size=4, in_chans=1, num_classes=1000, embed_dim=96,
                            depth=6, num_heads=3)
    save_file(ref.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="head.weight"):
        import_timm_weights(tiny_spec, tmp_path / "w.safetensors")
    _, report = import_timm_weights(tiny_spec, tmp_path / "w.safetensors", reset_head=True)
    assert report["reset"] == ["head.bias", "head.weight"]


def test_timm_pretrained_loader_fills_our_softmax_operator(tmp_path):
    """The path users take with a timm cache or the hub, pointed at a local file here."""
    import timm

    from linvit.models.timm_import import _timm_pretrained

    torch.manual_seed(0)
    ref = timm.create_model("deit_tiny_patch16_224").eval()
    save_file(ref.state_dict(), str(tmp_path / "deit_t.safetensors"))
    overlay = {"file": str(tmp_path / "deit_t.safetensors")}
    model = _timm_pretrained(ModelSpec("deit_t", "softmax", 1000, 224, 3), overlay).eval()
    assert type(model.blocks[0].attn).__name__ == "SoftmaxAttention"
    x = torch.randn(1, 3, 224, 224)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)
    # another class count: timm keeps the body and starts a new head
    model = _timm_pretrained(ModelSpec("deit_t", "softmax", 10, 224, 3), overlay).eval()
    torch.testing.assert_close(model.forward_features(x), ref.forward_features(x), rtol=1e-4,
                               atol=1e-4)
    assert model(x).shape == (1, 10)


def test_the_same_tensors_and_metadata_give_the_same_file_bytes(tmp_path):
    """Written in two processes (the library orders metadata by a per-process hash), the files
    are byte-identical, and read back as written."""
    import hashlib
    import subprocess
    import sys

    script = """
import sys, torch
from linvit.models.tensor_files import save_tensors
torch.manual_seed(0)
tensors = {"b": torch.randn(3, 5), "a": torch.arange(7), "c": torch.randn(2).bfloat16()}
save_tensors(sys.argv[1], tensors, {f"key{i}": str(i) for i in range(8)})
"""
    files = [tmp_path / f"{i}.safetensors" for i in range(2)]
    for f in files:
        subprocess.run([sys.executable, "-c", script, str(f)], check=True)
    digests = {hashlib.sha256(f.read_bytes()).hexdigest() for f in files}
    assert len(digests) == 1
    from linvit.models.tensor_files import load_tensors

    tensors, meta = load_tensors(files[0])
    assert meta["key5"] == "5" and tensors["a"].tolist() == list(range(7))
    assert tensors["c"].dtype == torch.bfloat16
