"""Real dense datasets by config: tiny ADE20K and COCO folders in their standard layouts (written
here: a few images, label maps and instance JSON), read by mmseg's and mmdet's own datasets, and
one training step and evaluation of UperNet and Mask R-CNN on each."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from test_dense import dense_cfg

# COCO's 80 category ids: 1..90 without the ten the 2014 paper dropped
COCO_IDS = [i for i in range(1, 91) if i not in {12, 26, 29, 30, 45, 66, 68, 69, 71, 83}]
W, H = 80, 48          # not the models' 64 x 64: evaluation must map predictions back


def scene(seed: int) -> tuple[np.ndarray, list[tuple[int, tuple[int, int, int, int]]]]:
    """An image with two coloured boxes on grey; the boxes as (class index, (x, y, w, h))."""
    rng = np.random.default_rng(seed)
    image = np.full((H, W, 3), 128, np.uint8)
    boxes = []
    for k in range(2):
        w, h = (int(v) for v in rng.integers(12, 20, 2))
        x, y = int(rng.integers(0, W - 20)), int(rng.integers(0, H - 20))
        cls = int(rng.integers(0, 5)) + 5 * k
        image[y:y + h, x:x + w] = (40 * (cls % 6), 255 - 25 * cls, 60 + 15 * cls)
        boxes.append((cls, (x, y, w, h)))
    return image, boxes


ADE20K_SPLITS = {"training": 4, "validation": 2}
COCO_SPLITS = {"train2017": 4, "val2017": 2}


def ade20k_folder(root):
    """ADEChallengeData2016's layout: images/<split>/*.jpg and annotations/<split>/*.png with
    0 = unlabelled and 1..150 the classes."""
    for split, n in ADE20K_SPLITS.items():
        (root / "images" / split).mkdir(parents=True)
        (root / "annotations" / split).mkdir(parents=True)
        for i in range(n):
            image, boxes = scene(i + 100 * (split == "validation"))
            label = np.zeros((H, W), np.uint8)
            label[H // 2:] = 150                     # stuff, the last class
            for cls, (x, y, w, h) in boxes:
                label[y:y + h, x:x + w] = cls + 1
            name = f"ADE_{'train' if split == 'training' else 'val'}_{i + 1:08d}"
            Image.fromarray(image).save(root / "images" / split / f"{name}.jpg", quality=95)
            Image.fromarray(label).save(root / "annotations" / split / f"{name}.png")
    return root


def coco_folder(root):
    """COCO 2017's layout: <split>/*.jpg and annotations/instances_<split>.json, with COCO's
    category ids and mmdet's class names."""
    from mmdet.datasets import CocoDataset

    categories = [{"id": i, "name": n, "supercategory": "thing"}
                  for i, n in zip(COCO_IDS, CocoDataset.METAINFO["classes"], strict=True)]
    (root / "annotations").mkdir(parents=True)
    for split, n in COCO_SPLITS.items():
        (root / split).mkdir()
        images, annotations = [], []
        for i in range(n):
            image, boxes = scene(i + 100 * (split == "val2017"))
            image_id = 1000 * (split == "val2017") + i + 1
            name = f"{image_id:012d}.jpg"
            Image.fromarray(image).save(root / split / name, quality=95)
            images.append({"id": image_id, "file_name": name, "width": W, "height": H})
            for cls, (x, y, w, h) in boxes:
                annotations.append({
                    "id": len(annotations) + 1 + 1000 * image_id, "image_id": image_id,
                    # the last ids, so that a label map that ignored the gaps would be caught
                    "category_id": COCO_IDS[-1 - cls], "bbox": [x, y, w, h], "area": w * h,
                    "iscrowd": 0,
                    "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]]})
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": categories}))
    return root


@pytest.fixture(scope="module")
def ade20k(tmp_path_factory):
    return ade20k_folder(tmp_path_factory.mktemp("ADEChallengeData2016"))


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return coco_folder(tmp_path_factory.mktemp("coco"))


def train_dataset(task: str, root, ckpt, tmp_path):
    """The training dataset the task's mmengine config names, built by mmseg / mmdet."""
    import importlib

    from mmengine.registry import init_default_scope

    from linvit.dense.configs import detection_config, segmentation_config

    scope = "mmseg" if task == "segment" else "mmdet"
    importlib.import_module(f"{scope}.utils").register_all_modules(init_default_scope=False)
    init_default_scope(scope)
    kind = "ade20k" if task == "segment" else "coco"
    cfg = dense_cfg(task, root, ckpt, tmp_path, f"data.kind={kind}")
    make = segmentation_config if task == "segment" else detection_config
    config = make(cfg, 96, [0.0] * 3, [1.0] * 3, str(tmp_path))
    registry = importlib.import_module(f"{scope}.registry").DATASETS
    return registry.build(config["train_dataloader"]["dataset"]), config


def test_ade20k_folder_is_read_with_its_150_classes_and_zero_ignored(ade20k, backbone_ckpt,
                                                                       tmp_path):
    dataset, config = train_dataset("segment", ade20k, backbone_ckpt, tmp_path)
    assert len(dataset) == 4
    assert config["model"]["decode_head"]["num_classes"] == 150
    sample = dataset[0]["data_samples"]
    labels = set(np.unique(sample.gt_sem_seg.data.numpy()).tolist())
    expected = {cls for cls, _ in scene(0)[1]} | {149}   # 1..150 -> 0..149
    assert expected <= labels <= expected | {255}        # 0 (unlabelled) -> ignore


def test_coco_folder_is_read_with_coco_s_category_ids(coco, backbone_ckpt, tmp_path):
    dataset, config = train_dataset("detect", coco, backbone_ckpt, tmp_path)
    assert len(dataset) == 4
    assert config["model"]["roi_head"]["bbox_head"]["num_classes"] == 80
    instances = dataset.get_data_info(0)["instances"]
    assert sorted(i["bbox_label"] for i in instances) == sorted(
        79 - cls for cls, _ in scene(0)[1])                # COCO id 90 is label 79, and so on
    assert instances[0]["bbox"][2] > instances[0]["bbox"][0]   # x1 y1 x2 y2


@pytest.mark.slow
@pytest.mark.parametrize("task, kind, keys", [("segment", "ade20k", {"mIoU", "aAcc"}),
                                               ("detect", "coco", {"box_AP", "mask_AP"})])
def test_one_step_and_evaluation_on_a_real_layout(task, kind, keys, ade20k, coco, backbone_ckpt,
                                                  tmp_path):
    from linvit.dense.stages import run_dense

    root = ade20k if kind == "ade20k" else coco
    cfg = dense_cfg(task, root, backbone_ckpt, tmp_path, f"data.kind={kind}")
    metrics = run_dense(task, cfg, tmp_path / task)
    assert keys <= set(metrics) and all(np.isfinite(metrics[k]) for k in keys)
    assert metrics["iters"] == 2


@pytest.mark.parametrize("task, kind, missing", [
    ("segment", "ade20k", "annotations/validation"),
    ("detect", "coco", "annotations/instances_val2017.json")])
def test_a_folder_not_in_the_standard_layout_is_refused_before_any_compute(
        task, kind, missing, ade20k, coco, backbone_ckpt, tmp_path, monkeypatch):
    import shutil

    from linvit.dense import stages
    from linvit.errors import ConfigError

    monkeypatch.setattr(stages, "train_and_validate", lambda *a: pytest.fail("computed"))
    root = shutil.copytree(ade20k if kind == "ade20k" else coco, tmp_path / kind)
    target = root / missing
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    cfg = dense_cfg(task, root, backbone_ckpt, tmp_path, f"data.kind={kind}")
    with pytest.raises(ConfigError, match=f"not a {kind} folder .*missing {missing}"):
        stages.run_dense(task, cfg, tmp_path / "run")
    cfg = dense_cfg(task, tmp_path / "nowhere", backbone_ckpt, tmp_path, f"data.kind={kind}")
    with pytest.raises(ConfigError, match="folder not found"):
        stages.run_dense(task, cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task, kind, path, damage, message", [
    ("segment", "ade20k", "images/training", "file", "must be a folder"),
    ("segment", "ade20k", "annotations/training", "empty", "holds no image"),
    ("detect", "coco", "val2017", "empty", "holds no image"),
    ("detect", "coco", "annotations/instances_train2017.json", "folder", "must be a file"),
    ("segment", "ade20k", "annotations/validation", "bad image", "bad.png: not a readable image"),
    ("detect", "coco", "val2017", "bad image", "bad.jpg: not a readable image")])
def test_a_layout_with_a_file_for_a_folder_or_no_images_is_refused_before_any_write(
        task, kind, path, damage, message, ade20k, coco, backbone_ckpt, tmp_path, monkeypatch):
    import shutil

    from linvit.dense import stages
    from linvit.errors import ConfigError, DataError

    monkeypatch.setattr(stages, "train_and_validate", lambda *a: pytest.fail("computed"))
    root = shutil.copytree(ade20k if kind == "ade20k" else coco, tmp_path / kind)
    target = root / path
    if damage != "bad image":
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    {"file": target.write_text, "folder": lambda _: target.mkdir(),
     "empty": lambda _: target.mkdir(),
     "bad image": lambda text: (target / message.split(":")[0]).write_text(text)}[damage]("x")
    cfg = dense_cfg(task, root, backbone_ckpt, tmp_path, f"data.kind={kind}")
    with pytest.raises((ConfigError, DataError), match=message):
        stages.run_dense(task, cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
