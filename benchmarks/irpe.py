"""iRPE ``product-ctx-k`` against plain SDPA and a naive O(N^2 D) implementation.

One attention layer (``mmpos.nn.Attention``: projections + attention), forward and
backward, at N = 197 (14 x 14 + class token) and N = 1025 (32 x 32 + class token):

* ``sdpa``: no position encoder (``F.scaled_dot_product_attention``, fused kernel);
* ``irpe``: ``product-ctx-k`` through the bias hook (gather from ``(B, H, N, 50)``);
* ``naive``: the same encoding with every pair's vector materialised, ``(N, N, D)``,
  and contracted with q by ``einsum`` (what the paper's Eq. (4) says literally).

Time: median of ``--repeats`` steps, the variants interleaved step by step so that a
shared machine's load hits them alike; process CPU time on CPU, wall time on CUDA.
Peak memory: on CUDA ``max_memory_allocated`` above the inputs and weights; on CPU the
rise of the peak resident set during one step (``VmHWM`` of ``/proc/self/status``, reset
through ``/proc/self/clear_refs``, with glibc mapping every block of 64 KiB or more).

    python benchmarks/irpe.py [--device cpu|cuda] [--repeats 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import platform
import statistics
import time

import torch

import mmpos
from mmpos import Coords
from mmpos.nn import Attention

DIM, HEADS = 384, 6  # DeiT-S
SIZES = {197: ((14, 14), 8), 1025: ((32, 32), 2)}  # N -> (grid, batch)
VARIANTS = ("sdpa", "irpe", "naive")


class NaiveIRPE(torch.nn.Module):
    """The same layer and encoding with per-pair vectors ``(N, N, D)`` (no gather)."""

    def __init__(self, layer: Attention) -> None:
        super().__init__()
        self.layer = layer
        self.enc = layer.encoders[0]

    def forward(self, x: torch.Tensor, coords: Coords) -> torch.Tensor:
        layer, b, n = self.layer, x.shape[0], x.shape[1]
        q = layer.q(x).view(b, n, HEADS, -1).transpose(1, 2)
        k, v = layer.kv(x).view(b, n, 2, HEADS, -1).permute(2, 0, 3, 1, 4)
        q = q * q.shape[-1] ** -0.5
        ids = self.enc.table_ids(coords.grid_shape, coords.prefix)[0].to(x.device)  # (N, N)
        pair = self.enc.k_table[0].T[ids]  # (N, N, D): r(i, j)
        logits = q @ k.transpose(-2, -1) + torch.einsum("bhid,ijd->bhij", q, pair)
        out = logits.softmax(-1) @ v
        return layer.proj(out.transpose(1, 2).reshape(b, n, -1))


def build(variant: str, grid: tuple[int, int], device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if variant == "sdpa":
        return Attention(DIM, HEADS).to(device)
    enc = mmpos.create("irpe-product-ctx-k", dim=DIM, num_heads=HEADS, grid_size=grid)
    torch.nn.init.normal_(enc.k_table, std=0.02)
    layer = Attention(DIM, HEADS, encoders=[enc]).to(device)
    return layer if variant == "irpe" else NaiveIRPE(layer)


def inputs(n: int, device: str) -> tuple[torch.Tensor, Coords]:
    grid, batch = SIZES[n]
    x = torch.randn(batch, n, DIM, device=device, requires_grad=True)
    return x, Coords.grid(*grid, prefix=1, device=device)


def step(model: torch.nn.Module, x: torch.Tensor, coords: Coords) -> None:
    model(x, coords).square().mean().backward()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


_LIBC = ctypes.CDLL(None)
_M_MMAP_THRESHOLD = -3


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def peak_memory(variant: str, n: int, device: str) -> float:
    """Extra peak memory (MiB) of one forward + backward step, after a warm-up step."""
    model, (x, coords) = build(variant, SIZES[n][0], device), inputs(n, device)
    step(model, x, coords)
    model.zero_grad(set_to_none=True)
    x.grad = None
    if device == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(model, x, coords)
        sync(device)
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    # CPU (Linux, glibc): return freed heap pages, reset the resident-set high-water mark,
    # then read how far one step raises it
    _LIBC.malloc_trim(0)
    base = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    step(model, x, coords)
    return (_status_kib("VmHWM") - base) / 1024


def times(n: int, device: str, repeats: int) -> dict[str, float]:
    """Median seconds per forward + backward step, variants interleaved.

    CPU: process CPU time, which a machine shared with other jobs inflates far less than
    wall time (with one thread it is the step's compute time); CUDA: wall time, synchronised.
    """
    clock = time.perf_counter if device == "cuda" else time.process_time
    models = {v: build(v, SIZES[n][0], device) for v in VARIANTS}
    x, coords = inputs(n, device)
    with torch.no_grad():  # the naive and the gather versions compute the same layer
        torch.testing.assert_close(models["naive"](x, coords), models["irpe"](x, coords), rtol=1e-4, atol=1e-5)
    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(repeats + 1):
        for variant, model in models.items():
            sync(device)
            start = clock()
            step(model, x, coords)
            sync(device)
            if i:  # the first round warms up
                samples[variant].append(clock() - start)
    return {v: statistics.median(s) for v, s in samples.items()}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cpu":  # blocks of 64 KiB and more are mapped and unmapped: RSS follows live memory
        _LIBC.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
    rows = []
    for n in SIZES:
        t = times(n, args.device, args.repeats)
        mem = {v: peak_memory(v, n, args.device) for v in VARIANTS}
        for v in VARIANTS:
            rows.append(dict(n=n, batch=SIZES[n][1], variant=v, ms=1e3 * t[v], time_ratio=t[v] / t["sdpa"],
                             mib=mem[v], mem_ratio=mem[v] / mem["sdpa"]))
    machine = torch.cuda.get_device_name() if args.device == "cuda" else cpu_name()
    print(f"iRPE benchmark, {datetime.date.today()}, {machine}, torch {torch.__version__}, "
          f"threads={args.threads}, dim={DIM}, heads={HEADS}, median of {args.repeats} "
          f"({'wall' if args.device == 'cuda' else 'process CPU'} time)\n")
    print("| N | batch | variant | fwd+bwd ms | x sdpa | peak extra MiB | x sdpa |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['batch']} | {r['variant']} | {r['ms']:.1f} | {r['time_ratio']:.2f} "
              f"| {r['mib']:.1f} | {r['mem_ratio']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
