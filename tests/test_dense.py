"""Dense tasks: embedded scenes, the linvit backbone in mmseg/mmdet, one real training step and
evaluation of UperNet and Mask R-CNN with a linear-operator backbone, safe checkpoint loading."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from linvit.dense.scenes import CLASSES, STUFF, SceneSpec, make_scenes, split_digest, verify_scenes
from linvit.models import ModelSpec, create_vit, load_model, save_model

from conftest import synthetic_mnist

SPEC = SceneSpec(size=64, train=12, val=6, seed=3)


def sprites(seed):
    images, labels = synthetic_mnist(40, seed)
    return images, labels


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    root = tmp_path_factory.mktemp("scenes")
    make_scenes(root, sprites(0), sprites(1), SPEC)
    return root


def test_scenes_are_deterministic_and_hashed(scenes, tmp_path):
    make_scenes(tmp_path, sprites(0), sprites(1), SPEC)
    assert split_digest(tmp_path, "val") == split_digest(scenes, "val")
    assert split_digest(tmp_path, "train") == split_digest(scenes, "train")
    assert verify_scenes(scenes)["val_sha256"] == split_digest(scenes, "val")
    path = tmp_path / "images" / "validation" / "val_00000.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(path)
    with pytest.raises(ValueError, match="validation scenes changed"):
        verify_scenes(tmp_path)


def test_instance_masks_match_the_label_maps(scenes):
    from pycocotools import mask as mask_utils

    coco = json.loads((scenes / "coco" / "instances_train.json").read_text())
    assert coco["annotations"], "no objects were placed"
    for image in coco["images"]:
        labels = np.array(Image.open(scenes / image["file_name"].replace("images", "annotations")))
        assert labels.max() < len(CLASSES)
        for ann in (a for a in coco["annotations"] if a["image_id"] == image["id"]):
            mask = mask_utils.decode(ann["segmentation"]).astype(bool)
            assert mask.sum() == ann["area"] > 0
            # every visible pixel of an object carries its class in the semantic map
            assert (labels[mask] == len(STUFF) + ann["category_id"] - 1).all()


@pytest.fixture(scope="module")
def backbone_ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = create_vit(ModelSpec("cpu96", "linear", 10, 28, 1))
    path = tmp_path_factory.mktemp("ckpt") / "student.safetensors"
    save_model(model, path)
    return path


def test_backbone_adapts_a_28px_grey_checkpoint_to_64px_rgb(backbone_ckpt):
    from linvit.dense.backbone import LinViTBackbone

    backbone = LinViTBackbone(checkpoint=str(backbone_ckpt), img_size=64, in_chans=3)
    maps = backbone(torch.randn(2, 3, 64, 64))
    assert [tuple(m.shape) for m in maps] == [(2, 96, 16, 16), (2, 96, 8, 8), (2, 96, 4, 4),
                                              (2, 96, 2, 2)]
    assert backbone.vit.pos_embed.shape == (1, 1 + 16 * 16, 96)
    # the blocks are the checkpoint's, tensor for tensor
    source = load_model(backbone_ckpt)
    assert torch.equal(backbone.vit.blocks[3].mlp.fc1.weight, source.blocks[3].mlp.fc1.weight)


def dense_cfg(task, root, ckpt, work, *extra):
    from linvit.config import DenseConfig, load_config

    return load_config(DenseConfig, None, [
        f"checkpoint={ckpt}", f"data.root={root}", "data.batch_size=2", "optim.iters=2",
        "optim.checkpoint_every=1", "model.head_channels=32", "run.progress=false", *extra])


@pytest.mark.slow
@pytest.mark.parametrize("task, keys", [("segment", {"mIoU", "aAcc"}),
                                         ("detect", {"box_AP", "mask_AP"})])
def test_one_training_step_and_evaluation(task, keys, scenes, backbone_ckpt, tmp_path):
    from linvit.dense.stages import run_dense

    metrics = run_dense(task, dense_cfg(task, scenes, backbone_ckpt, tmp_path), tmp_path / task)
    assert keys <= set(metrics) and all(np.isfinite(metrics[k]) for k in keys)
    assert metrics["backbone"]["operator"] == "linear" and metrics["iters"] == 2
    assert (tmp_path / task / "work" / "last_checkpoint").is_file()


@pytest.mark.slow
def test_interrupted_dense_run_resumes_from_mmengines_checkpoint_safely(scenes, backbone_ckpt,
                                                                        tmp_path, monkeypatch):
    """A run cut after its checkpoints resumes through torch.load(weights_only=True) with
    linvit's allow-list; a pickle with anything else in it is still refused."""
    from mmengine.runner import Runner

    from linvit.dense.stages import run_dense

    cfg = dense_cfg("segment", scenes, backbone_ckpt, tmp_path)
    real_val = Runner.val
    monkeypatch.setattr(Runner, "val", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run_dense("segment", cfg, tmp_path / "run")
    monkeypatch.setattr(Runner, "val", real_val)
    loaded = []
    original_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loaded.append(k) or original_load(*a, **k))
    metrics = run_dense("segment", cfg, tmp_path / "run")
    assert "mIoU" in metrics
    assert loaded and all(k.get("weights_only", True) for k in loaded)

    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"meta": print}, f)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(evil)
