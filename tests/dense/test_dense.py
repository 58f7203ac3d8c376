"""Dense tasks: embedded scenes (their settings and classes defined once), the linvit backbone in
mmseg/mmdet, one real training step and evaluation of UperNet and Mask R-CNN with a
linear-operator backbone, safe checkpoint loading."""
from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from linvit import cli
from linvit.config import load_config
from linvit.dense.config import ScenesConfig
from linvit.dense.scenes import (
    CLASSES,
    GROUND_CLASSES,
    STUFF,
    THINGS,
    SceneSpec,
    make_scenes,
    split_digest,
    verify_scenes,
)
from linvit.errors import ConfigError
from linvit.io import load_yaml

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


@pytest.mark.parametrize("ground", GROUND_CLASSES)
def test_instance_masks_match_the_label_maps(scenes, tmp_path, ground):
    from pycocotools import mask as mask_utils

    if ground != SPEC.background:
        scenes = tmp_path
        make_scenes(scenes, sprites(0), sprites(1), dataclasses.replace(SPEC, background=ground))
    manifest = verify_scenes(scenes)
    grounds = len(GROUND_CLASSES[ground])
    assert manifest["classes"] == [*GROUND_CLASSES[ground], *THINGS]
    coco = json.loads((scenes / "coco" / "instances_train.json").read_text())
    assert coco["annotations"], "no objects were placed"
    for image in coco["images"]:
        labels = np.array(Image.open(scenes / image["file_name"].replace("images", "annotations")))
        assert labels.max() < len(manifest["classes"])
        pixels = np.array(Image.open(scenes / image["file_name"]))
        if ground == "black":                   # the ground's pixels are black
            assert (pixels[labels == 0] == 0).all()
        for ann in (a for a in coco["annotations"] if a["image_id"] == image["id"]):
            mask = mask_utils.decode(ann["segmentation"]).astype(bool)
            assert mask.sum() == ann["area"] > 0
            # every visible pixel of an object carries its class in the semantic map
            assert (labels[mask] == grounds + ann["category_id"] - 1).all()


def test_scene_settings_are_defined_once():
    """make-scenes' config is SceneSpec plus where the sprites are: every scene setting (field,
    default, range check) is SceneSpec's, so a new one reaches the CLI and its checks at once."""
    spec_fields = [(f.name, f.type, f.default) for f in dataclasses.fields(SceneSpec)]
    assert [(f.name, f.type, f.default) for f in dataclasses.fields(ScenesConfig)] == \
        spec_fields + [("sprites_root", "str | None", None)]
    assert issubclass(ScenesConfig, SceneSpec) and ScenesConfig.validate is SceneSpec.validate
    cfg = load_config(ScenesConfig, None, ["size=32", "seed=5", "sprites_root=/x"])
    assert cfg.scene_spec() == SceneSpec(size=32, seed=5)
    assert type(cfg.scene_spec()) is SceneSpec
    for bad, message in ((dict(min_scale=0.9), "min_scale/max_scale"), (dict(size=8), "size"),
                         (dict(seed=2**63 - 1), "seed"), (dict(background="grey"), "background")):
        with pytest.raises(ConfigError, match=message):
            SceneSpec(**bad).validate()
        with pytest.raises(ConfigError, match=message):
            load_config(ScenesConfig, None, [f"{k}={v}" for k, v in bad.items()])


def test_make_scenes_cli_writes_the_scenes_of_its_settings(mnist_root, tmp_path):
    """`linvit make-scenes` with a config gives the same bytes as make_scenes with the same
    SceneSpec; MANIFEST.json holds every scene setting, config.yaml those and sprites_root."""
    out = tmp_path / "cli"
    assert cli.main(["make-scenes", "-o", str(out), f"sprites_root={mnist_root}", "size=32",
                     "train=3", "val=2", "seed=5", "max_scale=0.5"]) == 0
    spec = SceneSpec(size=32, train=3, val=2, seed=5, max_scale=0.5)
    direct = make_scenes(tmp_path / "direct", synthetic_mnist(512, 0), synthetic_mnist(256, 1),
                         spec)
    manifest = verify_scenes(out)
    assert manifest == direct
    assert manifest["spec"] == dataclasses.asdict(spec)          # every field of SceneSpec
    assert split_digest(out, "train") == split_digest(tmp_path / "direct", "train")
    config = load_yaml((out / "config.yaml").read_text())["config"]
    assert config == {**manifest["spec"], "sprites_root": str(mnist_root)}


