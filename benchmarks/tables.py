"""2D-TPE attention against one causal SDPA call, at L = 1024 and 4096 (a table filling the sequence).

Variants, on the same ``q``, ``k``, ``v`` ``(1, 8, L, 64)`` and hidden states ``(1, L, 512)``:

* ``sdpa``: one causal ``F.scaled_dot_product_attention`` call (no position encoding);
* ``rope``: 1-D RoPE on q / k, then that call (what a plain LLM layer does);
* ``2d-tpe``: :class:`mmpos.nn.TPEAttention`'s attention part -- RoPE per order (row-major,
  column-major), the row order attended directly, the column order permuted / attended /
  un-permuted (:func:`mmpos.nn.multi_order.multi_order_sdpa`), the router on the hidden states and
  the mix (:func:`mmpos.nn.multi_order.mix_orders`);
* ``causal-layer`` / ``tpe-layer``: whole layers, as users call them: a plain causal RoPE layer
  (q/k/v and output projections, one causal SDPA call) and the public :class:`mmpos.nn.TPEAttention`
  on the coordinates ``table.build`` returns (its all-real mask attached; the layer then takes the
  ``is_causal`` path); ``tpe-layer`` is reported against ``causal-layer`` (train step only).

Measured: forward + backward of a training step; one decoding step (one new query against a
KV cache of ``L`` tokens; 2D-TPE keeps ``K`` rotated keys per token, plain RoPE one); the peak
memory of a training step and the KV-cache bytes. Targets from the issue: 2D-TPE at most 2.3x
the time of the SDPA call with two orders, its KV cache at most 1.5x.

Time: median of ``--repeats`` steps, the variants interleaved step by step so that a shared
machine's load hits them alike; process CPU time on CPU (``--threads``, default 1), wall time on
CUDA. Peak memory: on CUDA ``max_memory_allocated`` above the inputs; on CPU the rise of the
resident-set high-water mark during one step (``VmHWM``, reset through ``/proc/self/clear_refs``).

    python benchmarks/tables.py [--device cpu|cuda] [--repeats 5] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from _memory import peak_mib

from mmpos.layout import Text
from mmpos.nn import TPEAttention
from mmpos.nn.multi_order import TPERouter, mix_orders, multi_order_sdpa
from mmpos.rotary import apply_rotary, rope_frequencies
from mmpos.table import Table, build

HEADS, HEAD_DIM = 8, 64
DIM = HEADS * HEAD_DIM
TABLES = {1024: (31, 32), 4096: (63, 64)}  # L -> (table side, text tokens): side * (side + 1) + text = L
VARIANTS = ("sdpa", "rope", "2d-tpe", "causal-layer", "tpe-layer")
LAYERS = ("causal-layer", "tpe-layer")  # whole attention layers (projections included), train step only


def layout_coords(length: int, device: str):
    """The order coordinates of text + a square table + text, as ``table.build`` returns them (mask attached)."""
    side, text = TABLES[length]
    table = Table.grid(side, side, col_sep=0, rule_rows=False)
    layout = build([[Text(text // 2), table, Text(text - text // 2)]], ("row", "col"))
    assert layout.order_coords.num_tokens == length
    return layout.order_coords.to(device)


def positions(length: int, device: str) -> torch.Tensor:
    """``(2, 1, L)`` row-major and column-major positions of text + a square table + text."""
    return layout_coords(length, device).pos.permute(2, 0, 1)


def _rot(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    ang = pos.unsqueeze(-1) * inv_freq  # (1, L, P)
    return apply_rotary(x, ang.cos(), ang.sin())


class Bench:
    def __init__(self, length: int, device: str) -> None:
        torch.manual_seed(0)
        self.device = device
        self.pos = positions(length, device)
        self.inv_freq = rope_frequencies(HEAD_DIM // 2).to(device)
        self.router = TPERouter(HEAD_DIM, 2).to(device)
        shape = (1, HEADS, length, HEAD_DIM)
        self.q, self.k, self.v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
        self.h = torch.randn(1, length, DIM, device=device, requires_grad=True)
        # decoding: one new token against a cache of L tokens
        self.q1 = torch.randn(1, HEADS, 1, HEAD_DIM, device=device)
        self.h1 = torch.randn(1, 1, DIM, device=device)
        self.cache_k = torch.randn(2, 1, HEADS, length, HEAD_DIM, device=device)  # one key per order
        self.cache_v = torch.randn(1, HEADS, length, HEAD_DIM, device=device)
        # whole layers: the public TPEAttention called as users call it (coords from table.build, mask
        # attached), against a plain causal RoPE layer with the same projections
        self.coords = layout_coords(length, device)
        self.tpe = TPEAttention(DIM, HEADS).to(device)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM, bias=False).to(device)
        self.out = torch.nn.Linear(DIM, DIM, bias=False).to(device)

    def forward(self, variant: str) -> torch.Tensor:
        if variant == "tpe-layer":
            return self.tpe(self.h, self.coords)
        if variant == "causal-layer":
            q, k, v = self.qkv(self.h).view(1, -1, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
            p = self.pos[0]
            o = F.scaled_dot_product_attention(_rot(q, p, self.inv_freq), _rot(k, p, self.inv_freq), v, is_causal=True)
            return self.out(o.transpose(1, 2).reshape(1, -1, DIM))
        q, k, v = self.q, self.k, self.v
        if variant == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if variant == "rope":
            p = self.pos[0]
            return F.scaled_dot_product_attention(
                _rot(q, p, self.inv_freq), _rot(k, p, self.inv_freq), v, is_causal=True
            )
        qs = [_rot(q, p, self.inv_freq) for p in self.pos]
        ks = [_rot(k, p, self.inv_freq) for p in self.pos]
        out = multi_order_sdpa(qs, ks, v, self.pos, None, True, (True, False))
        return mix_orders(out, self.router(self.h))

    def train_step(self, variant: str) -> None:
        self.forward(variant).square().mean().backward()

    @torch.no_grad()
    def decode_step(self, variant: str) -> torch.Tensor:
        if variant == "2d-tpe":
            outs = torch.stack(
                [F.scaled_dot_product_attention(self.q1, self.cache_k[i], self.cache_v) for i in range(2)]
            )
            return mix_orders(outs, self.router(self.h1))
        return F.scaled_dot_product_attention(self.q1, self.cache_k[0], self.cache_v)

    def cache_bytes(self, variant: str) -> int:
        keys = self.cache_k if variant == "2d-tpe" else self.cache_k[0]
        return keys.nbytes + self.cache_v.nbytes

    def zero(self) -> None:
        for t in (self.q, self.k, self.v, self.h):
            t.grad = None
        for m in (self.router, self.tpe, self.qkv, self.out):
            m.zero_grad(set_to_none=True)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def clock(device: str) -> float:
    return time.perf_counter() if device == "cuda" else time.process_time()


def peak_memory(bench: Bench, variant: str) -> float:
    """Extra peak memory (MiB) of one forward + backward step, after a warm-up step."""
    bench.train_step(variant)
    bench.zero()
    peak = peak_mib(lambda: bench.train_step(variant), bench.device)
    bench.zero()
    return peak


def measure(length: int, device: str, repeats: int) -> dict[str, dict[str, float]]:
    bench = Bench(length, device)
    train = {v: [] for v in VARIANTS}
    decode = {v: [] for v in VARIANTS}
    for v in VARIANTS:  # warm-up
        bench.train_step(v)
        if v not in LAYERS:
            bench.decode_step(v)
        bench.zero()
    for _ in range(repeats):
        for v in VARIANTS:
            sync(device)
            t0 = clock(device)
            bench.train_step(v)
            sync(device)
            train[v].append(clock(device) - t0)
            bench.zero()
            if v in LAYERS:
                continue
            t0 = clock(device)
            for _ in range(20):
                bench.decode_step(v)
            sync(device)
            decode[v].append((clock(device) - t0) / 20)
    out = {}
    for v in VARIANTS:
        out[v] = {
            "train_ms": 1e3 * statistics.median(train[v]),
            "decode_ms": 1e3 * statistics.median(decode[v]) if decode[v] else None,
            "peak_mib": peak_memory(bench, v),
            "cache_mib": bench.cache_bytes(v) / 2**20 if v not in LAYERS else None,
        }
    return out


def table(results: dict[int, dict[str, dict[str, float]]]) -> str:
    head = "| L | variant | fwd+bwd ms | x sdpa | decode ms | x sdpa | peak MiB | x sdpa | KV cache MiB | x sdpa |"
    lines = [head, "|" + "---|" * 10]
    for length, res in results.items():
        for v, r in res.items():
            base = res["causal-layer" if v in LAYERS else "sdpa"]  # layers against the plain causal layer
            if v in LAYERS:
                lines.append(
                    f"| {length} | {v} | {r['train_ms']:.1f} | {r['train_ms'] / base['train_ms']:.2f} (x causal-layer) "
                    f"| - | - | {r['peak_mib']:.0f} | {r['peak_mib'] / max(base['peak_mib'], 1e-9):.2f} | - | - |"
                )
                continue
            lines.append(
                f"| {length} | {v} | {r['train_ms']:.1f} | {r['train_ms'] / base['train_ms']:.2f} | "
                f"{r['decode_ms']:.3f} | {r['decode_ms'] / base['decode_ms']:.2f} | {r['peak_mib']:.0f} | "
                f"{r['peak_mib'] / max(base['peak_mib'], 1e-9):.2f} | {r['cache_mib']:.1f} | "
                f"{r['cache_mib'] / base['cache_mib']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    torch.set_num_threads(args.threads)
    results = {n: measure(n, args.device, args.repeats) for n in args.lengths}
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{stamp}, torch {torch.__version__}, {platform.processor() or platform.machine()}, device {args.device}, "
          f"threads {args.threads}, repeats {args.repeats}")  # fmt: skip
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": stamp, "device": args.device, "threads": args.threads, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
