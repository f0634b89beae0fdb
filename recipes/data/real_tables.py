"""Real table values for the table tasks: scikit-learn's bundled data sets, binned into oracle tokens.

The values come from ``sklearn.datasets.load_breast_cancer`` (569 rows x 30 real-valued
features, the Wisconsin diagnostic breast-cancer table shipped as a CSV inside scikit-learn,
so nothing is downloaded) or ``load_wine`` (178 x 13). Each column is cut into ``num_values``
quantile bins (its own empirical quantiles), so a cell is one oracle token ``0..num_values-1``
that keeps the table's real per-column distributions and its correlations between columns.
A sample is a window of ``rows`` consecutive table rows and ``cols`` consecutive columns
(starting anywhere); the rows of the table are split once into a training part (the first
``train_fraction``) and a held-out part, so evaluation windows come from unseen rows.

Needs the optional ``data`` extra (``pip install "mmpos-torch[data]"``: scikit-learn).

Shapes: ``bins`` ``(N, F)`` long; windows ``(n, rows, cols)`` long.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

__all__ = ["DATASETS", "binned_table", "table_windows"]

DATASETS = ("breast_cancer", "wine")


@lru_cache(maxsize=4)
def binned_table(name: str = "breast_cancer", num_values: int = 10) -> Tensor:
    """``(N, F)`` long: the data set's features, each column in ``num_values`` quantile bins."""
    if name not in DATASETS:
        raise ValueError(f"name must be one of {DATASETS}, got {name!r}")
    if isinstance(num_values, bool) or not isinstance(num_values, int) or num_values < 2:
        raise ValueError(f"num_values must be an int >= 2, got {num_values!r}")
    try:
        from sklearn import datasets
    except ImportError as e:  # pragma: no cover - the optional extra
        raise ImportError("real tables need scikit-learn: pip install 'mmpos-torch[data]'") from e
    x = getattr(datasets, f"load_{name}")().data.astype(np.float64)  # (N, F)
    edges = np.quantile(x, np.linspace(0, 1, num_values + 1)[1:-1], axis=0)  # (V - 1, F)
    bins = (x[None] > edges[:, None]).sum(0)  # (N, F) in 0..V-1
    return torch.from_numpy(bins).long()


def table_windows(
    table: Tensor, n: int, rows: int, cols: int, generator: torch.Generator, split: str, train_fraction: float = 0.7
) -> Tensor:
    """``(n, rows, cols)`` windows of ``table`` from its ``split`` (``"train"`` or ``"test"``) rows."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    total, width = table.shape
    cut = int(total * train_fraction)
    lo, hi = (0, cut) if split == "train" else (cut, total)
    if not 1 <= rows <= hi - lo or not 1 <= cols <= width:
        raise ValueError(f"a {rows} x {cols} window does not fit the {split} part ({hi - lo} rows x {width} columns)")
    r0 = lo + torch.randint(hi - lo - rows + 1, (n,), generator=generator)
    c0 = torch.randint(width - cols + 1, (n,), generator=generator)
    r = r0[:, None, None] + torch.arange(rows)[None, :, None]
    c = c0[:, None, None] + torch.arange(cols)[None, None, :]
    return table[r, c]