def test_scene_classes_are_fashion_mnists_own(scenes):
    """The things are Fashion-MNIST's classes (one definition, in the data module), in label
    order: in the COCO categories, the manifest and the label maps' numbering."""
    from linvit.data import DATASETS, fashion_mnist

    assert THINGS is fashion_mnist.CLASSES
    assert DATASETS["fashion_mnist"].info().class_names == THINGS
    assert CLASSES == STUFF + THINGS
    coco = json.loads((scenes / "coco" / "instances_val.json").read_text())
    assert [(c["id"], c["name"]) for c in coco["categories"]] == list(enumerate(THINGS, 1))
    manifest = verify_scenes(scenes)
    assert (manifest["things"], manifest["classes"]) == (list(THINGS), list(CLASSES))


def test_the_dense_package_imports_without_openmmlab():
    """Configs, scenes and the CLI's stage table load with OpenMMLab absent; only running
    segment/detect needs it."""
    blocked = ("mmengine", "mmcv", "mmseg", "mmdet", "pycocotools")
    code = "\n".join([
        "import sys",
        *(f"sys.modules[{m!r}] = None" for m in blocked),
        "import linvit.dense.scenes, linvit.dense.config, linvit.dense.configs",
        "import linvit.dense.stages, linvit.dense.backbone, linvit.dense.safe_load",
        "from linvit.cli import stage_config",
        "assert [stage_config(s).__name__ for s in ('make-scenes', 'segment')] == "
        "['ScenesConfig', 'DenseConfig']"])
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_backbone_adapts_a_28px_grey_checkpoint_to_64px_rgb(backbone_ckpt):
    from linvit.dense.backbone import LinViTBackbone

    backbone = LinViTBackbone(checkpoint=str(backbone_ckpt), img_size=64, in_chans=3)
    maps = backbone(torch.randn(2, 3, 64, 64))
    assert [tuple(m.shape) for m in maps] == [(2, 96, 16, 16), (2, 96, 8, 8), (2, 96, 4, 4),
                                              (2, 96, 2, 2)]
    assert backbone.vit.pos_embed.shape == (1, 1 + 16 * 16, 96)
    # every tensor is the checkpoint's, bit for bit, but the two adapted to 64px RGB and the
    # dropped classifier (read from the file itself, not through linvit's loader)
    saved = load_file(str(backbone_ckpt))
    own = backbone.vit.state_dict()
    adapted = {"pos_embed", "patch_embed.proj.weight"}
    assert set(saved) - set(own) <= {"head.weight", "head.bias"}
    for k, v in own.items():
        if k in saved and k not in adapted:
            assert torch.equal(v, saved[k]), k
    assert {k for k in own if k in saved and k not in adapted} >= {
        f"blocks.{i}.{n}" for i in range(6) for n in ("norm1.weight", "attn.qkv.weight",
                                                       "attn.proj.bias", "mlp.fc2.weight")}
    # a grey image copied into the three channels gives the checkpoint's own patch embedding
    torch.testing.assert_close(own["patch_embed.proj.weight"].sum(1, keepdim=True),
                               saved["patch_embed.proj.weight"])


@pytest.mark.parametrize("neck", ["simple", "adapter"])
def test_roi_heads_read_the_backbones_own_maps(neck, backbone_ckpt):
    """Mask R-CNN's RoI features (mmcv's RoIAlign, after an FPN) equal torchvision's RoIAlign of
    the same maps. mmcv reads any input as contiguous NCHW (open-mmlab/mmcv#2203), and a token
    grid is a channels-last view: without contiguous maps the RoI heads get scrambled features."""
    from mmcv.ops import RoIAlign
    from mmdet.models.necks import FPN
    from torchvision.ops import roi_align

    from linvit.dense.backbone import LinViTBackbone

    backbone = LinViTBackbone(checkpoint=str(backbone_ckpt), img_size=64, in_chans=3, neck=neck,
                              adapter={"interactions": [[0, 2], [3, 5]]} if neck == "adapter"
                              else None)
    fpn = FPN(in_channels=[96] * 4, out_channels=16, num_outs=4)
    with torch.no_grad():
        maps = fpn(backbone(torch.randn(2, 3, 64, 64)))
    rois = torch.tensor([[0, 3.0, 5.0, 50.0, 60.0], [1, 10.5, 7.2, 33.3, 40.1]])
    for level, stride in zip(maps, (4, 8, 16, 32)):
        torch.testing.assert_close(RoIAlign(7, 1 / stride, 0, aligned=True)(level, rois),
                                   roi_align(level, rois, 7, 1 / stride, 0, True))


