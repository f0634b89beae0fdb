"""Peak memory of one call, shared by the benchmark scripts.

CUDA: ``max_memory_allocated`` above what is allocated before the call. CPU (Linux, glibc):
freed heap pages are returned (``malloc_trim``), the resident-set high-water mark ``VmHWM``
is reset to the current resident set (writing ``5`` to ``/proc/self/clear_refs``), and the
result is how far the call raises it. Call :func:`map_large_blocks` once first (after the
timings: it changes them) so that blocks of 64 KiB and more are mapped and unmapped and the
resident set follows live memory.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

_LIBC = ctypes.CDLL(None)
_M_MMAP_THRESHOLD = -3
_MAPPED: list[int] = []  # the threshold set by map_large_blocks, if it was called


def map_large_blocks(threshold: int = 64 * 1024) -> None:
    """glibc: serve blocks of ``threshold`` bytes and more by ``mmap`` (freed at once, so RSS follows them).

    This changes what allocations cost (every large block is fresh, page-faulted memory; glibc's
    default reuses freed blocks below its dynamic ceiling of up to 32 MiB), so benchmarks time
    with the default allocator first and call this afterwards, for the peak-memory measurement
    (and a second, labelled timing column if they keep one). It cannot be undone in-process.
    """
    if _LIBC.mallopt(_M_MMAP_THRESHOLD, threshold) != 1:
        raise OSError(f"mallopt(M_MMAP_THRESHOLD, {threshold}) failed")
    _MAPPED[:] = [threshold]


def mapped_threshold() -> int | None:
    """The threshold :func:`map_large_blocks` set in this process, or ``None`` (the allocator's default)."""
    return _MAPPED[0] if _MAPPED else None


def status_kib(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_mib(fn: Callable[[], object], device: str | torch.device) -> float:
    """Extra peak memory (MiB) of one call of ``fn`` (no warm-up: the caller does it)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    _LIBC.malloc_trim(0)
    base = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    fn()
    return (status_kib("VmHWM") - base) / 1024
