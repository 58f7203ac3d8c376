"""ViT models: sizes, specs, the timm model and checkpoints. The names that need timm (the model
and checkpoint code) load on first use, so `from linvit.models import SIZES, ModelSpec` (configs,
the workflow's checks) stays cheap."""
from importlib import import_module

from linvit.models.sizes import SIZES, ModelSize, get_size
from linvit.models.spec import ModelSpec

_LAZY = {**dict.fromkeys(("load_model", "load_strict", "read_spec", "save_model"),
                         "linvit.models.checkpoint"),
         "read_state_dict": "linvit.models.tensor_files",
         **dict.fromkeys(("LinvitViT", "attention_modules", "create_vit", "set_token_layout"),
                         "linvit.models.vit")}

__all__ = ["ModelSize", "ModelSpec", "SIZES", "get_size", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'linvit.models' has no attribute {name!r}")