def dense_cfg(task, root, ckpt, work, *extra):
    from linvit.config import load_config
    from linvit.dense.config import DenseConfig

    return load_config(DenseConfig, None, [
        f"checkpoint={ckpt}", f"data.root={root}", "data.batch_size=2", "optim.iters=2",
        "optim.checkpoint_every=1", "model.head_channels=32", "run.progress=false", *extra])

def test_dense_configs_name_the_scene_classes_and_a_backbone_that_builds(scenes, backbone_ckpt,
                                                                          tmp_path):
    """The mmengine configs carry the scene classes, and their backbone entry is exactly what
    LinViTBackbone takes (built here from it, checkpoint and all)."""
    from linvit.dense.backbone import LinViTBackbone
    from linvit.dense.configs import detection_config, segmentation_config

    cfg = dense_cfg("segment", scenes, backbone_ckpt, tmp_path)
    seg = segmentation_config(cfg, 96, [0.0] * 3, [1.0] * 3, str(tmp_path))
    det = detection_config(cfg, 96, [0.0] * 3, [1.0] * 3, str(tmp_path))
    assert seg["train_dataloader"]["dataset"]["metainfo"]["classes"] == CLASSES
    assert seg["model"]["decode_head"]["num_classes"] == len(CLASSES)
    assert det["train_dataloader"]["dataset"]["metainfo"]["classes"] == THINGS
    assert det["model"]["roi_head"]["bbox_head"]["num_classes"] == len(THINGS)
    # the classes are the scenes' own (MANIFEST.json): on a black ground, one background class
    black = tmp_path / "black"
    make_scenes(black, sprites(0), sprites(1), dataclasses.replace(SPEC, background="black"))
    seg_black = segmentation_config(dense_cfg("segment", black, backbone_ckpt, tmp_path), 96,
                                    [0.0] * 3, [1.0] * 3, str(tmp_path))
    assert seg_black["train_dataloader"]["dataset"]["metainfo"]["classes"] == \
        ("background", *THINGS)
    assert seg_black["model"]["decode_head"]["num_classes"] == 1 + len(THINGS)
    for config in (seg, det):
        entry = dict(config["model"]["backbone"])
        assert entry.pop("type") == "LinViTBackbone"
        assert entry == {"checkpoint": str(backbone_ckpt), "img_size": 64, "in_chans": 3,
                         "neck": "simple", "adapter": None, "frozen_vit": False}
        maps = LinViTBackbone(**entry)(torch.randn(1, 3, 64, 64))
        assert [m.shape[-1] for m in maps] == [16, 8, 4, 2]


@pytest.mark.slow
@pytest.mark.parametrize("neck", ["simple", "adapter"])
@pytest.mark.parametrize("task, keys", [("segment", {"mIoU", "aAcc"}),
                                         ("detect", {"box_AP", "mask_AP"})])
def test_one_training_step_and_evaluation(task, keys, neck, scenes, backbone_ckpt, tmp_path):
    from linvit.dense.safe_load import mmengine_checkpoints_allowed
    from linvit.dense.stages import run_dense

    cfg = dense_cfg(task, scenes, backbone_ckpt, tmp_path, f"model.neck={neck}",
                    "model.adapter.interactions=[[0,2],[3,5]]")
    metrics = run_dense(task, cfg, tmp_path / task)
    assert keys <= set(metrics) and all(np.isfinite(metrics[k]) for k in keys)
    assert metrics["backbone"]["operator"] == "linear" and metrics["iters"] == 2
    assert (tmp_path / task / "work" / "last_checkpoint").is_file()
    with mmengine_checkpoints_allowed():
        saved = torch.load(tmp_path / task / "work" / "iter_2.pth")["state_dict"]
    assert any(".adapter.injectors." in k for k in saved) == (neck == "adapter")


