"""iRPE ``product-ctx-k`` against plain SDPA and a naive O(N^2 D) implementation.

One attention layer (``mmpos.nn.Attention``: projections + attention), forward and
backward, at N = 197 (14 x 14 + class token) and N = 1025 (32 x 32 + class token):

* ``sdpa``: no position encoder (``F.scaled_dot_product_attention``, fused kernel);
* ``irpe``: ``product-ctx-k`` through the bias hook (gather from ``(B, H, N, 50)``);
* ``naive``: the same encoding with every pair's vector materialised, ``(N, N, D)``,
  and contracted with q by ``einsum`` (what the paper's Eq. (4) says literally);
* ``irpe-sdpa``: the same encoding through the general bias path: ``enc.bias`` forms the
  ``(B, H, N, N)`` bias and ``F.scaled_dot_product_attention`` takes it as a float mask
  that needs a gradient (on CPU: the math kernel). ``irpe`` on CPU runs
  ``mmpos.nn._biased_sdpa`` instead;
* ``sdpa-mask``: plain SDPA with a constant ``(B, H, N, N)`` float mask (no gradient):
  the fused kernels reading a bias, the floor of any attention that reads a formed bias.

Time: median of ``--repeats`` steps, the variants interleaved step by step so that a
shared machine's load hits them alike; process CPU time on CPU, wall time on CUDA.
Peak memory: on CUDA ``max_memory_allocated`` above the inputs and weights; on CPU the
rise of the peak resident set during one step (``VmHWM`` of ``/proc/self/status``, reset
through ``/proc/self/clear_refs``, with glibc mapping every block of 64 KiB or more).

With ``--reference PATH`` (a checkout of microsoft/Cream, or its ``iRPE/DeiT-with-iRPE``
folder; nothing of it is copied here) the script also times the reference's ``RPEAttention``
against ``mmpos.nn.Attention`` with the same iRPE at DeiT-Ti width (dim 192, 3 heads, product
method, ratio 1.9, shared head, class token skipped), contextual mode on keys (``ctx-k``) and
on queries, keys and values (``ctx-qkv``), N = 197 and 1025, forward + backward, the six
variants (each side plain, ctx-k, ctx-qkv) interleaved step by step. The reference's
``RPEAttention`` with ``rpe_config=None`` is its plain attention. Weights are copied from the
reference layer into the mmpos layer and the outputs compared before timing. The reference
imports ``easydict``; a minimal stand-in (a dict with attribute access) is registered when it
is not installed, and its optional ``rpe_ops`` extension is used when the checkout has it built.

    python benchmarks/irpe.py [--device cpu|cuda] [--repeats 7] [--threads 1] [--reference PATH]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import torch
from _memory import map_large_blocks, peak_mib

import mmpos
from mmpos import Coords
from mmpos.nn import Attention

DIM, HEADS = 384, 6  # DeiT-S
SIZES = {197: ((14, 14), 8), 1025: ((32, 32), 2)}  # N -> (grid, batch)
VARIANTS = ("sdpa", "irpe", "naive", "irpe-sdpa", "sdpa-mask")


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
        ids = self.enc.table_ids(coords.grid_shape, coords.num_prefix_tokens)[0].to(x.device)  # (N, N)
        pair = self.enc.k_table[0].T[ids]  # (N, N, D): r(i, j)
        logits = q @ k.transpose(-2, -1) + torch.einsum("bhid,ijd->bhij", q, pair)
        out = logits.softmax(-1) @ v
        return layer.proj(out.transpose(1, 2).reshape(b, n, -1))


class MaskedSDPA(torch.nn.Module):
    """The layer with a float mask given to ``F.scaled_dot_product_attention``: the iRPE bias
    (``enc.bias``, needs a gradient) or, without an encoder, a constant one."""

    def __init__(self, layer: Attention, n: int, batch: int) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("constant", 0.02 * torch.randn(batch, HEADS, n, n) if not layer.encoders else None)

    def forward(self, x: torch.Tensor, coords: Coords) -> torch.Tensor:
        layer, b, n = self.layer, x.shape[0], x.shape[1]
        q = layer.q(x).view(b, n, HEADS, -1).transpose(1, 2)
        k, v = layer.kv(x).view(b, n, 2, HEADS, -1).permute(2, 0, 3, 1, 4)
        mask = self.constant if self.constant is not None else layer.encoders[0].bias(q, k, coords)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return layer.proj(out.transpose(1, 2).reshape(b, n, -1))


def build(variant: str, n: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    grid, batch = SIZES[n]
    if variant in ("sdpa", "sdpa-mask"):
        layer = Attention(DIM, HEADS)
        return (layer if variant == "sdpa" else MaskedSDPA(layer, n, batch)).to(device)
    enc = mmpos.create("irpe-product-ctx-k", dim=DIM, num_heads=HEADS, grid_size=grid)
    torch.nn.init.normal_(enc.k_table, std=0.02)
    layer = Attention(DIM, HEADS, encoders=[enc])
    wrapped = {"irpe": layer, "naive": NaiveIRPE(layer), "irpe-sdpa": MaskedSDPA(layer, n, batch)}[variant]
    return wrapped.to(device)


def inputs(n: int, device: str) -> tuple[torch.Tensor, Coords]:
    grid, batch = SIZES[n]
    x = torch.randn(batch, n, DIM, device=device, requires_grad=True)
    return x, Coords.grid(*grid, num_prefix_tokens=1, device=device)


def step(model: torch.nn.Module, x: torch.Tensor, coords: Coords) -> None:
    model(x, coords).square().mean().backward()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_memory(variant: str, n: int, device: str) -> float:
    """Extra peak memory (MiB) of one forward + backward step, after a warm-up step."""
    model, (x, coords) = build(variant, n, device), inputs(n, device)
    step(model, x, coords)
    model.zero_grad(set_to_none=True)
    x.grad = None
    return peak_mib(functools.partial(step, model, x, coords), device)


def times(n: int, device: str, repeats: int) -> dict[str, float]:
    """Median seconds per forward + backward step, variants interleaved (:func:`interleaved_medians`)."""
    models = {v: build(v, n, device) for v in VARIANTS}
    x, coords = inputs(n, device)
    with torch.no_grad():  # the naive, the general and the gathered versions compute the same layer
        for other in ("naive", "irpe-sdpa"):
            torch.testing.assert_close(models[other](x, coords), models["irpe"](x, coords), rtol=1e-4, atol=1e-5)
    return interleaved_medians(models, x, coords, device, repeats)


def interleaved_medians(models: dict, x: torch.Tensor, coords: Coords, device: str, repeats: int) -> dict:
    """Median seconds per forward + backward step of each model, the models taking turns in each round.

    CPU: process CPU time, which a machine shared with other jobs inflates far less than
    wall time (with one thread it is the step's compute time); CUDA: wall time, synchronised.
    """
    clock = time.perf_counter if device == "cuda" else time.process_time
    samples: dict = {key: [] for key in models}
    for i in range(repeats + 1):
        for key, model in models.items():
            sync(device)
            start = clock()
            step(model, x, coords)
            sync(device)
            if i:  # the first round warms up
                samples[key].append(clock() - start)
    return {key: statistics.median(s) for key, s in samples.items()}


# ------------------------------------------------------------ against the reference (Cream)
TINY_DIM, TINY_HEADS = 192, 3  # DeiT-Ti
REFERENCE_MODES = {"plain": None, "ctx-k": "k", "ctx-qkv": "qkv"}


def load_reference(path: str) -> types.ModuleType:
    """Import ``rpe_vision_transformer`` (and its ``irpe``) from a Cream checkout at ``path``."""
    root = Path(path).expanduser()
    folder = root / "iRPE" / "DeiT-with-iRPE" if (root / "iRPE").is_dir() else root
    if not (folder / "rpe_vision_transformer.py").is_file():
        raise SystemExit(f"--reference: no rpe_vision_transformer.py in {folder} (give a microsoft/Cream checkout)")
    try:
        import easydict  # noqa: F401
    except ImportError:  # the reference builds its configs with EasyDict: a dict with attribute access

        class _AttrDict(dict):
            __getattr__ = dict.__getitem__
            __setattr__ = dict.__setitem__

        sys.modules["easydict"] = types.SimpleNamespace(EasyDict=_AttrDict)
    sys.path.insert(0, str(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "rpe_ops is not built", timm deprecations
        import irpe as cream_irpe
        import rpe_vision_transformer as cream

    cream.built_rpe_ops = cream_irpe.RPEIndexFunction is not None
    cream.irpe_module = cream_irpe
    return cream


def reference_pair(cream: types.ModuleType, mode: str, grid: tuple[int, int], device: str):
    """(Cream ``RPEAttention``, ``mmpos.nn.Attention``) with the same weights, for ``mode``."""
    torch.manual_seed(0)
    rpe_on = REFERENCE_MODES[mode]
    config = None
    if rpe_on is not None:
        config = cream.irpe_module.get_rpe_config(
            ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, rpe_on=rpe_on
        )
    ref = cream.RPEAttention(TINY_DIM, TINY_HEADS, qkv_bias=True, rpe_config=config)
    encoders = []
    if rpe_on is not None:
        enc = mmpos.create(
            "irpe", dim=TINY_DIM, num_heads=TINY_HEADS, method="product", mode="ctx", rpe_on=rpe_on, grid_size=grid
        )
        for target in rpe_on:
            table = getattr(ref, f"rpe_{target}").lookup_table_weight
            torch.nn.init.normal_(table, std=0.02)
            getattr(enc, f"{target}_table").data.copy_(table.data)
        encoders = [enc]
    ours = Attention(TINY_DIM, TINY_HEADS, encoders=encoders)
    with torch.no_grad():  # qkv rows: q, k, v
        ours.q.weight.copy_(ref.qkv.weight[:TINY_DIM])
        ours.q.bias.copy_(ref.qkv.bias[:TINY_DIM])
        ours.kv.weight.copy_(ref.qkv.weight[TINY_DIM:])
        ours.kv.bias.copy_(ref.qkv.bias[TINY_DIM:])
        ours.proj.load_state_dict(ref.proj.state_dict())
    return ref.to(device), ours.to(device)


class _NoCoords(torch.nn.Module):
    """The reference layer called as ``layer(x, coords)`` (it infers its grid from N)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, coords: Coords) -> torch.Tensor:
        return self.layer(x)


