"""Sorting networks as directed graphs: is a sequence of comparators a sorting network?

The benchmark of Geisler et al., "Transformers Meet Directed Graphs", ICML 2023;
generator read in google-deepmind/digraph_transformer
``script_generate_sorting_network_np.py`` (``generate_sorting_network``,
``test_network``, ``operators_to_graphstuple``):

* a comparator ``(i, j)``, ``i < j``, puts the smaller value on channel ``i``;
* validity by the zero-one principle: a network sorts every input iff it sorts all
  ``2^n`` inputs of zeros and ones;
* sampling: draw two distinct channels among those still unsorted on some 0-1 input
  (never the previous comparator again) until every 0-1 input is sorted, at most
  ``max_comparators`` comparators (the reference's 512);
* a valid network is a positive, the same network without its last comparator a
  negative (it no longer sorts: the last comparator was needed); evaluation splits also
  hold the reversed network, labelled by :func:`is_sorting_network`;
* the graph: one node per comparator; an edge from the previous comparator on channel
  ``i`` and from the previous one on channel ``j`` (a comparator reading both channels
  from one predecessor gets one edge); node features: the two channel indices only, so
  the order of the comparators must come from the graph (the PE).

The reference splits: train on 7-11 channels, validation 12, test 13-16.
0-1 inputs are held as the bits of integers (``n <= 30`` channels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "TEST_CHANNELS",
    "TRAIN_CHANNELS",
    "VALID_CHANNELS",
    "SortingNetwork",
    "build_dataset",
    "is_sorting_network",
    "network_graph",
    "sample_network",
    "sorted_prefix",
]

TRAIN_CHANNELS = (7, 8, 9, 10, 11)
VALID_CHANNELS = (12,)
TEST_CHANNELS = (13, 14, 15, 16)


def _check_channels(num_channels: int) -> int:
    if isinstance(num_channels, bool) or not isinstance(num_channels, (int, np.integer)) or not 2 <= num_channels <= 30:
        raise ValueError(f"num_channels must be an int in [2, 30], got {num_channels!r}")
    return int(num_channels)


def _apply(cases: np.ndarray, i: int, j: int) -> np.ndarray:
    """Comparator ``(i, j)`` on 0-1 inputs held as bits: channel ``i`` gets the min (AND), ``j`` the max (OR)."""
    bi, bj = (cases >> i) & 1, (cases >> j) & 1
    cleared = cases & ~((1 << i) | (1 << j))
    return cleared | ((bi & bj) << i) | ((bi | bj) << j)


def _all_cases(n: int) -> np.ndarray:
    return np.arange(1 << n, dtype=np.int64)


def _distinct(cases: np.ndarray, n: int) -> np.ndarray:
    """Sorted distinct values of ``cases`` in ``[0, 2^n)`` (a presence table; no sort)."""
    present = np.zeros(1 << n, dtype=bool)
    present[cases] = True
    return np.flatnonzero(present)


def _unsorted_channels(cases: np.ndarray, n: int) -> np.ndarray:
    """Channels that differ from the sorted input on some case (sorted: the ones on the top channels)."""
    ones = np.bitwise_count(cases).astype(np.int64)
    full = (1 << n) - 1
    sorted_cases = full ^ ((1 << (n - ones)) - 1)
    diff = np.bitwise_or.reduce(cases ^ sorted_cases)
    return np.flatnonzero((int(diff) >> np.arange(n)) & 1)


def _check_comparators(comparators: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out = []
    for c in comparators:
        i, j = (int(v) for v in c)
        if not 0 <= i < j < n:
            raise ValueError(f"comparators must be pairs (i, j) with 0 <= i < j < num_channels={n}, got {tuple(c)!r}")
        out.append((i, j))
    return out


def is_sorting_network(comparators: Sequence[tuple[int, int]], num_channels: int) -> bool:
    """Whether ``comparators`` sort every input of ``num_channels`` values (zero-one principle)."""
    n = _check_channels(num_channels)
    cases = _all_cases(n)
    for i, j in _check_comparators(comparators, n):
        cases = _distinct(_apply(cases, i, j), n)
        if cases.size == n + 1:  # only the n + 1 sorted 0-1 vectors are left
            return True
    return cases.size == n + 1


def sorted_prefix(comparators: Sequence[tuple[int, int]], num_channels: int) -> np.ndarray:
    """``(c,)`` bool: whether the first ``t + 1`` comparators already sort every input.

    The label of a network is ``sorted_prefix(...).any()`` (and, for the networks of
    :func:`build_dataset`, only the last entry can be true): the recipes' positive control
    reads this oracle feature.
    """
    n = _check_channels(num_channels)
    cases = _all_cases(n)
    out = np.zeros(len(comparators), dtype=bool)
    done = False
    for t, (i, j) in enumerate(_check_comparators(comparators, n)):
        if not done:
            cases = _distinct(_apply(cases, i, j), n)
            done = cases.size == n + 1
        out[t] = done
    return out


def sample_network(
    num_channels: int, rng: np.random.Generator, max_comparators: int = 512
) -> list[tuple[int, int]] | None:
    """A random sorting network (list of ``(i, j)``, ``i < j``), or ``None`` past ``max_comparators``."""
    n = _check_channels(num_channels)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    cases = _all_cases(n)
    unsorted = np.arange(n)
    comparators: list[tuple[int, int]] = []
    while len(comparators) < max_comparators:
        i, j = sorted(int(v) for v in rng.choice(unsorted, size=2, replace=False))
        if comparators and comparators[-1] == (i, j):
            continue
        comparators.append((i, j))
        cases = _distinct(_apply(cases, i, j), n)
        if cases.size == n + 1:
            return comparators
        unsorted = _unsorted_channels(cases, n)
    return None


def network_graph(
    comparators: Sequence[tuple[int, int]], num_channels: int, order_index: bool = False
) -> tuple[Tensor, Tensor]:
    """``(edge_index (2, m) long, channels (c, 2) long)`` of a network of ``c`` comparators.

    ``order_index=True``: the features are ``(c, 3)`` ``[comparator index, i, j]``, the reference's
    ``node_feat`` (``operators_to_graphstuple``); its base config encodes the index
    (``exclude_canonical=False``), its sorting-network preset leaves it out (``True``), as
    the default here does: the order of the comparators must then come from the PE.
    """
    n = _check_channels(num_channels)
    last = [-1] * n
    src, dst = [], []
    for node, (i, j) in enumerate(_check_comparators(comparators, n)):
        for p in {last[i], last[j]} - {-1}:
            src.append(p)
            dst.append(node)
        last[i] = last[j] = node
    edge_index = torch.tensor([sorted(src), [d for _, d in sorted(zip(src, dst))]], dtype=torch.long).view(2, -1)
    chans = torch.tensor(list(comparators), dtype=torch.long).view(-1, 2)
    if order_index:
        chans = torch.cat([torch.arange(len(chans)).unsqueeze(1), chans], dim=1)
    return edge_index, chans


@dataclass(frozen=True)
class SortingNetwork:
    """One example: ``comparators`` on ``num_channels`` channels, ``label`` = it sorts."""

    comparators: tuple[tuple[int, int], ...]
    num_channels: int
    label: bool


def build_dataset(
    channels: Sequence[int], num_networks: int, seed: int, reverse: bool = False, max_comparators: int = 512
) -> list[SortingNetwork]:
    """``num_networks`` sampled networks (channel count uniform over ``channels``), each giving
    a positive and its negative (last comparator dropped), plus the reversed network when
    ``reverse`` (the reference's evaluation splits). Deterministic in ``seed``."""
    if isinstance(num_networks, bool) or not isinstance(num_networks, int) or num_networks < 1:
        raise ValueError(f"num_networks must be a positive int, got {num_networks!r}")
    chans = [_check_channels(c) for c in channels]
    if not chans:
        raise ValueError("channels must not be empty")
    rng = np.random.default_rng(seed)
    out: list[SortingNetwork] = []
    while len(out) < num_networks * (3 if reverse else 2):
        n = int(rng.choice(chans))
        net = sample_network(n, rng, max_comparators)
        if net is None:
            continue
        out.append(SortingNetwork(tuple(net), n, True))
        out.append(SortingNetwork(tuple(net[:-1]), n, False))
        if reverse:
            rev = tuple(net[::-1])
            out.append(SortingNetwork(rev, n, is_sorting_network(rev, n)))
    return out
