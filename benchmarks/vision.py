"""Vision encoders: one attention layer, forward + backward, time and peak memory relative to plain SDPA.

For every registered encoder that reads a 2-D token grid, one layer is timed at
N = 197 (14 x 14 patches + a class token) and N = 1025 (32 x 32 + a class token), with
DeiT-S widths (dim 384, 6 heads of 64):

* rotary / bias encoders: ``mmpos.nn.Attention(encoders=[encoder])``;
* additive encoders: ``x + embed(coords)`` then the attention;
* conv encoders (PEG): the attention then the convolution;
* ``sdpa``: the attention alone (``F.scaled_dot_product_attention``), the 1.00x reference.

Two side-by-side comparisons:

* ``irpe-product-ctx-k`` against ``naive irpe``: the same layer with the contextual key
  term written as the paper's formula reads, every pair's table vector materialised as an
  ``(N, N, D)`` tensor and contracted with ``q`` (O(N^2 D) memory);
* axial RoPE: rotating q and k ``(B, H, N, 64)`` (forward + backward) with mmpos
  ``rope-axial`` (angles from the coordinates on every call) and with timm's
  ``RotaryEmbeddingCat`` + ``apply_rot_embed_cat`` (table cached for the grid, the class
  token split off and concatenated back, as timm's EVA does).

Time: median over ``--repeats`` steps after a warm-up; the variants take turns step by
step, so that the load of a shared machine falls on all of them alike. Peak memory above
what exists before the step: on CUDA ``max_memory_allocated``; on CPU the rise of the
process's peak resident set (``VmHWM``, reset by writing ``5`` to ``/proc/self/clear_refs``)
during one step, measured in a separate process started with ``MALLOC_MMAP_THRESHOLD_=65536``
so that every tensor of 64 KiB or more is mapped on allocation and unmapped on release.

    python benchmarks/vision.py [--device cpu|cuda] [--repeats 5] [--threads 1] [--out docs/benchmarks/vision.md]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from timm.layers import RotaryEmbeddingCat, apply_rot_embed_cat
from torch import Tensor, nn

import mmpos
from mmpos import Coords
from mmpos.encoders.irpe import IRPE
from mmpos.encoders.registry import create_in_model, encoder_info
from mmpos.nn import Attention

DIM, HEADS = 384, 6
SIZES = {197: ((14, 14), 8), 1025: ((32, 32), 2)}  # N -> (grid, batch)
GRID_KINDS = ("additive", "conv", "rotary", "bias")
# registered names that do not take a 2-D image grid (video / multimodal layouts)
NOT_VISION = {"peg3d", "mrope", "mrope-i", "mhrope", "vrope", "v2pe", "hope"}


def vision_encoders() -> list[str]:
    """Registered encoders for 2-D image grids (``none`` is the ``sdpa`` reference)."""
    return [e.name for e in mmpos.list_encoders() if e.kind in GRID_KINDS and e.name not in NOT_VISION]


class Layer(nn.Module):
    """One attention layer with ``encoder`` at its hook point; ``forward(x (B, N, D), coords)``."""

    def __init__(self, encoder: str | None, grid: tuple[int, int]) -> None:
        super().__init__()
        kind = "none" if encoder is None else encoder_info(encoder).kind
        context = {"dim": DIM, "num_heads": HEADS, "num_kv_heads": HEADS, "head_dim": DIM // HEADS,
                   "depth": 1, "layer": 0, "grid_size": grid, "axes": ("h", "w")}  # fmt: skip
        module = None if encoder is None else create_in_model(encoder, context)
        self.additive = module if kind == "additive" else None
        self.conv = module if kind == "conv" else None
        self.attn = Attention(DIM, HEADS, encoders=[module] if kind in ("rotary", "bias") else [])

    def forward(self, x: Tensor, coords: Coords) -> Tensor:
        if self.additive is not None:
            x = self.additive(x, coords)
        x = self.attn(x, coords)
        return self.conv(x, coords) if self.conv is not None else x


class NaiveIRPELayer(nn.Module):
    """``product-ctx-k`` with the per-pair vectors materialised: ``r (N, N, D)``, ``einsum`` with q.

    Logit ``(i, j)``: ``s q_i . k_j + s q_i . r[b(i, j)]`` with ``s = D ** -0.5`` (the
    reference scales q before both products); weights and table from ``layer``.
    """

    def __init__(self, layer: Layer) -> None:
        super().__init__()
        self.layer = layer
        (self.irpe,) = layer.attn.encoders
        if not isinstance(self.irpe, IRPE):
            raise TypeError(f"NaiveIRPELayer needs an irpe layer, got {type(self.irpe).__name__}")

    def forward(self, x: Tensor, coords: Coords) -> Tensor:
        attn, (b, n, _) = self.layer.attn, x.shape
        q = attn.q(x).view(b, n, HEADS, -1).transpose(1, 2) * (DIM // HEADS) ** -0.5  # (B, H, N, D)
        k, v = attn.kv(x).view(b, n, 2, HEADS, -1).permute(2, 0, 3, 1, 4)
        ids = self.irpe.table_ids(coords.grid_shape, coords.num_prefix_tokens)[0].to(x.device)  # (N, N)
        pairs = self.irpe.k_table[0].T[ids]  # (N, N, D): the table vector of every pair
        logits = q @ k.transpose(-2, -1) + torch.einsum("bhid,ijd->bhij", q, pairs)
        out = logits.softmax(-1) @ v
        return attn.proj(out.transpose(1, 2).reshape(b, n, -1))


class TimmAxialRope(nn.Module):
    """timm's ``RotaryEmbeddingCat`` (rope-vit's theta 100, grid coordinates) on the patch tokens."""

    def __init__(self, grid: tuple[int, int]) -> None:
        super().__init__()
        self.rope = RotaryEmbeddingCat(DIM // HEADS, temperature=100, in_pixels=False, feat_shape=list(grid))

    def forward(self, q: Tensor, k: Tensor, coords: Coords) -> tuple[Tensor, Tensor]:
        emb, p = self.rope.get_embed(), coords.num_prefix_tokens  # (h * w, 2 * D)
        q = torch.cat([q[:, :, :p], apply_rot_embed_cat(q[:, :, p:], emb)], dim=2)
        k = torch.cat([k[:, :, :p], apply_rot_embed_cat(k[:, :, p:], emb)], dim=2)
        return q, k


class MmposAxialRope(nn.Module):
    def __init__(self, grid: tuple[int, int]) -> None:
        super().__init__()
        self.rope = mmpos.create("rope-axial", dim=DIM, num_heads=HEADS)

    def forward(self, q: Tensor, k: Tensor, coords: Coords) -> tuple[Tensor, Tensor]:
        return self.rope.rotate(q, k, coords)


def _variants(n: int) -> dict[str, tuple[nn.Module, str]]:
    """``{name: (module, "layer" | "rotate")}`` for token count ``n``."""
    grid, _ = SIZES[n]
    out: dict[str, tuple[nn.Module, str]] = {"sdpa": (Layer(None, grid), "layer")}
    for name in vision_encoders():
        out[name] = (Layer(name, grid), "layer")
    if "irpe-product-ctx-k" in out:
        out["naive irpe-product-ctx-k"] = (NaiveIRPELayer(out["irpe-product-ctx-k"][0]), "layer")
    if "rope-axial" in out:
        out["rotate q,k: mmpos rope-axial"] = (MmposAxialRope(grid), "rotate")
        out["rotate q,k: timm RotaryEmbeddingCat"] = (TimmAxialRope(grid), "rotate")
    return out


def _inputs(n: int, what: str, device: torch.device) -> tuple[tuple[Tensor, ...], Coords]:
    grid, batch = SIZES[n]
    coords = Coords.grid(*grid, num_prefix_tokens=1, device=device)
    g = torch.Generator(device="cpu").manual_seed(n)
    if what == "layer":
        return (torch.randn(batch, n, DIM, generator=g).to(device).requires_grad_(),), coords
    shape = (batch, HEADS, n, DIM // HEADS)
    return tuple(torch.randn(shape, generator=g).to(device).requires_grad_() for _ in range(2)), coords


def _step(module: nn.Module, what: str, xs: tuple[Tensor, ...], coords: Coords) -> None:
    out = module(*xs, coords)
    loss = out.square().mean() if what == "layer" else out[0].square().mean() + out[1].square().mean()
    loss.backward()
    for x in xs:
        x.grad = None
    module.zero_grad(set_to_none=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rss_peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def peak_mib(module: nn.Module, what: str, xs: tuple[Tensor, ...], coords: Coords, device: torch.device) -> float:
    """Peak memory of one step above what is allocated before it, MiB."""
    gc.collect()
    if device.type == "cuda":
        _sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        _step(module, what, xs, coords)
        _sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    before = _rss_kib()
    _step(module, what, xs, coords)
    return (_rss_peak_kib() - before) / 1024


def _prepare(n: int, device: torch.device) -> dict[str, tuple]:
    runs = {}
    for name, (module, what) in _variants(n).items():
        module.to(device).train()
        xs, coords = _inputs(n, what, device)
        _step(module, what, xs, coords)  # warm-up: caches, first-call allocations
        runs[name] = (module, what, xs, coords)
    return runs


def times_ms(n: int, device: torch.device, repeats: int) -> dict[str, float]:
    """``{variant: median ms}`` at ``n`` tokens, the variants taking turns step by step."""
    runs = _prepare(n, device)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (module, what, xs, coords) in runs.items():
            _sync(device)
            start = time.perf_counter()
            _step(module, what, xs, coords)
            _sync(device)
            times[name].append(1e3 * (time.perf_counter() - start))
    return {name: statistics.median(t) for name, t in times.items()}


def memory_mib(n: int, device: torch.device) -> dict[str, float]:
    """``{variant: peak MiB of one step}`` at ``n`` tokens."""
    return {name: peak_mib(*run, device) for name, run in _prepare(n, device).items()}


def cpu_memory_in_subprocess(threads: int) -> dict[int, dict[str, float]]:
    """:func:`memory_mib` on CPU in a fresh process where glibc maps every block >= 64 KiB.

    With ``MALLOC_MMAP_THRESHOLD_`` fixed, freed tensors go back to the system at once, so
    the rise of ``VmHWM`` during a step is the step's peak of live tensor memory.
    """
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(max(threads, 1))}
    cmd = [sys.executable, __file__, "--memory-json", "--threads", str(threads)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return {int(n): r for n, r in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def table(results: dict[int, dict[str, dict[str, float]]]) -> str:
    sizes = sorted(results)
    head = ["variant"] + [f"{c} N={n}" for n in sizes for c in ("ms", "x sdpa", "MiB", "MiB x sdpa")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in results[sizes[0]]:
        cells = [name]
        for n in sizes:
            r, ref = results[n][name], results[n]["sdpa"]
            mem_ratio = f"{r['mib'] / ref['mib']:.2f}" if ref["mib"] > 0 else "–"
            cells += [f"{r['ms']:.2f}", f"{r['ms'] / ref['ms']:.2f}", f"{r['mib']:.1f}", mem_ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s); load average {load} at the end of the run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (0: torch's default)")
    parser.add_argument(
        "--shared",
        default="shared with other jobs (about 8 engineers on 2 cores)",
        help="a note on the machine's other load, written into the report",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    parser.add_argument("--memory-json", action="store_true", help=argparse.SUPPRESS)  # the CPU memory subprocess
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads and device.type == "cpu":
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.memory_json:
        print(json.dumps({n: memory_mib(n, device) for n in SIZES}))
        return
    ms = {n: times_ms(n, device, args.repeats) for n in SIZES}
    mib = cpu_memory_in_subprocess(args.threads) if device.type == "cpu" else {n: memory_mib(n, device) for n in SIZES}
    results = {n: {name: {"ms": ms[n][name], "mib": mib[n][name]} for name in ms[n]} for n in SIZES}
    text = table(results)
    ratio = {n: results[n]["irpe-product-ctx-k"]["ms"] / results[n]["sdpa"]["ms"] for n in SIZES}
    verdict = ", ".join(f"{r:.2f}x at N={n}" for n, r in ratio.items())
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = "\n".join([
        "# Vision encoders: one attention layer against plain SDPA",
        "",
        (
            f"Generated by `python benchmarks/vision.py --device {args.device} --repeats {args.repeats} "
            f"--threads {args.threads}` on {stamp}."
        ),
        "",
        (
            f"Machine: {machine(device)}; {args.shared}. Times are medians of {args.repeats} interleaved "
            "steps; absolute numbers move with the load, the ratios (same run, same load) are what to read."
        ),
        "",
        f"Layer: dim {DIM}, {HEADS} heads of {DIM // HEADS}, one class token; batch "
        + ", ".join(f"{b} at N={n} ({g[0]}x{g[1]} grid)" for n, (g, b) in SIZES.items())
        + ". Forward + backward of the layer (input gradients included). `MiB`: peak memory of one step "
        + ("above the memory allocated before it (`torch.cuda.max_memory_allocated`)." if device.type == "cuda"
           else "above the resident set before it (rise of `VmHWM` in a process with "
           "`MALLOC_MMAP_THRESHOLD_=65536`, so freed tensors leave the resident set at once)."),
        "",
        text,
        "",
        f"iRPE `product-ctx-k` time relative to plain SDPA: {verdict} (target: at most 1.5x).",
        "",
    ])  # fmt: skip
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