def reference_times(cream: types.ModuleType, n: int, device: str, repeats: int) -> tuple[dict, dict, dict]:
    """Median step seconds, extra peak MiB and max |mmpos - Cream| per ``(side, mode)``."""
    grid, batch = SIZES[n]
    models, diffs = {}, {}
    torch.manual_seed(1)
    x = torch.randn(batch, n, TINY_DIM, device=device, requires_grad=True)
    coords = Coords.grid(*grid, num_prefix_tokens=1, device=device)
    for mode in REFERENCE_MODES:
        ref, ours = reference_pair(cream, mode, grid, device)
        models[("cream", mode)], models[("mmpos", mode)] = _NoCoords(ref), ours
        with torch.no_grad():
            diffs[mode] = float((ours(x, coords) - ref(x)).abs().max())
    medians = interleaved_medians(models, x, coords, device, repeats)
    mem = {}
    for key, model in models.items():
        model.zero_grad(set_to_none=True)
        x.grad = None
        step(model, x, coords)
        mem[key] = peak_mib(functools.partial(step, model, x, coords), device)
    return medians, mem, diffs


def reference_table(cream: types.ModuleType, device: str, repeats: int) -> str:
    lines = [
        (
            "| N | batch | mode | Cream ms | mmpos ms | mmpos / Cream | Cream x own plain | mmpos x own plain "
            "| Cream MiB | mmpos MiB | max abs diff |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in SIZES:
        t, mem, diffs = reference_times(cream, n, device, repeats)
        for mode in REFERENCE_MODES:
            c, m = t[("cream", mode)], t[("mmpos", mode)]
            lines.append(
                f"| {n} | {SIZES[n][1]} | {mode} | {1e3 * c:.1f} | {1e3 * m:.1f} | {m / c:.2f} "
                f"| {c / t[('cream', 'plain')]:.2f} | {m / t[('mmpos', 'plain')]:.2f} "
                f"| {mem[('cream', mode)]:.1f} | {mem[('mmpos', mode)]:.1f} | {diffs[mode]:.1e} |"
            )
    return "\n".join(lines)


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
    parser.add_argument("--reference", help="a microsoft/Cream checkout: also time its RPEAttention against mmpos")
    parser.add_argument("--reference-only", action="store_true", help="with --reference: skip the DeiT-S table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cpu":  # blocks of 64 KiB and more are mapped and unmapped: RSS follows live memory
        map_large_blocks()
    machine = torch.cuda.get_device_name() if args.device == "cuda" else cpu_name()
    clock_name = "wall" if args.device == "cuda" else "process CPU"
    if args.reference:
        cream = load_reference(args.reference)
        print(
            f"iRPE vs the reference (microsoft/Cream RPEAttention, rpe_ops built: {cream.built_rpe_ops}), "
            f"{datetime.date.today()}, {machine}, torch {torch.__version__}, threads={args.threads}, "
            f"dim={TINY_DIM}, heads={TINY_HEADS}, median of {args.repeats} ({clock_name} time)\n"
        )
        print(reference_table(cream, args.device, args.repeats) + "\n")
        if args.reference_only:
            return
    rows = []
    for n in SIZES:
        t = times(n, args.device, args.repeats)
        mem = {v: peak_memory(v, n, args.device) for v in VARIANTS}
        for v in VARIANTS:
            rows.append(
                {
                    "n": n,
                    "batch": SIZES[n][1],
                    "variant": v,
                    "ms": 1e3 * t[v],
                    "time_ratio": t[v] / t["sdpa"],
                    "mib": mem[v],
                    "mem_ratio": mem[v] / mem["sdpa"],
                }
            )
    print(
        f"iRPE benchmark, {datetime.date.today()}, {machine}, torch {torch.__version__}, "
        f"threads={args.threads}, dim={DIM}, heads={HEADS}, median of {args.repeats} "
        f"({'wall' if args.device == 'cuda' else 'process CPU'} time)\n"
    )
    print("| N | batch | variant | fwd+bwd ms | x sdpa | peak extra MiB | x sdpa |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']} | {r['batch']} | {r['variant']} | {r['ms']:.1f} | {r['time_ratio']:.2f} "
            f"| {r['mib']:.1f} | {r['mem_ratio']:.2f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
