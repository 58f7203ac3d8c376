"""Dense tasks on linvit backbones: embedded scenes, UperNet (mmseg) and Mask R-CNN (mmdet).
Only backbone.py, configs.py and stages.py import OpenMMLab, and only when they run."""
