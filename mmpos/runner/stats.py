"""Statistics of a sweep's final metrics: per-encoder summaries and paired differences with bootstrap intervals.

``finals`` everywhere is the list of per-run records a sweep writes (``encoder``, ``seed``, ``metrics``,
``metric``, ``higher_is_better``, ``seconds``, ``params``); see :mod:`mmpos.runner.sweep`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["bootstrap_interval", "paired_differences", "summarize"]


def summarize(finals: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, bool]:
    """Per-encoder statistics ranked by the task's metric (best first), the metric and its direction.

    Each row: ``encoder``, ``values`` / ``seeds`` (per metric, in seed order), ``mean``, ``std``,
    ``seconds``, ``params``.
    """
    metric, higher = finals[0]["metric"], finals[0]["higher_is_better"]
    rows: dict[str, dict[str, Any]] = {}
    for f in finals:
        row = rows.setdefault(
            f["encoder"], {"encoder": f["encoder"], "values": {}, "seeds": {}, "seconds": [], "params": f["params"]}
        )
        for k, v in f["metrics"].items():
            row["values"].setdefault(k, []).append(v)
            row["seeds"].setdefault(k, []).append(f["seed"])
        row["seconds"].append(f["seconds"])
    for row in rows.values():
        row["mean"] = {k: statistics.fmean(v) for k, v in row["values"].items()}
        row["std"] = {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in row["values"].items()}
    ranked = sorted(rows.values(), key=lambda r: r["mean"][metric], reverse=higher)
    return ranked, metric, higher


def bootstrap_interval(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (``len(values) >= 2``).

    ``resamples`` means of ``len(values)`` draws with replacement, from a
    ``numpy.random.default_rng(seed)`` (the same interval every time); the interval is their
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles. With 3 values (and 2) the
    95% interval is the range of the values: a resample of one value repeated has probability
    ``1/27 > 2.5%``.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) < 2:
        raise ValueError(f"values must be a 1-D sequence of at least 2 numbers, got {values!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))].mean(1)  # (resamples,)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def paired_differences(finals: list[dict[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Each encoder's difference from ``baseline``, seed by seed, for every metric both have.

    Returns one row per other encoder, in :func:`summarize`'s rank order:
    ``{"encoder", "diff": {metric: {"mean", "low", "high", "seeds"}}}`` where the differences
    are ``encoder - baseline`` over the seeds both ran, ``mean`` their mean and ``low`` /
    ``high`` the 95% :func:`bootstrap_interval` of that mean (``nan`` with one seed).
    """
    ranked, _, _ = summarize(finals)
    base = next((r for r in ranked if r["encoder"] == baseline), None)
    if base is None:
        raise ValueError(f"baseline {baseline!r} is not among the encoders {[r['encoder'] for r in ranked]}")
    out = []
    for row in ranked:
        if row is base:
            continue
        diff = {}
        for key, values in row["values"].items():
            if key not in base["values"]:
                continue
            theirs = dict(zip(base["seeds"][key], base["values"][key]))
            pairs = [v - theirs[s] for s, v in zip(row["seeds"][key], values) if s in theirs]
            if not pairs:
                continue
            low, high = bootstrap_interval(pairs) if len(pairs) > 1 else (math.nan, math.nan)
            diff[key] = {"mean": statistics.fmean(pairs), "low": low, "high": high, "seeds": len(pairs)}
        out.append({"encoder": row["encoder"], "diff": diff})
    return out
