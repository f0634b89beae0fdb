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
shared machine's load hits them alike; process CPU time on CPU, wall time on CUDA, with the
allocator as the process found it (glibc's default unless ``MALLOC_*`` / ``LD_PRELOAD`` say
otherwise: what users get). Peak memory, measured after all timings: on CUDA
``max_memory_allocated`` above the inputs and weights; on CPU the rise of the peak resident set
during one step (``VmHWM`` of ``/proc/self/status``, reset through ``/proc/self/clear_refs``), with
glibc then mapping every block of 64 KiB or more so that the resident set follows live memory;
``--mapped`` also times the steps again under that setting (a second, labelled table).

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

    python benchmarks/irpe.py [--device cpu|cuda] [--repeats 7] [--threads 1] [--reference PATH] [--mapped]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import torch
from _env import header
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


def deit_s_models(n: int, device: str) -> tuple[dict, torch.Tensor, Coords]:
    """The DeiT-S variants at ``N = n``, their outputs compared first."""
    models = {v: build(v, n, device) for v in VARIANTS}
    x, coords = inputs(n, device)
    with torch.no_grad():  # the naive, the general and the gathered versions compute the same layer
        for other in ("naive", "irpe-sdpa"):
            torch.testing.assert_close(models[other](x, coords), models["irpe"](x, coords), rtol=1e-4, atol=1e-5)
    return models, x, coords


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


def reference_models(cream: types.ModuleType, n: int, device: str) -> tuple[dict, torch.Tensor, Coords, dict]:
    """``(side, mode) -> layer`` at ``N = n`` with the same weights, and max |mmpos - Cream| per mode."""
    grid, _ = SIZES[n]
    models, diffs = {}, {}
    torch.manual_seed(1)
    x = torch.randn(SIZES[n][1], n, TINY_DIM, device=device, requires_grad=True)
    coords = Coords.grid(*grid, num_prefix_tokens=1, device=device)
    for mode in REFERENCE_MODES:
        ref, ours = reference_pair(cream, mode, grid, device)
        models[("cream", mode)], models[("mmpos", mode)] = _NoCoords(ref), ours
        with torch.no_grad():
            diffs[mode] = float((ours(x, coords) - ref(x)).abs().max())
    return models, x, coords, diffs


def step_memory(models: dict, x: torch.Tensor, coords: Coords, device: str) -> dict:
    """Extra peak MiB of one forward + backward step of each model (after a warm-up step)."""
    mem = {}
    for key, model in models.items():
        model.zero_grad(set_to_none=True)
        x.grad = None
        step(model, x, coords)
        mem[key] = peak_mib(functools.partial(step, model, x, coords), device)
    return mem


