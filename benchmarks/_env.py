"""What every benchmark prints beside its tables: versions, threads, load and the allocator.

Timings on a shared machine mean little without the load they ran under, and CPU timings of
allocation-heavy code depend on the allocator (glibc's default reuses freed blocks up to its
dynamic mmap ceiling; ``MALLOC_MMAP_THRESHOLD_`` / ``mallopt`` make every large block fresh,
page-faulted memory). :func:`header` says both, in one line an HTML comment can carry into a
Markdown table, and :func:`allocator` names the setting in force *now* in this process
(``benchmarks/_memory.py``'s :func:`~_memory.map_large_blocks` changes it, so call it per table).
"""

from __future__ import annotations

import ctypes
import datetime
import os
import platform

import _memory
import torch


def load() -> str:
    """``"load 1.9 / 0.8 / 0.3 on 2 CPUs"``: the 1, 5 and 15 min load averages and the CPU count."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs"


def _glibc() -> str | None:
    try:
        fn = ctypes.CDLL(None).gnu_get_libc_version
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    return fn().decode()


def allocator() -> str:
    """The host allocator and its setting in force in this process (``glibc 2.39 default``, ...)."""
    preload = os.environ.get("LD_PRELOAD", "")
    for name in ("jemalloc", "tcmalloc", "mimalloc"):
        if name in preload:
            return f"{name} (LD_PRELOAD)"
    glibc = _glibc()
    if glibc is None:
        return f"{platform.system()} system allocator"
    settings = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_") and k.endswith("_")]
    if _memory.mapped_threshold() is not None:
        settings.append(f"mallopt(M_MMAP_THRESHOLD={_memory.mapped_threshold()})")
    return f"glibc {glibc} " + (", ".join(settings) if settings else "default (dynamic mmap threshold)")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def versions(*modules) -> str:
    """``"torch 2.14.1, transformers 5.24.0"`` for torch and the given modules (those with a version)."""
    parts = [f"torch {torch.__version__}"]
    parts += [f"{m.__name__} {m.__version__}" for m in modules if getattr(m, "__version__", None)]
    return ", ".join(parts)


def header(device: str = "cpu", *modules, note: str = "") -> str:
    """One line: UTC time, device, versions, threads, load and allocator, as an HTML comment."""
    machine = torch.cuda.get_device_name() if str(device).startswith("cuda") else cpu_name()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [now, f"{device} ({machine})", versions(*modules), f"{torch.get_num_threads()} thread(s)", load()]
    if not str(device).startswith("cuda"):
        parts.append(f"allocator {allocator()}")
    if note:
        parts.append(note)
    return "<!-- " + "; ".join(parts) + " -->"
