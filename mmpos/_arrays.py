"""Host copies of tensors for the NumPy bookkeeping of the packer and the token-id front ends."""

from __future__ import annotations

import numpy as np
from torch import Tensor


def host(t: Tensor | np.ndarray) -> np.ndarray:
    """A NumPy view of ``t`` on the host (no copy for a CPU tensor or an array; one transfer otherwise)."""
    if not isinstance(t, Tensor):
        return np.asarray(t)
    if t.is_cpu and not t.requires_grad:
        try:
            return t.numpy()  # one call where it can (a CPU tensor without grad)
        except (RuntimeError, TypeError):  # e.g. a conjugate or negative view
            pass
    return t.detach().cpu().numpy()
