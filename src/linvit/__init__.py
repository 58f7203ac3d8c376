"""linvit: turn pretrained softmax ViTs into linear-attention ViTs (copy the MLPs, distill the
attention)."""
from importlib.metadata import PackageNotFoundError, version

from linvit.timm_hook import register_when_timm_loads

try:
    __version__ = version("linvit")
except PackageNotFoundError:          # run from a source tree that was never installed
    __version__ = "0+unknown"

register_when_timm_loads()

