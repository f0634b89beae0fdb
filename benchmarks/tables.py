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

Measured: forward + backward of a training step (every variant); decoding (the two layers): the
layers as users decode with them -- ``TPEAttention(h, coords, cache=MultiOrderCache())`` after a
prefill of the ``L`` tokens of ``table.build``'s coordinates (mask attached), one new token per
step at ``layout.decode`` positions, against the plain causal RoPE layer with a preallocated KV
cache (``causal-layer``: one new key / value written per step, one SDPA call over the cache);
``tpe-layer-cat`` is the same public layer with the cache that concatenated all keys each step
(the library's cache before it was preallocated), for the before / after figure. A decode
round is ``--steps`` steps from ``L`` cached tokens (the caches are cropped back to ``L`` before
each round). Also the peak memory of a training step and of a decode step, and the KV-cache
bytes. Targets from the issue: the public layer at most 2.3x the plain causal layer (train step,
L = 4096), decoding at most 2x; the KV cache at most 1.5x.

Time: median of ``--repeats`` rounds, the variants interleaved round by round so that a shared
machine's load hits them alike; process CPU time on CPU (``--threads``, default 1), wall time on
CUDA; glibc's default allocator (peak memory is measured after all timings). Peak memory: on
CUDA ``max_memory_allocated`` above the inputs; on CPU the rise of the resident-set high-water
mark during one step (``VmHWM``, reset through ``/proc/self/clear_refs``; large blocks mapped
for that measurement only, ``_memory.map_large_blocks``).

``--hf``: decoding through :func:`mmpos.integrations.hf_tpe.install_tpe` on a one-layer transformers
Llama (hidden 512, 8 heads of 64, ``sdpa``; the whole ``LlamaForCausalLM`` call, vocabulary 64): a
prefill of the ``L`` tokens (``tpe_positions`` = the order coordinates of ``table.build``), then one
token a step into transformers' default ``DynamicCache`` (``hf-dynamic``: concatenates every cached
key a step), :class:`mmpos.integrations.hf_tpe.PreallocatedCache` ``(capacity=L + steps)``
(``hf-preallocated``) and, where its layers size keys and values apart (transformers 5),
``StaticCache(max_cache_len=L + steps)`` (``hf-static``); the reference: the same Llama without 2D-TPE
(sequential positions) with its ``DynamicCache`` (``hf-plain``) and a ``StaticCache`` (``hf-plain-static``).
Each round prefills fresh caches (not timed), then times the caches' steps interleaved step by step;
decode peak memory of one step from ``L + 1`` cached tokens.

    python benchmarks/tables.py [--device cpu|cuda] [--repeats 5] [--threads 1] [--json out.json] [--hf]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from _env import header, load
from _memory import map_large_blocks, peak_mib

from mmpos.coords import Coords
from mmpos.layout import Text
from mmpos.nn import MultiOrderCache, TPEAttention
from mmpos.nn.multi_order import TPERouter, mix_orders, multi_order_sdpa
from mmpos.rotary import apply_rotary, rope_frequencies
from mmpos.table import Table, TableLayout, build

HEADS, HEAD_DIM = 8, 64
DIM = HEADS * HEAD_DIM
TABLES = {1024: (31, 32), 4096: (63, 64)}  # L -> (table side, text tokens): side * (side + 1) + text = L
VARIANTS = ("sdpa", "rope", "2d-tpe", "causal-layer", "tpe-layer")
LAYERS = ("causal-layer", "tpe-layer")  # whole attention layers (projections included)
DECODERS = ("causal-layer", "tpe-layer", "tpe-layer-cat")  # cached decoding, one token a step


