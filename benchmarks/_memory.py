"""Peak memory of one call, shared by the benchmark scripts.

CUDA: ``max_memory_allocated`` above what is allocated before the call. CPU (Linux, glibc):
freed heap pages are returned (``malloc_trim``), the resident-set high-water mark ``VmHWM``
is reset to the current resident set (writing ``5`` to ``/proc/self/clear_refs``), and the
result is how far the call raises it. Call :func:`map_large_blocks` once first so that blocks
of 64 KiB and more are mapped and unmapped and the resident set follows live memory.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

_LIBC = ctypes.CDLL(None)
_M_MMAP_THRESHOLD = -3


def map_large_blocks() -> None:
    """glibc: serve blocks of 64 KiB and more by ``mmap`` (freed at once, so RSS follows them)."""
    _LIBC.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)


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
