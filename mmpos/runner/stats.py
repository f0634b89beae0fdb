"""Statistics of a sweep's final metrics: per-encoder summaries and paired differences with bootstrap intervals.

``finals`` everywhere is the list of per-run records a sweep writes (``encoder``, ``seed``, ``metrics``,
``metric``, ``higher_is_better``, ``seconds``, ``params``); see :mod:`mmpos.runner.sweep`.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "bootstrap_interval",
    "check_validation",
    "learning_curve_area",
    "paired_differences",
    "summarize",
    "verdicts",
]


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


def learning_curve_area(metrics_path: str | Path, metric: str) -> float:
    """Area under the learning curve of ``metric``, normalized to the mean value over the run.

    Reads the ``{"step", "eval": {...}}`` lines of a run's ``metrics.jsonl``; the curve starts at the
    first evaluation and the area (trapezoids over the steps) is divided by the steps it spans, so a
    metric in [0, 1] gives an area in [0, 1]. One evaluation: its value. ``nan`` when there is none.
    """
    points: dict[int, float] = {}
    with open(metrics_path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if isinstance(record.get("eval"), Mapping) and metric in record["eval"]:
                points[int(record["step"])] = float(record["eval"][metric])  # a later line of a step wins
    if not points:
        return math.nan
    steps = sorted(points)
    if len(steps) == 1:
        return points[steps[0]]
    area = sum((b - a) * (points[a] + points[b]) / 2 for a, b in itertools.pairwise(steps))
    return area / (steps[-1] - steps[0])


def _control_failures(finals: list[dict[str, Any]], controls: Sequence[Mapping[str, Any]]) -> list[str]:
    """``"control X reached 0.62 < 0.90 on acc"`` for every control below its threshold."""
    ranked, _, _ = summarize(finals)
    rows = {r["encoder"]: r for r in ranked}
    failed = []
    for c in controls:
        row = rows.get(c["encoder"])
        if row is None:
            failed.append(f"control {c['encoder']} was not swept")
            continue
        if c["metric"] not in row["mean"]:
            failed.append(f"control {c['encoder']} has no {c['metric']!r}")
            continue
        value, low = row["mean"][c["metric"]], float(c.get("min", 0.9))
        if not value >= low:
            failed.append(f"control {c['encoder']} reached {value:.3f} < {low:.2f} on {c['metric']}")
    return failed


def check_validation(validation: Mapping[str, Any]) -> None:
    """Check the structure of a recipe's ``validation`` section (``ValueError`` / ``TypeError`` naming the key).

    Encoder names are not checked against a sweep: a claim or control whose encoder was not swept
    (e.g. after an ``encoders=`` override) gets the verdict "not measured".
    """
    if not isinstance(validation, Mapping):
        raise TypeError(f"validation must be a mapping with 'claims', got {validation!r}")
    claims = validation.get("claims")
    if not isinstance(claims, list) or not claims:
        raise ValueError(f"validation.claims must be a non-empty list, got {claims!r}")
    for i, claim in enumerate(claims):
        where = f"validation.claims[{i}]"
        if not isinstance(claim, Mapping):
            raise TypeError(f"{where} must be a mapping, got {claim!r}")
        for key in ("claim", "encoder", "baseline", "metric"):
            if not isinstance(claim.get(key), str) or not claim[key]:
                raise ValueError(f"{where}.{key} must be a non-empty string, got {claim.get(key)!r}")
        if claim.get("direction", "higher") not in ("higher", "lower"):
            raise ValueError(f"{where}.direction must be 'higher' or 'lower', got {claim['direction']!r}")
        for c in [*validation.get("controls", []), *claim.get("controls", [])]:
            if (
                not isinstance(c, Mapping)
                or not isinstance(c.get("encoder"), str)
                or not isinstance(c.get("metric"), str)
            ):
                raise TypeError(f"a control must be a mapping with 'encoder' and 'metric' (and 'min'), got {c!r}")


def verdicts(finals: list[dict[str, Any]], validation: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One verdict per claim of a recipe's ``validation`` section (see ``docs/recipes.md``).

    Each row: the claim's fields, ``diff`` (``{"mean", "low", "high", "seeds"}`` of ``encoder -
    baseline`` on ``metric``, from :func:`paired_differences`), ``controls`` (``[(encoder, metric,
    mean, min)]``), ``verdict`` (``"confirmed"``, ``"not confirmed"`` or ``"not measured"``) and
    ``reason`` (measured: the failed control, the seed count, or the difference and its interval).
    """
    check_validation(validation)
    swept = {f["encoder"] for f in finals}
    min_seeds = int(validation.get("min_seeds", 8))
    ranked, _, _ = summarize(finals)
    means = {r["encoder"]: r["mean"] for r in ranked}
    out = []
    for claim in validation["claims"]:
        controls = [*validation.get("controls", []), *claim.get("controls", [])]
        metric, higher = claim["metric"], claim.get("direction", "higher") == "higher"
        missing = [claim[k] for k in ("encoder", "baseline") if claim[k] not in swept]
        rows = [] if missing else paired_differences(finals, claim["baseline"])
        d = next((r["diff"].get(metric) for r in rows if r["encoder"] == claim["encoder"]), None)
        row = {
            **{k: claim[k] for k in ("claim", "encoder", "baseline", "metric")},
            "direction": "higher" if higher else "lower",
            "diff": d,
            "controls": [
                (
                    c["encoder"],
                    c["metric"],
                    means.get(c["encoder"], {}).get(c["metric"], math.nan),
                    float(c.get("min", 0.9)),
                )
                for c in controls
            ],
        }
        failed = _control_failures(finals, controls)
        if missing:
            row["verdict"], row["reason"] = "not measured", f"{' and '.join(missing)} not swept"
        elif d is None:
            row["verdict"], row["reason"] = "not measured", f"no paired seeds with metric {metric!r}"
        elif failed:
            row["verdict"], row["reason"] = "not measured", "; ".join(failed)
        elif d["seeds"] < min_seeds:
            row["verdict"], row["reason"] = "not measured", f"{d['seeds']} paired seeds < {min_seeds}"
        else:
            interval = f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}] over {d['seeds']} seeds"
            if (d["low"] > 0) if higher else (d["high"] < 0):
                row["verdict"], row["reason"] = "confirmed", interval
            elif (d["high"] < 0) if higher else (d["low"] > 0):
                row["verdict"], row["reason"] = "not confirmed", f"the opposite direction: {interval}"
            else:
                row["verdict"], row["reason"] = "not confirmed", f"the interval includes 0: {interval}"
        out.append(row)
    return out
