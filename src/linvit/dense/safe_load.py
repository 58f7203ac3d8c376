"""Loading mmengine's own checkpoints without letting pickles run code.

mmengine 0.10.7 reads checkpoints with torch.load's default, which in torch >= 2.6 is
weights_only=True: only tensors, containers and allow-listed classes load. Its checkpoints also
hold the message hub's HistoryBuffer objects and numpy arrays/scalars, so resuming fails. The
blanket fix (TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1) would let any pickle execute code; instead the few
classes mmengine writes are allow-listed here, only while a dense run's Runner works, and
anything else still fails to load.

`getattr` is among them because numpy 2 pickles some dtypes as getattr(numpy.dtypes, name). The
weights-only unpickler still *calls* nothing that is not allow-listed, so getattr can only read an
attribute of an object that was itself allowed.
"""
from __future__ import annotations

import numpy as np
import torch

NUMPY_DTYPES = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                np.uint8, np.bool_)


def mmengine_safe_globals() -> list:
    from mmengine.logging.history_buffer import HistoryBuffer

    core = np._core if hasattr(np, "_core") else np.core
    return [HistoryBuffer, core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray,
            np.dtype, getattr, *(type(np.dtype(t)) for t in NUMPY_DTYPES)]


def mmengine_checkpoints_allowed():
    """Context manager: torch.load(weights_only=True) accepts mmengine's checkpoints inside."""
    return torch.serialization.safe_globals(mmengine_safe_globals())
