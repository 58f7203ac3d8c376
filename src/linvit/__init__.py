"""linvit: turn pretrained softmax ViTs into linear-attention ViTs (copy the MLPs, distill the
attention)."""
__version__ = "0.1.0"
