"""UperNet semantic segmentation (mmseg): LinViTBackbone + UPerHead + FCN auxiliary head."""
from linvit.dense.tasks.base import DenseTask

SEGMENT = DenseTask(
    "segment", "UperNet", real_kind="ade20k",
    build="linvit.dense.configs:segmentation_config",
    metrics={"mIoU": "mIoU", "aAcc": "aAcc", "mAcc": "mAcc"},
    headline=("mIoU", "aAcc"))
