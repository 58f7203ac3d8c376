"""Teachers from any timm ViT: the architecture read from timm itself, carried in the spec; a
random-weight timm model of each architecture (no download) saved as a local file, imported,
converted to every operator family and exported, its tensors copied bit for bit, the softmax
copy_all student reproducing timm's logits."""
from __future__ import annotations

import dataclasses

import pytest
import timm
import torch
from safetensors.torch import save_file

import linvit  # noqa: F401  (registers linvit_vit with timm)
from linvit.attention import OPERATORS
from linvit.errors import ConfigError
from linvit.models import ModelSpec, create_vit
from linvit.models.architecture import read_architecture
from linvit.models.hub import pretrained_cfg, write_hf_folder
from linvit.models.timm_import import import_timm_weights
from linvit.transfer.init import apply_init
from linvit.transfer.strategies import STRATEGIES

from conftest import perturb

# what each architecture is, as its paper and timm's model card say (not read by the code under
# test): width, depth, heads, patch, LayerScale, position embedding over patches only
ARCHITECTURES = {
    "deit_small_patch16_224": (384, 12, 6, 16, False, False),
    "deit3_small_patch16_224": (384, 12, 6, 16, True, True),
    "vit_small_patch14_dinov2": (384, 12, 6, 14, True, False),
    "vit_base_patch16_224.mae": (768, 12, 12, 16, False, False),
    "vit_large_patch16_224": (1024, 24, 16, 16, False, False),
}
DEPTH = 2          # the blocks built with weights here; the shape of each block is the real one


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_the_architecture_is_read_from_timm(name):
    size = read_architecture(name)
    width, depth, heads, patch, layer_scale, patches_only = ARCHITECTURES[name]
    assert (size.width, size.depth, size.heads, size.patch_size) == (width, depth, heads, patch)
    assert (size.init_values is not None, size.no_embed_class) == (layer_scale, patches_only)
    assert size.class_token and size.reg_tokens == 0 and size.global_pool == "token"
    assert size.timm_name == name


def test_register_tokens_and_average_pooling_are_read_too():
    size = read_architecture("vit_little_patch16_reg1_gap_256.sbb_in12k")
    assert (size.class_token, size.reg_tokens, size.global_pool, size.fc_norm) == \
        (False, 1, "avg", True)


@pytest.mark.parametrize("name, why", [
    ("vit_base_patch16_clip_224", "LayerNorm(eps=1e-05)"),
    ("vit_base_patch16_siglip_224", "global_pool='map'"),
    ("resnet50", "not a VisionTransformer"),
    ("no_such_model", "neither a linvit size nor a timm model"),
])
def test_what_linvit_cannot_build_is_refused_naming_it(name, why):
    with pytest.raises(ConfigError, match=why.replace("(", r"\(").replace(")", r"\)")):
        read_architecture(name)


def small_timm(name: str):
    """A random-weight timm model of the architecture, DEPTH blocks, a 2x2 patch grid, every
    tensor (LayerScale too) moved off its init so that no block is an identity."""
    patch = ARCHITECTURES[name][3]
    torch.manual_seed(0)
    model = timm.create_model(name.split(".")[0], pretrained=False, depth=DEPTH,
                              img_size=2 * patch, num_classes=10)
    return perturb(model).eval(), 2 * patch


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def imported(request, tmp_path_factory):
    name = request.param
    model, img = small_timm(name)
    path = tmp_path_factory.mktemp("timm") / "weights.safetensors"
    save_file(model.state_dict(), path)
    arch = dataclasses.replace(read_architecture(name), depth=DEPTH)
    spec = ModelSpec(name, "softmax", 10, img, 3, architecture=dataclasses.asdict(arch))
    teacher, report = import_timm_weights(spec, path)
    torch.manual_seed(1)
    return name, model, teacher.eval(), torch.randn(3, 3, img, img)


@pytest.mark.slow
def test_the_imported_teacher_is_timms_model(imported):
    name, timm_model, teacher, x = imported
    ours, theirs = teacher.state_dict(), timm_model.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    with torch.no_grad():
        torch.testing.assert_close(teacher(x), timm_model(x), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("operator", list(OPERATORS))
def test_every_operator_converts_with_every_copied_tensor_the_teachers(imported, operator):
    name, timm_model, teacher, x = imported
    torch.manual_seed(2)
    student = create_vit(teacher.spec.with_operator(operator)).eval()
    assert student.spec.architecture == teacher.spec.architecture
    state = teacher.state_dict()
    record = apply_init(student, STRATEGIES["copy_all"], state)
    copied = [k for k, e in record["tensors"].items() if e["source"] == "teacher"]
    own = student.state_dict()
    assert copied and all(torch.equal(own[k], state[k]) for k in copied)
    assert {k for k in state if not k.startswith(("blocks.", "head."))} <= set(copied)
    with torch.no_grad():
        logits = student(x)
        assert logits.shape == (3, 10) and torch.isfinite(logits).all()
        if operator == "softmax":
            torch.testing.assert_close(logits, timm_model(x), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_converted_student_exports_and_timm_rebuilds_it(imported, tmp_path):
    name, _, teacher, x = imported
    student = create_vit(teacher.spec.with_operator("gla")).eval()
    apply_init(student, STRATEGIES["copy_mlp"], teacher.state_dict())
    write_hf_folder(student, tmp_path, pretrained_cfg(student.spec, (0.5,) * 3, (0.5,) * 3), {})
    rebuilt = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    assert rebuilt.spec == student.spec
    with torch.no_grad():
        assert torch.equal(rebuilt(x), student(x))
