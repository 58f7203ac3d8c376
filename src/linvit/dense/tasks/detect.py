"""Mask R-CNN instance segmentation (mmdet): LinViTBackbone + FPN + RPN + RoI heads with masks.
mmdet's CocoMetric returns nothing when no box scores above test_cfg's threshold (an untrained
head over 80 classes): every AP is 0 then, by definition."""
from linvit.dense.tasks.base import DenseTask

DETECT = DenseTask(
    "detect", "Mask R-CNN", real_kind="coco",
    build="linvit.dense.configs:detection_config",
    metrics={"coco/bbox_mAP": "box_AP", "coco/bbox_mAP_50": "box_AP50",
             "coco/segm_mAP": "mask_AP", "coco/segm_mAP_50": "mask_AP50"},
    headline=("box_AP", "mask_AP"), percent=True, empty_means_zero=True)