@pytest.mark.slow
def test_a_frozen_vit_keeps_its_checkpoint_through_training(scenes, backbone_ckpt, tmp_path):
    from linvit.dense.safe_load import mmengine_checkpoints_allowed
    from linvit.dense.stages import run_dense

    cfg = dense_cfg("segment", scenes, backbone_ckpt, tmp_path, "model.frozen_vit=true",
                    "optim.lr=0.01")
    run_dense("segment", cfg, tmp_path / "run")
    with mmengine_checkpoints_allowed():
        trained = torch.load(tmp_path / "run" / "work" / "iter_2.pth")["state_dict"]
    saved = load_file(str(backbone_ckpt))
    vit = {k.removeprefix("backbone.vit."): v for k, v in trained.items()
           if k.startswith("backbone.vit.")}
    adapted = {"pos_embed", "patch_embed.proj.weight"}         # resampled to 64 px RGB
    assert len(vit) > 50 and all(torch.equal(v, saved[k]) for k, v in vit.items()
                                 if k not in adapted)


@pytest.mark.slow
def test_interrupted_dense_run_resumes_from_mmengines_checkpoint_safely(scenes, backbone_ckpt,
                                                                        tmp_path, monkeypatch):
    """A run cut after its checkpoints resumes through torch.load(weights_only=True) with
    linvit's allow-list (what the allow-list lets through, and what not: the tests below)."""
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


