"""2D-TPE decoding with static caches, eager and under ``torch.compile``, against the dynamic caches.

One decode step (one new token after ``L`` cached ones, at ``layout.decode`` positions) of:

* the public layer ``mmpos.nn.TPEAttention(512, 8)`` with ``MultiOrderCache(capacity=L + steps)``
  (**layer-dynamic**: views of the ``T`` tokens held), ``MultiOrderCache(L + steps, static=True)``
  (**layer-static**: all slots, masked) and that static cache under
  ``torch.compile(fullgraph=True, dynamic=False)`` (**layer-static-compiled**, inductor);
* ``install_tpe`` on a one-layer transformers Llama (hidden 512, 8 heads of 64, as
  ``benchmarks/tables.py --hf``; the whole model call per step) with
  ``hf_tpe.PreallocatedCache(capacity=L + steps)`` (**hf-preallocated**),
  ``PreallocatedCache(L + steps, static=True)`` (**hf-static**) and that static cache with the model
  compiled (**hf-static-compiled**, inductor, ``fullgraph=True``, ``dynamic=False``; on transformers 4.57
  the step passes ``cache_position``, as ``generate`` does).

Each round prefills fresh caches (eager, not timed), then times the variants' steps interleaved step
by step; a round's mean step is one figure, the median over ``--repeats`` rounds is reported
(process CPU time on CPU). ``--room R`` gives every cache ``R`` slots more than ``L + steps`` (a
static cache sized for a longer generation than it holds; eagerly the static caches attend over the
filled slots only, compiled over all of them); ``--eager`` leaves the compiled variants out. The compiled variants compile in a warm-up round (time printed); the
script checks that the timed rounds add no graph (``error_on_recompile``) and that every variant's
logits / outputs equal the eager dynamic cache's.

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/tpe_static.py --lengths 1024 --repeats 5
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/tpe_static.py --lengths 1024 --room 3072 --eager
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch
from _env import header, load
from tables import DIM, HEADS, TABLES, clock, sync, table_layout

from mmpos import Coords
from mmpos.nn import MultiOrderCache, TPEAttention

LAYER = ("layer-dynamic", "layer-static", "layer-static-compiled")
HF = ("hf-preallocated", "hf-static", "hf-static-compiled")


class LayerBench:
    """The public layer, decoding from ``L`` cached tokens into a dynamic or a static cache."""

    def __init__(self, length: int, device: str, steps: int, room: int = 0, eager: bool = False) -> None:
        layout = table_layout(length)
        torch.manual_seed(0)
        self.layer = TPEAttention(DIM, HEADS).eval().to(device)
        self.compiled = torch.compile(self.layer, fullgraph=True, dynamic=False)
        self.coords = layout.order_coords.to(device)
        self.new = Coords(layout.decode(steps), self.coords.axes).to(device)  # (1, steps, 2)
        self.x = torch.randn(1, length + steps, DIM, device=device)
        self.length, self.steps, self.room, self.variants = length, steps, room, LAYER[:2] if eager else LAYER

    @torch.no_grad()
    def prefill(self, kind: str) -> MultiOrderCache:
        capacity = self.length + self.steps + self.room
        cache = MultiOrderCache(capacity) if kind == "layer-dynamic" else MultiOrderCache(capacity, static=True)
        self.layer(self.x[:, : self.length], self.coords, cache=cache)
        return cache

    @torch.no_grad()
    def step(self, kind: str, cache: MultiOrderCache, i: int) -> torch.Tensor:
        n = self.length + i
        coords = Coords(self.new.pos[:, i : i + 1], self.new.axes)
        layer = self.compiled if kind.endswith("compiled") else self.layer
        return layer(self.x[:, n : n + 1], coords, cache=cache)


class HFBench:
    """``install_tpe`` on a one-layer Llama, decoding into ``PreallocatedCache`` dynamic or static."""

    def __init__(self, length: int, device: str, steps: int, room: int = 0, eager: bool = False) -> None:
        import transformers

        from mmpos.integrations.hf_tpe import PreallocatedCache, install_tpe

        self.make = PreallocatedCache
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=DIM, intermediate_size=2 * DIM, num_hidden_layers=1,
            num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=2 * length + steps + room,
        )  # fmt: skip
        config._attn_implementation = "sdpa"
        torch.manual_seed(0)
        self.model = install_tpe(transformers.LlamaForCausalLM(config).eval().to(device), orders=2)
        self.compiled = torch.compile(self.model, fullgraph=True, dynamic=False)
        layout = table_layout(length)
        self.pos = layout.order_coords.pos.permute(2, 0, 1).long().to(device)  # (2, 1, L)
        self.new_pos = layout.decode(steps).permute(2, 0, 1).long().to(device)  # (2, 1, steps)
        self.ids = torch.randint(64, (1, length + steps), device=device)
        params = inspect.signature(self.model.forward).parameters
        self.name = "cache" if "cache" in params else "past_key_values"  # 5.x / 4.x
        self.positions = "cache_position" in params  # 4.x: passed, as generate does
        self.length, self.steps, self.room, self.device = length, steps, room, device
        self.variants = HF[:2] if eager else HF

    def _kw(self, cache, start: int, tokens: int) -> dict:
        kw = {self.name: cache, "use_cache": True}
        if self.positions:
            kw["cache_position"] = torch.arange(start, start + tokens, device=self.device)
        return kw

    @torch.no_grad()
    def prefill(self, kind: str):
        capacity = self.length + self.steps + self.room
        cache = self.make(capacity) if kind == "hf-preallocated" else self.make(capacity, static=True)
        self.model(self.ids[:, : self.length], tpe_positions=self.pos, **self._kw(cache, 0, self.length))
        return cache

    @torch.no_grad()
    def step(self, kind: str, cache, i: int) -> torch.Tensor:
        n = self.length + i
        model = self.compiled if kind.endswith("compiled") else self.model
        pos = self.new_pos[..., i : i + 1]
        return model(self.ids[:, n : n + 1], tpe_positions=pos, **self._kw(cache, n, 1)).logits


def measure(bench, device: str, repeats: int) -> dict[str, dict[str, float]]:
    dynamo = torch._dynamo
    dynamo.reset()
    dynamo.utils.counters.clear()
    kinds, steps = bench.variants, bench.steps
    times = {k: [] for k in kinds}
    compile_s = 0.0
    for r in range(repeats + 1):  # round 0 warms up (and compiles)
        caches = {k: bench.prefill(k) for k in kinds}
        spent = dict.fromkeys(kinds, 0.0)
        outs = {k: [] for k in kinds}
        with dynamo.config.patch(error_on_recompile=r > 0):  # the timed rounds run the warm-up's graph
            for i in range(steps):
                for k in kinds:  # interleaved step by step
                    sync(device)
                    t0, w0 = clock(device), time.perf_counter()
                    outs[k].append(bench.step(k, caches[k], i))
                    sync(device)
                    spent[k] += clock(device) - t0
                    if r == 0 and i == 0 and k.endswith("compiled"):
                        compile_s = time.perf_counter() - w0
        ref = torch.cat(outs[kinds[0]], 1)
        for k in kinds[1:]:  # every variant computes the dynamic cache's outputs
            diff = (torch.cat(outs[k], 1) - ref).abs().max().item()
            assert diff < 1e-4, f"{k} differs from {kinds[0]} by {diff}"
        if r:
            for k in kinds:
                times[k].append(spent[k] / steps)
        del caches
    graphs = dynamo.utils.counters["stats"]["unique_graphs"]
    out = {k: {"decode_ms": 1e3 * statistics.median(times[k])} for k in kinds}
    if kinds[-1].endswith("compiled"):
        out[kinds[-1]].update(compile_s=compile_s, graphs=graphs)
    return out


def table(results: dict[tuple[str, int], dict[str, dict[str, float]]]) -> str:
    lines = ["| L | variant | decode ms/token | x dynamic | x static eager | graphs | first compiled step s |"]
    lines.append("|" + "---|" * 7)
    for (_, length), res in results.items():
        kinds = list(res)
        base, static = res[kinds[0]]["decode_ms"], res[kinds[1]]["decode_ms"]
        for k, r in res.items():
            graphs = r.get("graphs", "-")
            first = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
            lines.append(
                f"| {length} | {k} | {r['decode_ms']:.3f} | {r['decode_ms'] / base:.2f} "
                f"| {r['decode_ms'] / static:.2f} | {graphs} | {first} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024], choices=list(TABLES))
    parser.add_argument("--steps", type=int, default=20, help="decode steps per round (from L cached tokens)")
    parser.add_argument("--only", choices=["layer", "hf"], default=None, help="one of the two benches")
    parser.add_argument("--room", type=int, default=0, help="slots every cache holds beyond L + steps")
    parser.add_argument("--eager", action="store_true", help="leave the compiled variants out")
    args = parser.parse_args()
    if args.repeats < 1 or args.steps < 1 or args.room < 0:
        parser.error("--repeats and --steps must be >= 1, --room >= 0")
    torch.set_num_threads(args.threads)
    modules = []
    if args.only != "layer":
        import transformers

        modules.append(transformers)
    note = f"median of {args.repeats} rounds, {args.steps} steps a round, capacity L + {args.steps + args.room}"
    before = header(args.device, *modules, note=note)
    results = {}
    for length in args.lengths:
        for name, bench in (("layer", LayerBench), ("hf", HFBench)):
            if args.only in (None, name):
                made = bench(length, args.device, args.steps, args.room, args.eager)
                results[name, length] = measure(made, args.device, args.repeats)
    print(before)
    print(f"<!-- after: {load()} -->")
    print(table(results))


if __name__ == "__main__":
    main()
