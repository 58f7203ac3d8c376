"""mmengine configs for the two dense tasks, built from a linvit DenseConfig.

    segment   mmseg EncoderDecoder: LinViTBackbone + UPerHead + FCN auxiliary head, IoUMetric
    detect    mmdet MaskRCNN: LinViTBackbone + FPN + RPN + RoI heads with masks, CocoMetric

Data: the embedded scenes (linvit.dense.scenes) or, with data.kind=ade20k / coco, real ADE20K
and COCO folders in their standard layouts. Sizes of heads are small on purpose for CPU runs
(`head_channels`); the structure is the standard one.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

NORM = dict(type="GN", num_groups=8, requires_grad=True)
# the standard layouts of real folders (ADEChallengeData2016, COCO 2017)
ADE20K_SPLITS = {"train": "training", "val": "validation"}
COCO_ANNOTATIONS = {"train": "annotations/instances_train2017.json",
                    "val": "annotations/instances_val2017.json"}
COCO_IMAGES = {"train": "train2017/", "val": "val2017/"}


def required_paths(kind: str) -> dict[str, str]:
    """What a real folder of `kind` must hold, path -> "images" (a folder with at least one
    image) or "file" (the embedded scenes check themselves)."""
    if kind == "ade20k":
        return {f"{d}/{s}": "images" for d in ("images", "annotations")
                for s in ADE20K_SPLITS.values()}
    if kind == "coco":
        return {**{p.rstrip("/"): "images" for p in COCO_IMAGES.values()},
                **{p: "file" for p in COCO_ANNOTATIONS.values()}}
    return {}


def scene_classes(root: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(label-map classes, thing classes) of a scenes folder, as its MANIFEST.json records them:
    the ground's classes depend on how the scenes were made (linvit.dense.scenes.SceneSpec)."""
    from linvit.io import read_json

    manifest = read_json(Path(root) / "MANIFEST.json")
    return tuple(manifest["classes"]), tuple(manifest["things"])


def vis_backends(loggers: list[str], run_dir: Path) -> list[dict]:
    """mmengine's visualizer backends for `run.loggers` (linvit.runs.loggers' names), writing
    where the training stages' loggers do: tensorboard/, wandb/ (offline unless WANDB_MODE says
    otherwise), mlruns/ (a file store unless MLFLOW_TRACKING_URI names a server), in the run
    folder. mmengine's LoggerHook sends them the training loss and learning rate every logging
    interval, and the validation metrics."""
    import os

    from linvit.runs.loggers import tracking_uri

    name = run_dir.resolve().name
    made = {
        "tensorboard": lambda: dict(type="TensorboardVisBackend",
                                    save_dir=str(run_dir / "tensorboard")),
        "wandb": lambda: dict(type="WandbVisBackend", save_dir=str(run_dir / "wandb"),
                              init_kwargs=dict(mode=os.environ.get("WANDB_MODE", "offline"),
                                               dir=str(run_dir), name=name)),
        "mlflow": lambda: dict(type="MLflowVisBackend", save_dir=str(run_dir / "mlruns"),
                               exp_name=os.environ.get("MLFLOW_EXPERIMENT_NAME", "linvit"),
                               run_name=name, tracking_uri=tracking_uri(run_dir / "mlruns")),
    }
    return [made[n]() for n in loggers]


