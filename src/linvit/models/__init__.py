from linvit.models.checkpoint import (
                                      CheckpointError,
                                      load_model,
                                      load_strict,
                                      read_spec,
                                      read_state_dict,
                                      save_model,
)
from linvit.models.sizes import SIZES, ModelSize, get_size
from linvit.models.vit import LinvitViT, ModelSpec, attention_modules, create_vit, set_token_layout

__all__ = ["CheckpointError", "LinvitViT", "ModelSize", "ModelSpec", "SIZES", "attention_modules",
           "create_vit", "get_size", "load_model", "load_strict", "read_spec", "read_state_dict",
           "save_model", "set_token_layout"]
