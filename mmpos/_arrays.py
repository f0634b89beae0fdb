"""Host copies of tensors for the NumPy bookkeeping of the packer and the token-id front ends, and the ids they
return in the dtype of ``input_ids``."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def host(t: Tensor | np.ndarray) -> np.ndarray:
    """A C-contiguous NumPy array of ``t`` on the host: a view of a contiguous CPU tensor or array (no copy), else
    one copy or transfer. Callers flatten it (``reshape(-1)``, a view only of a C-contiguous array) and write into
    the flat view, so a transposed or sliced ``input_ids`` must not reach them as a strided view. bfloat16, which
    NumPy lacks, comes back as float32 (exactly)."""
    if isinstance(t, Tensor) and t.dtype == torch.bfloat16:
        t = t.float()
    if not isinstance(t, Tensor):
        out = np.asarray(t)
    elif t.is_cpu and not t.requires_grad:
        try:
            out = t.numpy()  # one call where it can (a CPU tensor without grad)
        except (RuntimeError, TypeError):  # e.g. a conjugate or negative view
            out = t.detach().cpu().numpy()
    else:
        out = t.detach().cpu().numpy()
    return out if out.flags.c_contiguous else np.ascontiguousarray(out)  # (0-d arrays are contiguous)


def ids_in_dtype(ids: Tensor, deltas: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Position ids and ``rope_deltas`` cast to ``dtype`` (the dtype of ``input_ids``, as the models return
    them), refused where a narrower integer dtype cannot hold them (int32 would wrap around)."""
    if not (dtype.is_floating_point or dtype == torch.bool or dtype.itemsize >= 8 or not ids.numel()):
        info = torch.iinfo(dtype)
        low = min(int(ids.min()), int(deltas.min()) if deltas.numel() else 0)
        high = max(int(ids.max()), int(deltas.max()) if deltas.numel() else 0)
        if low < info.min or high > info.max:
            raise ValueError(
                f"position ids reach {high if high > info.max else low}, beyond the range of input_ids' dtype "
                f"{dtype} ([{info.min}, {info.max}]): they would wrap around; pass input_ids as torch.int64"
            )
    return (ids, deltas) if ids.dtype == dtype and deltas.dtype == dtype else (ids.to(dtype), deltas.to(dtype))