def _common(cfg, work_dir: str, scope: str, evaluator: dict) -> dict:
    it = cfg.optim.iters
    return dict(
        default_scope=scope,
        work_dir=work_dir,
        randomness=dict(seed=cfg.run.seed, deterministic=False),
        env_cfg=dict(cudnn_benchmark=False, dist_cfg=dict(backend="nccl"),
                     mp_cfg=dict(mp_start_method="fork", opencv_num_threads=0)),
        train_cfg=dict(type="IterBasedTrainLoop", max_iters=it, val_interval=it + 1),
        val_cfg=dict(type="ValLoop"),
        test_cfg=dict(type="TestLoop"),
        val_evaluator=evaluator,
        test_evaluator=evaluator,
        optim_wrapper=dict(type="OptimWrapper", clip_grad=dict(max_norm=1.0),
                           optimizer=dict(type="AdamW", lr=cfg.optim.lr,
                                          weight_decay=cfg.optim.weight_decay),
                           # no decay on norms, biases, embeddings and the adapter's gates
                           paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                                              custom_keys={k: dict(decay_mult=0.0) for k in (
                                                  "pos_embed", "cls_token", "level_embed",
                                                  "gamma")})),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0,
                 end=max(1, it // 10)),
            dict(type="CosineAnnealingLR", by_epoch=False, begin=max(1, it // 10), end=it,
                 eta_min=cfg.optim.lr * 0.01)],
        default_hooks=dict(
            timer=dict(type="IterTimerHook"),
            logger=dict(type="LoggerHook", interval=max(1, it // 10), log_metric_by_epoch=False),
            param_scheduler=dict(type="ParamSchedulerHook"),
            checkpoint=dict(type="CheckpointHook", by_epoch=False,
                            interval=cfg.optim.checkpoint_every, max_keep_ckpts=1),
            sampler_seed=dict(type="DistSamplerSeedHook")),
        log_processor=dict(by_epoch=False),
        # the run folder holds work/ (mmengine's) and the live curves beside it
        visualizer=dict(type="Visualizer", vis_backends=[
            dict(type="LocalVisBackend"),
            *vis_backends(cfg.run.loggers, Path(work_dir).parent)]),
        log_level="INFO",
        load_from=None,
        resume=True,
    )


def _loader(dataset: dict, batch: int, train: bool, workers: int) -> dict:
    return dict(batch_size=batch, num_workers=workers, persistent_workers=workers > 0,
                sampler=dict(type="InfiniteSampler" if train else "DefaultSampler",
                             shuffle=train),
                dataset=dataset)


def _backbone(cfg) -> dict:
    neck = cfg.model.neck
    return dict(type="LinViTBackbone", checkpoint=cfg.checkpoint, img_size=cfg.data.img_size,
                in_chans=3, neck=neck, frozen_vit=cfg.model.frozen_vit,
                adapter=dataclasses.asdict(cfg.model.adapter) if neck == "adapter" else None)


def segmentation_config(cfg, width: int, mean, std, work_dir: str) -> dict:
    d, c = cfg.data, cfg.model.head_channels
    if d.kind == "scenes":
        classes, ds_type = scene_classes(d.root)[0], "BaseSegDataset"
        extra = dict(metainfo=dict(classes=classes))
    else:                                             # real ADE20K (150 classes, 0 = ignore)
        classes, ds_type, extra = [None] * 150, "ADE20KDataset", dict(reduce_zero_label=True)
    # ADE20K's 0 (unlabelled) -> ignore: the dataset's reduce_zero_label, which the loader reads.
    # Evaluation scores the label map at its own size (annotations loaded after the resize, as
    # mmseg's configs): predictions are resized back to the image's original shape.
    load, annotations = dict(type="LoadImageFromFile"), dict(type="LoadAnnotations")
    resize = dict(type="Resize", scale=(d.img_size, d.img_size), keep_ratio=False)
    train_pipe = [load, annotations, resize, dict(type="RandomFlip", prob=0.5),
                  dict(type="PackSegInputs")]
    test_pipe = [load, resize, annotations, dict(type="PackSegInputs")]

    def dataset(split: str, pipe):
        return dict(type=ds_type, data_root=d.root, pipeline=pipe, img_suffix=".png"
                    if d.kind == "scenes" else ".jpg", seg_map_suffix=".png",
                    data_prefix=dict(img_path=f"images/{split}",
                                     seg_map_path=f"annotations/{split}"),
                    **extra)

    model = dict(
        type="EncoderDecoder",
        data_preprocessor=dict(type="SegDataPreProcessor", mean=mean, std=std, bgr_to_rgb=True,
                               pad_val=0, seg_pad_val=255, size=(d.img_size, d.img_size)),
        backbone=_backbone(cfg),
        decode_head=dict(type="UPerHead", in_channels=[width] * 4, in_index=[0, 1, 2, 3],
                         pool_scales=(1, 2, 3, 6), channels=c, dropout_ratio=0.1,
                         num_classes=len(classes), norm_cfg=NORM, align_corners=False,
                         loss_decode=dict(type="CrossEntropyLoss", loss_weight=1.0)),
        auxiliary_head=dict(type="FCNHead", in_channels=width, in_index=2, channels=c // 2,
                            num_convs=1, concat_input=False, dropout_ratio=0.1,
                            num_classes=len(classes), norm_cfg=NORM, align_corners=False,
                            loss_decode=dict(type="CrossEntropyLoss", loss_weight=0.4)),
        train_cfg=dict(), test_cfg=dict(mode="whole"))
    split = ADE20K_SPLITS
    return dict(model=model,
                train_dataloader=_loader(dataset(split["train"], train_pipe), d.batch_size, True,
                                         d.workers),
                val_dataloader=_loader(dataset(split["val"], test_pipe), 1, False, d.workers),
                test_dataloader=_loader(dataset(split["val"], test_pipe), 1, False, d.workers),
                **_common(cfg, work_dir, "mmseg",
                          dict(type="IoUMetric", iou_metrics=["mIoU"])))


def _rcnn_train_cfg() -> dict:
    def assigner(pos, neg, min_pos):
        return dict(type="MaxIoUAssigner", pos_iou_thr=pos, neg_iou_thr=neg, min_pos_iou=min_pos,
                    match_low_quality=True, ignore_iof_thr=-1)

    return dict(
        rpn=dict(assigner=assigner(0.7, 0.3, 0.3), allowed_border=-1, pos_weight=-1, debug=False,
                 sampler=dict(type="RandomSampler", num=256, pos_fraction=0.5, neg_pos_ub=-1,
                              add_gt_as_proposals=False)),
        rpn_proposal=dict(nms_pre=1000, max_per_img=500, nms=dict(type="nms", iou_threshold=0.7),
                          min_bbox_size=0),
        rcnn=dict(assigner=assigner(0.5, 0.5, 0.5), mask_size=28, pos_weight=-1, debug=False,
                  sampler=dict(type="RandomSampler", num=128, pos_fraction=0.25, neg_pos_ub=-1,
                               add_gt_as_proposals=True)))


def detection_config(cfg, width: int, mean, std, work_dir: str) -> dict:
    d, c = cfg.data, cfg.model.head_channels
    classes = scene_classes(d.root)[1] if d.kind == "scenes" else None
    ann = {"train": "coco/instances_train.json", "val": "coco/instances_val.json"} \
        if d.kind == "scenes" else COCO_ANNOTATIONS
    prefix = {"train": "", "val": ""} if d.kind == "scenes" else COCO_IMAGES
    size = (d.img_size, d.img_size)
    load = [dict(type="LoadImageFromFile"),
            dict(type="LoadAnnotations", with_bbox=True, with_mask=True),
            dict(type="Resize", scale=size, keep_ratio=False)]
    train_pipe = load + [dict(type="RandomFlip", prob=0.5), dict(type="PackDetInputs")]
    test_pipe = load + [dict(type="PackDetInputs", meta_keys=(
        "img_id", "img_path", "ori_shape", "img_shape", "scale_factor"))]

    def dataset(split: str, pipe):
        extra = dict(metainfo=dict(classes=classes)) if classes else {}
        return dict(type="CocoDataset", data_root=d.root, ann_file=ann[split],
                    data_prefix=dict(img=prefix[split]), pipeline=pipe, test_mode=split == "val",
                    filter_cfg=dict(filter_empty_gt=split == "train", min_size=0), **extra)

    n = len(classes) if classes else 80
    roi = dict(type="SingleRoIExtractor", out_channels=c, featmap_strides=[4, 8, 16, 32])
    model = dict(
        type="MaskRCNN",
        data_preprocessor=dict(type="DetDataPreprocessor", mean=mean, std=std, bgr_to_rgb=True,
                               pad_mask=True, pad_size_divisor=32),
        backbone=_backbone(cfg),
        neck=dict(type="FPN", in_channels=[width] * 4, out_channels=c, num_outs=5),
        rpn_head=dict(
            type="RPNHead", in_channels=c, feat_channels=c,
            anchor_generator=dict(type="AnchorGenerator", scales=[4], ratios=[0.5, 1.0, 2.0],
                                  strides=[4, 8, 16, 32, 64]),
            bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4,
                            target_stds=[1.0] * 4),
            loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=True, loss_weight=1.0),
            loss_bbox=dict(type="L1Loss", loss_weight=1.0)),
        roi_head=dict(
            type="StandardRoIHead",
            bbox_roi_extractor={**roi, "roi_layer": dict(type="RoIAlign", output_size=7,
                                                          sampling_ratio=0)},
            bbox_head=dict(type="Shared2FCBBoxHead", in_channels=c, fc_out_channels=4 * c,
                           roi_feat_size=7, num_classes=n,
                           bbox_coder=dict(type="DeltaXYWHBBoxCoder", target_means=[0.0] * 4,
                                           target_stds=[0.1, 0.1, 0.2, 0.2]),
                           reg_class_agnostic=False,
                           loss_cls=dict(type="CrossEntropyLoss", loss_weight=1.0),
                           loss_bbox=dict(type="L1Loss", loss_weight=1.0)),
            mask_roi_extractor={**roi, "roi_layer": dict(type="RoIAlign", output_size=14,
                                                          sampling_ratio=0)},
            mask_head=dict(type="FCNMaskHead", num_convs=2, in_channels=c, conv_out_channels=c,
                           num_classes=n,
                           loss_mask=dict(type="CrossEntropyLoss", use_mask=True,
                                          loss_weight=1.0))),
        train_cfg=_rcnn_train_cfg(),
        test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=300, nms=dict(type="nms",
                                                                      iou_threshold=0.7),
                               min_bbox_size=0),
                      rcnn=dict(score_thr=0.05, nms=dict(type="nms", iou_threshold=0.5),
                                max_per_img=50, mask_thr_binary=0.5)))
    evaluator = dict(type="CocoMetric", ann_file=str(Path(d.root) / ann["val"]),
                     metric=["bbox", "segm"], format_only=False)
    return dict(model=model,
                train_dataloader=_loader(dataset("train", train_pipe), d.batch_size, True,
                                         d.workers),
                val_dataloader=_loader(dataset("val", test_pipe), 1, False, d.workers),
                test_dataloader=_loader(dataset("val", test_pipe), 1, False, d.workers),
                **_common(cfg, work_dir, "mmdet", evaluator))