def table_layout(length: int) -> TableLayout:
    """Text + a square table + text, as ``table.build`` returns it (mask attached)."""
    side, text = TABLES[length]
    table = Table.grid(side, side, col_sep=0, rule_rows=False)
    layout = build([[Text(text // 2), table, Text(text - text // 2)]], ("row", "col"))
    assert layout.order_coords.num_tokens == length
    return layout


def layout_coords(length: int, device: str) -> Coords:
    """The order coordinates of :func:`table_layout` on ``device``."""
    return table_layout(length).order_coords.to(device)


class CatCache(MultiOrderCache):
    """The library's cache before preallocation: every update concatenates all cached keys (``O(T)`` a step)."""

    def update(self, keys, values, pos, mask) -> None:
        if self.length == 0:
            self._keys, self._values, self._pos, self._mask = keys, values, pos, mask
        else:
            t = self.length
            self._keys = torch.cat([self._keys[:, :, :, :t], keys], dim=3)
            self._values = torch.cat([self._values[:, :, :t], values], dim=2)
            self._pos = torch.cat([self._pos[:, :, :t], pos], dim=2)
            self._mask = torch.cat([self._mask[:, :t], mask], dim=1)
        self.length = self._values.shape[2]


class CausalLayer(torch.nn.Module):
    """A plain causal RoPE attention layer (q/k/v and output projections) with a preallocated KV cache."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = torch.nn.Linear(DIM, DIM, bias=False)
        self.register_buffer("inv_freq", rope_frequencies(HEAD_DIM // 2), persistent=False)
        self.register_buffer("k_cache", torch.zeros(1, HEADS, capacity, HEAD_DIM), persistent=False)
        self.register_buffer("v_cache", torch.zeros(1, HEADS, capacity, HEAD_DIM), persistent=False)
        self.length = 0

    def forward(self, h: torch.Tensor, pos: torch.Tensor, cache: bool = False) -> torch.Tensor:
        """``h`` ``(1, n, DIM)``, ``pos`` ``(1, n)``; with ``cache`` the new keys are appended to the cache."""
        n = h.shape[1]
        q, k, v = self.qkv(h).view(1, n, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
        q, k = _rot(q, pos, self.inv_freq), _rot(k, pos, self.inv_freq)
        if cache:
            t = self.length
            self.k_cache[:, :, t : t + n] = k
            self.v_cache[:, :, t : t + n] = v
            self.length = t + n
            if t:  # decoding: the new tokens see the cache and, causally, each other (one token: everything)
                k, v = self.k_cache[:, :, : t + n], self.v_cache[:, :, : t + n]
                o = F.scaled_dot_product_attention(q, k, v)
                return self.out(o.transpose(1, 2).reshape(1, n, DIM))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(1, n, DIM))


def positions(length: int, device: str) -> torch.Tensor:
    """``(2, 1, L)`` row-major and column-major positions of text + a square table + text."""
    return layout_coords(length, device).pos.permute(2, 0, 1)


def _rot(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    ang = pos.unsqueeze(-1) * inv_freq  # (1, L, P)
    return apply_rotary(x, ang.cos(), ang.sin())


class Bench:
    def __init__(self, length: int, device: str, steps: int = 20) -> None:
        torch.manual_seed(0)
        self.device = device
        self.pos = positions(length, device)
        self.inv_freq = rope_frequencies(HEAD_DIM // 2).to(device)
        self.router = TPERouter(HEAD_DIM, 2).to(device)
        shape = (1, HEADS, length, HEAD_DIM)
        self.q, self.k, self.v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
        self.h = torch.randn(1, length, DIM, device=device, requires_grad=True)
        # whole layers: the public TPEAttention called as users call it (coords from table.build, mask
        # attached), against a plain causal RoPE layer with the same projections
        self.length, self.steps = length, steps
        layout = table_layout(length)
        self.coords = layout.order_coords.to(device)
        self.tpe = TPEAttention(DIM, HEADS).to(device)
        self.causal = CausalLayer(length + steps).to(device)
        self.qkv, self.out = self.causal.qkv, self.causal.out
        # decoding: a prefill of the L tokens, then `steps` new tokens at layout.decode's positions
        self.new_h = torch.randn(steps, 1, 1, DIM, device=device)
        new_pos = layout.decode(steps).to(device)  # (1, steps, 2): equal under both orders
        self.new_coords = [Coords(new_pos[:, i : i + 1], self.coords.axes) for i in range(steps)]
        self.new_pos = new_pos[..., 0]  # (1, steps): the plain layer's positions
        self.caches = {"tpe-layer": MultiOrderCache(), "tpe-layer-cat": CatCache()}
        with torch.no_grad():
            h = torch.randn(1, length, DIM, device=device)
            self.causal(h, self.pos[0], cache=True)
            for cache in self.caches.values():
                self.tpe(h, self.coords, cache=cache)

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

    def crop(self) -> None:
        """Back to the ``L`` prefilled tokens (before a decode round)."""
        self.causal.length = self.length
        for cache in self.caches.values():
            cache.crop(self.length)

    @torch.no_grad()
    def decode_step(self, variant: str, i: int) -> torch.Tensor:
        """Decode step ``i`` of a round (after :meth:`crop`): one new token through the layer."""
        if variant == "causal-layer":
            return self.causal(self.new_h[i], self.new_pos[:, i : i + 1], cache=True)
        return self.tpe(self.new_h[i], self.new_coords[i], cache=self.caches[variant])

    def decode_round(self, variant: str) -> None:
        for i in range(self.steps):
            self.decode_step(variant, i)

    def cache_bytes(self, variant: str) -> int:
        if variant == "causal-layer":
            return 2 * self.causal.k_cache[:, :, : self.length].nbytes
        cache = self.caches[variant]
        return sum(t.nbytes for t in (cache.keys[:, :, :, : self.length], cache.values[:, :, : self.length]))

    def zero(self) -> None:
        for t in (self.q, self.k, self.v, self.h):
            t.grad = None
        for m in (self.router, self.tpe, self.causal):
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


def decode_peak(bench: Bench, variant: str) -> float:
    """Extra peak memory (MiB) of one decode step from ``L`` cached tokens, after a warm-up step."""
    bench.crop()
    bench.decode_step(variant, 0)
    bench.crop()
    return peak_mib(lambda: bench.decode_step(variant, 0), bench.device)


def measure(length: int, device: str, repeats: int, steps: int) -> dict[str, dict[str, float]]:
    bench = Bench(length, device, steps)
    train = {v: [] for v in VARIANTS}
    decode = {v: [] for v in DECODERS}
    for v in VARIANTS:  # warm-up
        bench.train_step(v)
        bench.zero()
    for v in DECODERS:
        bench.crop()
        bench.decode_round(v)
    for _ in range(repeats):
        for v in VARIANTS:
            sync(device)
            t0 = clock(device)
            bench.train_step(v)
            sync(device)
            train[v].append(clock(device) - t0)
            bench.zero()
        for v in DECODERS:
            bench.crop()
            sync(device)
            t0 = clock(device)
            bench.decode_round(v)
            sync(device)
            decode[v].append((clock(device) - t0) / steps)
    if device == "cpu":
        map_large_blocks()  # after the timings: the resident set then follows live memory
    out = {}
    for v in (*VARIANTS, "tpe-layer-cat"):
        out[v] = {
            "train_ms": 1e3 * statistics.median(train[v]) if v in train else None,
            "peak_mib": peak_memory(bench, v) if v in train else None,
            "decode_ms": 1e3 * statistics.median(decode[v]) if v in decode else None,
            "decode_peak_mib": decode_peak(bench, v) if v in decode else None,
            "cache_mib": bench.cache_bytes(v) / 2**20 if v in decode else None,
        }
    return out


HF_CACHES = ("hf-dynamic", "hf-preallocated", "hf-static", "hf-plain", "hf-plain-static")


class HFBench:
    """``install_tpe`` on a one-layer Llama, decoding from ``L`` cached tokens into each cache kind."""

    def __init__(self, length: int, device: str, steps: int) -> None:
        import inspect

        import transformers

        from mmpos.integrations.hf_tpe import PreallocatedCache, install_tpe

        self.transformers, self.make_preallocated = transformers, PreallocatedCache
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=DIM, intermediate_size=2 * DIM, num_hidden_layers=1,
            num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=2 * length + steps,
        )  # fmt: skip
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        self.model = install_tpe(transformers.LlamaForCausalLM(config).eval().to(device), orders=2)
        torch.manual_seed(0)
        self.plain = transformers.LlamaForCausalLM(config).eval().to(device)  # the same model without 2D-TPE
        self.config, self.length, self.steps, self.device = config, length, steps, device
        layout = table_layout(length)
        self.pos = layout.order_coords.pos.permute(2, 0, 1).long().to(device)  # (2, 1, L)
        self.new_pos = layout.decode(steps).permute(2, 0, 1).long().to(device)  # (2, 1, steps)
        self.ids = torch.randint(64, (1, length + steps), device=device)
        params = inspect.signature(self.model.forward).parameters
        self.name = "cache" if "cache" in params else "past_key_values"  # 5.x / 4.x
        static = getattr(transformers.cache_utils, "StaticLayer", None)
        apart = static is not None and "value_states" in inspect.signature(static.lazy_initialization).parameters
        self.caches = tuple(k for k in HF_CACHES if apart or k != "hf-static")

    def _new(self, kind: str):
        if kind in ("hf-dynamic", "hf-plain"):
            return None  # the model's own (DynamicCache)
        if kind == "hf-preallocated":
            return self.make_preallocated(capacity=self.length + self.steps)
        return self.transformers.StaticCache(config=self.config, max_cache_len=self.length + self.steps)

    @torch.no_grad()
    def prefill(self, kind: str):
        cache = self._new(kind)
        extra = {} if cache is None else {self.name: cache}
        if kind.startswith("hf-plain"):  # sequential positions (the model's own)
            return self.plain(self.ids[:, : self.length], use_cache=True, **extra).past_key_values
        out = self.model(self.ids[:, : self.length], tpe_positions=self.pos, use_cache=True, **extra)
        return out.past_key_values

    @torch.no_grad()
    def step(self, kind: str, cache, i: int) -> torch.Tensor:
        n = self.length + i
        new = self.ids[:, n : n + 1]
        if kind.startswith("hf-plain"):
            return self.plain(new, use_cache=True, **{self.name: cache}).logits
        return self.model(new, tpe_positions=self.new_pos[..., i : i + 1], use_cache=True, **{self.name: cache}).logits


def hf_measure(length: int, device: str, repeats: int, steps: int) -> dict[str, dict[str, float]]:
    bench = HFBench(length, device, steps)
    times = {k: [] for k in bench.caches}
    for r in range(repeats + 1):  # round 0 warms up
        caches = {k: bench.prefill(k) for k in bench.caches}
        spent = dict.fromkeys(bench.caches, 0.0)
        for i in range(steps):
            for k in bench.caches:  # interleaved step by step
                sync(device)
                t0 = clock(device)
                bench.step(k, caches[k], i)
                sync(device)
                spent[k] += clock(device) - t0
        if r:
            for k in bench.caches:
                times[k].append(spent[k] / steps)
        del caches
    if device == "cpu":
        map_large_blocks()
    out = {}
    for k in bench.caches:
        cache = bench.prefill(k)
        bench.step(k, cache, 0)  # warm-up step; the peak is one step from L + 1 cached tokens
        out[k] = {
            "decode_ms": 1e3 * statistics.median(times[k]),
            "decode_peak_mib": peak_mib(lambda k=k, c=cache: bench.step(k, c, 1), device),
        }
        del cache
    return out


def hf_table(results: dict[int, dict[str, dict[str, float]]]) -> str:
    lines = ["| L | cache | decode ms/token | x hf-dynamic | x hf-plain | decode peak MiB |", "|" + "---|" * 6]
    for length, res in results.items():
        base, plain = res["hf-dynamic"]["decode_ms"], res["hf-plain"]["decode_ms"]
        for k, r in res.items():
            lines.append(
                f"| {length} | {k} | {r['decode_ms']:.3f} | {_ratio(r['decode_ms'], base)} "
                f"| {_ratio(r['decode_ms'], plain)} | {r['decode_peak_mib']:.2f} |"
            )
    return "\n".join(lines)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _ratio(value: float | None, base: float | None) -> str:
    return "-" if value is None or base is None else f"{value / max(base, 1e-9):.2f}"


def table(results: dict[int, dict[str, dict[str, float]]]) -> str:
    """Kernel rows against ``sdpa``; layer rows against ``causal-layer``."""
    head = (
        "| L | variant | fwd+bwd ms | x base | train peak MiB | x base | decode ms/token | x causal-layer "
        "| decode peak MiB | KV cache MiB | x causal-layer |"
    )
    lines = [head, "|" + "---|" * 11]
    for length, res in results.items():
        for v, r in res.items():
            base = res["sdpa" if v in ("sdpa", "rope", "2d-tpe") else "causal-layer"]
            dec = res["causal-layer"]
            lines.append(
                f"| {length} | {v} | {_cell(r['train_ms'], '.1f')} | {_ratio(r['train_ms'], base['train_ms'])} "
                f"| {_cell(r['peak_mib'], '.0f')} | {_ratio(r['peak_mib'], base['peak_mib'])} "
                f"| {_cell(r['decode_ms'], '.3f')} | {_ratio(r['decode_ms'], dec['decode_ms'])} "
                f"| {_cell(r['decode_peak_mib'], '.2f')} | {_cell(r['cache_mib'], '.1f')} "
                f"| {_ratio(r['cache_mib'], dec['cache_mib'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--steps", type=int, default=20, help="decode steps per round (from L cached tokens)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--hf", action="store_true", help="decoding through install_tpe on a transformers Llama")
    args = parser.parse_args()
    if args.repeats < 1 or args.steps < 1:
        parser.error("--repeats and --steps must be >= 1")
    torch.set_num_threads(args.threads)
    if args.hf:
        import transformers

        before = header(args.device, transformers, note=f"median of {args.repeats} rounds, {args.steps} steps a round")
        results = {n: hf_measure(n, args.device, args.repeats, args.steps) for n in args.lengths}
        print(before)
        print(f"<!-- after: {load()} -->")
        print(hf_table(results))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"header": before, "device": args.device, "hf": results}, f, indent=1)
        return
    before = header(args.device, note=f"median of {args.repeats} rounds, {args.steps} decode steps a round")
    results = {n: measure(n, args.device, args.repeats, args.steps) for n in args.lengths}
    print(before)
    print(f"<!-- after: {load()} -->")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"header": before, "device": args.device, "threads": args.threads, "results": results}, f, indent=1
            )


if __name__ == "__main__":
    main()