class RealNamesPickler(pickle.Pickler):
    """Writes every global under its Python 3 name: protocol 2, which torch.save uses, otherwise
    renames subprocess.* to Python 2's commands.*, which the weights-only unpickler would refuse
    as unknown without ever consulting the allow-list."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "fix_imports": False})


REAL_NAMES = types.SimpleNamespace(__name__="pickle", Pickler=RealNamesPickler)


def write_mmengine_checkpoint(path, by_mmengine: bool = True, **extra) -> dict:
    """A checkpoint as mmengine's Runner writes one: weights, meta with numpy scalars and arrays,
    and the message hub's state (HistoryBuffers of logged scalars), saved by mmengine itself
    (or, by_mmengine=False, by torch.save with RealNamesPickler)."""
    from mmengine.logging import MessageHub
    from mmengine.runner.checkpoint import save_checkpoint

    from linvit.dense.safe_load import NUMPY_DTYPES

    hub = MessageHub(f"linvit-test-{path.stem}")
    for loss in (0.75, 0.5, 0.25):
        hub.update_scalar("train/loss", loss)
    hub.update_scalar("train/lr", np.float32(1e-3))
    hub.update_info("iter", 3)
    arrays = {np.dtype(t).name: np.arange(6).reshape(2, 3).astype(t) for t in NUMPY_DTYPES}
    scalars = {np.dtype(t).name: np.dtype(t).type(1) for t in NUMPY_DTYPES}
    checkpoint = {"meta": {"iter": 3, "seed": np.int64(3), "arrays": arrays, "scalars": scalars},
                  "state_dict": {"backbone.w": torch.arange(6.0).reshape(2, 3)},
                  "message_hub": hub.state_dict(), **extra}
    if by_mmengine:
        save_checkpoint(checkpoint, str(path))
    else:
        torch.save(checkpoint, path, pickle_module=REAL_NAMES)
    return checkpoint


def load_like_mmengine(path):
    """How a resuming Runner reads its checkpoint: torch.load with torch's default
    (weights_only)."""
    from mmengine.runner.checkpoint import _load_checkpoint

    return _load_checkpoint(str(path), map_location="cpu")


def test_mmengine_checkpoints_load_inside_the_allow_list_only(tmp_path):
    from mmengine.logging import HistoryBuffer

    from linvit.dense.safe_load import mmengine_checkpoints_allowed

    path = tmp_path / "iter_3.pth"
    saved = write_mmengine_checkpoint(path)
    with pytest.raises(pickle.UnpicklingError):           # torch's default refuses it ...
        load_like_mmengine(path)
    with mmengine_checkpoints_allowed():                  # ... linvit's allow-list admits it
        loaded = load_like_mmengine(path)
    assert torch.equal(loaded["state_dict"]["backbone.w"], saved["state_dict"]["backbone.w"])
    loss = loaded["message_hub"]["log_scalars"]["train/loss"]
    assert isinstance(loss, HistoryBuffer)
    np.testing.assert_array_equal(loss.data[0], [0.75, 0.5, 0.25])
    assert loss.current() == 0.25 and loss.mean() == 0.5
    assert loaded["message_hub"]["log_scalars"]["train/lr"].current() == np.float32(1e-3)
    assert loaded["message_hub"]["runtime_info"]["iter"] == 3
    meta = loaded["meta"]
    assert meta["seed"] == 3 and type(meta["seed"]) is np.int64
    assert set(meta["arrays"]) == set(saved["meta"]["arrays"]) and len(meta["arrays"]) == 9
    for name, array in saved["meta"]["arrays"].items():
        assert meta["arrays"][name].dtype == array.dtype, name
        np.testing.assert_array_equal(meta["arrays"][name], array)
        assert type(meta["scalars"][name]) is type(saved["meta"]["scalars"][name]) and \
            meta["scalars"][name] == 1, name
    with pytest.raises(pickle.UnpicklingError):           # and only inside it
        load_like_mmengine(path)


class RunsCode:
    """Unpickling this calls `fn(arg)`: what a malicious checkpoint does."""

    def __init__(self, fn, arg):
        self.fn, self.arg = fn, arg

    def __reduce__(self):
        return (self.fn, (self.arg,))


def refusal(load) -> str | None:
    """The message of the UnpicklingError that `load()` raises; None if it loads."""
    try:
        load()
    except pickle.UnpicklingError as e:
        return str(e)
    return None


@pytest.mark.parametrize("fn", ["os.system", "subprocess.call", "builtins.eval",
                                "builtins.exec"])
def test_pickled_code_is_refused_inside_the_allow_list(tmp_path, fn):
    """A checkpoint with mmengine's content plus one object whose unpickling runs code: inside
    the allow-list it is still refused, naming the culprit, and the code never runs."""
    import builtins
    import os
    import re
    import subprocess

    from linvit.dense.safe_load import mmengine_checkpoints_allowed

    marker = tmp_path / "pickled-code-ran"
    write = f"open({str(marker)!r}, 'w').close()"
    payload = {"os.system": RunsCode(os.system, f"touch {marker}"),
               "subprocess.call": RunsCode(subprocess.call, ["touch", str(marker)]),
               "builtins.eval": RunsCode(builtins.eval, write),
               "builtins.exec": RunsCode(builtins.exec, write)}[fn]
    culprit = rf"\b{payload.fn.__name__}\b"
    path = tmp_path / "iter_3.pth"
    write_mmengine_checkpoint(path, by_mmengine=False, evil=payload)
    with mmengine_checkpoints_allowed():
        refusals = [refusal(lambda: load_like_mmengine(path)),
                    refusal(lambda: torch.load(path, weights_only=True))]
    assert not marker.exists(), f"unpickling ran {fn}"
    assert all(r is not None for r in refusals), f"{fn}: the checkpoint loaded"
    assert all(re.search(culprit, r) for r in refusals), refusals
    # the control: an unrestricted load does run the payload, so the marker would have shown it
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_dense_gaps_pair_each_strategy_with_the_random_student_seed_by_seed(tmp_path):
    """The gain table subtracts the random-init student of the same operator and seed, from each
    strategy and from the teacher of the same dataset (its heads' seeds), shows each seed's
    gain, and leaves out seeds where either job failed."""
    import pandas as pd

    from linvit.dense.tasks import TASKS
    from linvit.report.dense import GAP_CAPTION, dense_gaps, write_dense
    from linvit.report.grid import Grid

    columns = [(name, metric) for name, task in TASKS.items() for metric in task.headline]
    rows = []
    for task, metric in (("segment", "mIoU"), ("detect", "box_AP")):
        for seed, value in enumerate([40.0, 41.0, 40.0]):
            rows.append(dict(task=task, operator="softmax", init="teacher", seed=seed,
                             **{metric: value}))
        rows.append(dict(task=task, operator="softmax", init="teacher", seed=0, **{metric: 0.0},
                         dataset="other"))
        for seed, (rand, cmd) in enumerate([(10.0, 13.0), (12.0, 13.0), (11.0, 99.0)]):
            for init, value in (("random", rand), ("copy_mlp+distill", cmd)):
                rows.append(dict(task=task, operator="linear", init=init, seed=seed,
                                 **{metric: value}))
    results = pd.DataFrame(rows).assign(kind="dense", teacher="pretrain", size="cpu96",
                                        status="ok", mask_AP=None, aAcc=None)
    results["dataset"] = results["dataset"].fillna("fashion_mnist")
    results.loc[(results["seed"] == 2) & (results["init"] == "random"), "status"] = "failed"
    orders = {"init": ["random", "copy_mlp+distill"], "operator": ["linear"]}
    grid = Grid([], "out", orders, [], [], [list(c) for c in columns])
    gaps = dense_gaps(results, grid, columns)
    assert list(gaps.index) == [("fashion_mnist", "pretrain", "cpu96", "linear", gain)
                                for gain in ("copy_mlp+distill - random",
                                             "softmax teacher - random")]
    # gains +3 and +1: mean +2, 95% CI 12.706 * sd(1.414) / sqrt(2) = 12.71
    assert gaps.iloc[0]["mIoU"] == "+2.00 ± 12.71 (seed 0: +3.00, seed 1: +1.00)"
    assert gaps.iloc[0]["box AP"] == gaps.iloc[0]["mIoU"]
    assert gaps.iloc[0]["mask AP"] == "missing"
    # the teacher (40, 41) against random (10, 12): +30, +29; not the other dataset's teacher
    assert gaps.iloc[1]["mIoU"] == "+29.50 ± 6.35 (seed 0: +30.00, seed 1: +29.00)"
    write_dense(results, grid, tmp_path / "tables", tmp_path / "figures", tmp_path / "dense.md")
    assert "seed 1: +1.00" in (tmp_path / "dense.md").read_text()
    assert (tmp_path / "tables" / "dense_gaps.csv").is_file()
    # no random-init student: an empty table, and no section
    alone = results[results["init"] != "random"]
    assert dense_gaps(alone, grid, columns).empty
    write_dense(alone, grid, tmp_path / "t2", tmp_path / "f2", tmp_path / "d2.md")
    assert GAP_CAPTION not in (tmp_path / "d2.md").read_text()
    assert (tmp_path / "t2" / "dense_gaps.md").is_file()


@pytest.mark.parametrize("name", sorted(__import__("linvit.runs.loggers",
                                                   fromlist=["LOGGERS"]).LOGGERS))
def test_every_logger_has_an_mmengine_backend_writing_into_its_own_folder(name, tmp_path):
    """The dense stages' live curves: each run.loggers name maps to one of mmengine's visualizer
    backends, whose save_dir is the folder the training stages' logger of that name uses."""
    import mmengine.visualization  # noqa: F401 (registers its backends)
    from mmengine.registry import VISBACKENDS

    from linvit.dense.configs import vis_backends
    from linvit.runs.loggers import LOGGERS

    (backend,) = vis_backends([name], tmp_path)
    assert backend["save_dir"] == str(tmp_path / LOGGERS[name].folder)
    assert VISBACKENDS.get(backend["type"]) is not None


@pytest.mark.slow
def test_a_dense_run_writes_its_loss_lr_and_metrics_as_tensorboard_events(scenes, backbone_ckpt,
                                                                          tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from linvit.dense.stages import run_dense

    cfg = dense_cfg("segment", scenes, backbone_ckpt, tmp_path, "optim.iters=4",
                    "run.loggers=[tensorboard]")
    metrics = run_dense("segment", cfg, tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "lr"} <= tags, tags
    scored = [e.value for e in events.Scalars("mIoU")]          # as mmengine's logger hook
    assert scored and scored == pytest.approx([metrics["raw"]["mIoU"]] * len(scored), abs=1e-4)
    assert [e.step for e in events.Scalars("loss")] == list(range(1, 5))