def reference_table(runs: dict, key: str = "t") -> str:
    """``runs``: N -> {"t": medians, "mem": MiB, "diffs": ...} from :func:`main`."""
    lines = [
        (
            "| N | batch | mode | Cream ms | mmpos ms | mmpos / Cream | Cream x own plain | mmpos x own plain "
            "| mmpos x SDPA floor | Cream MiB | mmpos MiB | max abs diff |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, run in runs.items():
        t, mem, diffs = run[key], run["mem"], run["diffs"]
        for mode in REFERENCE_MODES:
            c, m = t[("cream", mode)], t[("mmpos", mode)]
            lines.append(
                f"| {n} | {SIZES[n][1]} | {mode} | {1e3 * c:.1f} | {1e3 * m:.1f} | {m / c:.2f} "
                f"| {c / t[('cream', 'plain')]:.2f} | {m / t[('mmpos', 'plain')]:.2f} | {m / t['floor']:.2f} "
                f"| {mem[('cream', mode)]:.1f} | {mem[('mmpos', mode)]:.1f} | {diffs[mode]:.1e} |"
            )
    return "\n".join(lines)


def deit_s_table(runs: dict, key: str = "t") -> str:
    lines = ["| N | batch | variant | fwd+bwd ms | x sdpa | x sdpa-mask floor | peak extra MiB | x sdpa |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for n, run in runs.items():
        t, mem = run[key], run["mem"]
        for v in VARIANTS:
            lines.append(
                f"| {n} | {SIZES[n][1]} | {v} | {1e3 * t[v]:.1f} | {t[v] / t['sdpa']:.2f} | {t[v] / t['sdpa-mask']:.2f} "
                f"| {mem[v]:.1f} | {mem[v] / mem['sdpa']:.2f} |"
            )
    return "\n".join(lines)


class _FloorSDPA(torch.nn.Module):
    """DeiT-Ti projections + SDPA with a constant ``(B, H, N, N)`` float mask: the floor of attention reading a bias."""

    def __init__(self, layer: Attention, n: int, batch: int) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("constant", 0.02 * torch.randn(batch, TINY_HEADS, n, n))

    def forward(self, x: torch.Tensor, coords: Coords) -> torch.Tensor:
        layer, b, n = self.layer, x.shape[0], x.shape[1]
        q = layer.q(x).view(b, n, TINY_HEADS, -1).transpose(1, 2)
        k, v = layer.kv(x).view(b, n, 2, TINY_HEADS, -1).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.constant)
        return layer.proj(out.transpose(1, 2).reshape(b, n, -1))


def flex_backward_on(device: str) -> str:
    """Whether this torch's FlexAttention runs a backward on ``device`` with a learnable bias table in ``score_mod``."""
    try:
        from torch.nn.attention.flex_attention import flex_attention
    except ImportError as err:
        return f"no FlexAttention ({err})"
    q, k, v = (torch.randn(1, 1, 16, 8, device=device, requires_grad=True) for _ in range(3))
    table = torch.zeros(4, device=device, requires_grad=True)
    ids = torch.arange(16, device=device).remainder(4)

    def score_mod(score, b, h, i, j):
        return score + table[ids[(i - j).abs()]]

    try:
        flex_attention(q, k, v, score_mod=score_mod).sum().backward()
    except (NotImplementedError, RuntimeError) as err:  # NotImplementedError on CPU in torch <= 2.15
        return f"no ({type(err).__name__}: {str(err).split('.')[0]})"
    return "yes (eager)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--reference", help="a microsoft/Cream checkout: also time its RPEAttention against mmpos")
    parser.add_argument("--reference-only", action="store_true", help="with --reference: skip the DeiT-S table")
    parser.add_argument("--mapped", action="store_true", help="CPU: time again with glibc mapping blocks >= 64 KiB")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock_name = "wall" if args.device == "cuda" else "process CPU"
    cream = load_reference(args.reference) if args.reference else None
    ref_runs, deit_runs = {}, {}
    for n in SIZES if cream is not None else ():
        models, x, coords, diffs = reference_models(cream, n, args.device)
        torch.manual_seed(0)
        models["floor"] = _FloorSDPA(Attention(TINY_DIM, TINY_HEADS), n, SIZES[n][1]).to(args.device)
        ref_runs[n] = {"models": models, "x": x, "coords": coords, "diffs": diffs}
    for n in SIZES if not args.reference_only else ():
        models, x, coords = deit_s_models(n, args.device)
        deit_runs[n] = {"models": models, "x": x, "coords": coords}
    runs = [*ref_runs.values(), *deit_runs.values()]
    for run in runs:  # the allocator as found: what users get
        run["t"] = interleaved_medians(run["models"], run["x"], run["coords"], args.device, args.repeats)
    flex = f"FlexAttention backward on {args.device}: {flex_backward_on(args.device)}"
    headline = header(args.device, note=f"median of {args.repeats} ({clock_name} time); {flex}")
    if args.device == "cpu":
        map_large_blocks()  # from here on RSS follows live memory (and every large block is fresh)
    for run in runs:
        run["mem"] = step_memory(run["models"], run["x"], run["coords"], args.device)
        if args.mapped and args.device == "cpu":
            run["t_mapped"] = interleaved_medians(run["models"], run["x"], run["coords"], args.device, args.repeats)
    mapped = header(args.device, note=f"median of {args.repeats} ({clock_name} time)")
    tables = [("t", headline)] + ([("t_mapped", mapped)] if args.mapped and args.device == "cpu" else [])
    for key, line in tables:
        label = "allocator as found (the headline)" if key == "t" else "glibc mapping every block >= 64 KiB"
        print(f"### Timings: {label}\n\n{line}\n<!-- peak MiB measured after the timings: {mapped[5:-4]} -->\n")
        if cream is not None:
            print(
                f"iRPE vs the reference (microsoft/Cream RPEAttention, rpe_ops built: {cream.built_rpe_ops}), "
                f"dim={TINY_DIM}, heads={TINY_HEADS}; floor: SDPA reading a constant (B, H, N, N) mask\n"
            )
            print(reference_table(ref_runs, key) + "\n")
        if deit_runs:
            print(f"DeiT-S layer: dim={DIM}, heads={HEADS}\n")
            print(deit_s_table(deit_runs, key) + "\n")
    if args.json:
        rows = [
            {"n": n, "variant": v, "ms": 1e3 * run["t"][v], "mib": run["mem"][v]}
            for n, run in deit_runs.items()
            for v in VARIANTS
        ]
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
