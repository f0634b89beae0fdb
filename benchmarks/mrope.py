"""M-RoPE: cos/sin + rotation of q and k, mmpos against transformers' eager functions.

One attention layer's worth of work at Qwen2-VL-7B sizes (28 query heads, 4 KV heads,
head_dim 128, ``mrope_section`` [16, 24, 24], theta 1e6), B = 1, L = 2048 and 8192:

* ``hf``: ``Qwen2VLRotaryEmbedding(x, position_ids)`` (cos/sin ``(3, B, L, 128)``) then
  ``apply_multimodal_rotary_pos_emb`` (transformers < 5.17; from 5.17 the rotary module recomposes the
  sections and ``apply_rotary_pos_emb`` rotates; eager);
* ``mmpos``: ``create("mrope").rotate(q, k, coords)`` (plan angles ``(B, L, 64)``, one
  cos/sin, half-split rotation), eager;
* ``mmpos-compiled``: mmpos angles and cos/sin ``(B, L, 64)`` eagerly (once per forward
  in a model), then :func:`mmpos.rotary.apply_rotary` on q and k under ``torch.compile``
  (inductor fuses the rotation into one pass over q and k). Compiling ``rotate`` whole is
  slower in this one-layer setting: inductor then recomputes cos/sin for every head;
* ``hf-compiled``: transformers' two functions under ``torch.compile``, for reference;
* ``copy``: ``q.clone(), k.clone()`` -- reading and writing q and k once, the memory-bound
  floor of any rotation that returns new tensors.

q and k are laid out as in the model (``(B, L, H, D)`` projections viewed as
``(B, H, L, D)``); positions are a Qwen2-VL prompt (text, a 2-D image, text, a video)
from :func:`mmpos.layout.build`, built once outside the timed region. Before timing, every
output is compared with a float64 rotation (eager mmpos is bit-exact to transformers; the
compiled kernel rounds once instead of after every operation, so in bf16 it is as close or
closer to float64, not bit-equal to transformers). Time: median
of ``--repeats`` calls, variants interleaved call by call so a shared machine's load hits
them alike; process CPU time on CPU (with one thread, the call's compute), wall time on CUDA.
Allocator: the timings are taken with the allocator as the process found it (glibc's default:
what users get); afterwards glibc is made to map every block of 64 KiB or more for the peak
memory (the extra MiB one call adds: the rise of ``VmHWM``, see ``benchmarks/_memory.py``; CUDA
``max_memory_allocated``) and, with ``--mapped``, the timings are taken again under that setting
as a second, labelled table.

    python benchmarks/mrope.py [--device cpu|cuda] [--repeats 15] [--threads 1] [--no-compile] [--mapped]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import transformers
from _env import header
from _memory import map_large_blocks, peak_mib
from transformers.models.qwen2_vl import modeling_qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

from mmpos import create
from mmpos.layout import Image, Text, Video, build
from mmpos.rotary import apply_rotary

HEADS, KV_HEADS, HEAD_DIM, SECTION, THETA = 28, 4, 128, [16, 24, 24], 1e6
LENGTHS = (2048, 8192)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def prompt(length: int):
    """A Qwen2-VL layout of ``length`` tokens: text, an image, text, a video, text."""
    image = Image((1, 28, 28))  # 196 tokens after the 2x2 merge
    video = Video((8, 24, 24))  # 8 * 144 tokens
    vision = 196 + 8 * 144
    text = length - vision
    if text < 3:
        raise ValueError(f"length must be at least {vision + 3} (the prompt has {vision} vision tokens), got {length}")
    sample = [Text(text // 4), image, Text(text // 4), video, Text(text - 2 * (text // 4))]
    return build([sample], scheme="qwen2-vl")


def inputs(length: int, dtype: torch.dtype, device: str):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, length, HEADS, HEAD_DIM, generator=g).to(device, dtype).transpose(1, 2)
    k = torch.randn(1, length, KV_HEADS, HEAD_DIM, generator=g).to(device, dtype).transpose(1, 2)
    layout = prompt(length)
    return q, k, layout.position_ids.to(device), layout.coords.to(device)


def variants(device: str, compile_mmpos: bool):
    cfg = Qwen2VLTextConfig(
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rope_theta=THETA,
        rope_scaling={"type": "mrope", "mrope_section": SECTION},
    )
    hf_rotary = Qwen2VLRotaryEmbedding(cfg).to(device)
    enc = create("mrope", head_dim=HEAD_DIM, mrope_section=SECTION, theta=THETA).to(device)

    def hf(q, k, ids, coords):
        cos, sin = hf_rotary(q, ids)
        if hasattr(modeling_qwen2_vl, "apply_multimodal_rotary_pos_emb"):  # transformers < 5.17
            return modeling_qwen2_vl.apply_multimodal_rotary_pos_emb(q, k, cos, sin, SECTION)
        return modeling_qwen2_vl.apply_rotary_pos_emb(q, k, cos, sin)  # 5.17+: the rotary module recomposed them

    def mmpos(q, k, ids, coords):
        return enc.rotate(q, k, coords)

    def rotate(q, k, cos, sin):
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    rotate_compiled = torch.compile(rotate, dynamic=False)

    def mmpos_compiled(q, k, ids, coords):
        angles = enc.angles(coords)  # (B, L, 64), once per forward in a model
        return rotate_compiled(q, k, angles.cos(), angles.sin())

    def copy(q, k, ids, coords):
        return q.clone(), k.clone()

    out = {"hf": hf, "mmpos": mmpos}
    if compile_mmpos:
        out["mmpos-compiled"] = mmpos_compiled
        out["hf-compiled"] = torch.compile(hf, dynamic=False)
    out["copy"] = copy
    return out


def fp64_rotation(q, k, coords):
    """The exact rotation (float64 angles and arithmetic) that every variant approximates."""
    enc = create("mrope", head_dim=HEAD_DIM, mrope_section=SECTION, theta=THETA).to(q.device)
    angles = enc.angles(coords.to(dtype=torch.float64))  # (B, L, 64) float64
    cos, sin = angles.cos()[:, None], angles.sin()[:, None]

    def rotate(x):
        x1, x2 = x.double().chunk(2, -1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    return rotate(q), rotate(k)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def prepare(length: int, dtype: torch.dtype, device: str, compile_mmpos: bool) -> tuple:
    """Inputs and variants for one configuration, every output checked against a float64 rotation."""
    q, k, ids, coords = inputs(length, dtype, device)
    fns = variants(device, compile_mmpos)
    ref = fns["hf"](q, k, ids, coords)
    truth = fp64_rotation(q, k, coords)
    errors = {}
    for name in ("hf", "mmpos", "mmpos-compiled", "hf-compiled"):
        if name in fns:
            got = ref if name == "hf" else fns[name](q, k, ids, coords)  # also the compile call
            errors[name] = max(float((a.double() - b).abs().max()) for a, b in zip(got, truth, strict=True))
            exact = all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
            note = ", bit-exact to transformers" if exact and name != "hf" else ""
            print(f"  {name}: max |error| vs float64 {errors[name]:.2e}{note}", file=sys.stderr)
    if max(errors.values()) > 2 * errors["hf"] + 1e-6:
        raise AssertionError(f"mmpos is less accurate than transformers at L={length} {dtype}: {errors}")
    for fn in fns.values():
        fn(q, k, ids, coords)  # warm-up
    return fns, (q, k, ids, coords)


@torch.no_grad()
def timings(fns: dict, args: tuple, device: str, repeats: int) -> dict[str, float]:
    """Median ms per call, variants interleaved call by call."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    clock = time.perf_counter if device == "cuda" else time.process_time
    for _ in range(repeats):
        for name, fn in fns.items():
            sync(device)
            start = clock()
            fn(*args)
            sync(device)
            samples[name].append(clock() - start)
    return {name: statistics.median(v) * 1e3 for name, v in samples.items()}


@torch.no_grad()
def memory(fns: dict, args: tuple, device: str) -> dict[str, float]:
    return {name: peak_mib(lambda fn=fn: fn(*args), device) for name, fn in fns.items()}


def table(rows: list[dict], key: str = "ms") -> str:
    names = [n for n in ("hf", "mmpos", "mmpos-compiled", "hf-compiled", "copy") if n in rows[0][key]]
    head = "| L | dtype | " + " | ".join(f"{n} ms" for n in names) + " | hf / mmpos | mmpos / copy |"
    if "mmpos-compiled" in names:
        head += " hf / compiled | compiled / copy |"
    head += " peak MiB " + " / ".join(names) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        ms = r[key]
        cells = [str(r["length"]), r["dtype"]] + [f"{ms[n]:.2f}" for n in names]
        cells += [f"{ms['hf'] / ms['mmpos']:.2f}x", f"{ms['mmpos'] / ms['copy']:.2f}x"]
        if "mmpos-compiled" in names:
            cells += [f"{ms['hf'] / ms['mmpos-compiled']:.2f}x", f"{ms['mmpos-compiled'] / ms['copy']:.2f}x"]
        cells.append(" / ".join(f"{r['mib'][n]:.0f}" for n in names))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (CPU)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--mapped", action="store_true", help="CPU: a second table timed with blocks >= 64 KiB mapped")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for length in args.lengths:
        for dname in args.dtypes:
            print(f"L={length} {dname}", file=sys.stderr)
            fns, inp = prepare(length, DTYPES[dname], args.device, not args.no_compile)
            rows.append({"length": length, "dtype": dname, "fns": fns, "inputs": inp})
    for r in rows:  # the allocator as found (glibc's default): what users get
        r["ms"] = timings(r["fns"], r["inputs"], args.device, args.repeats)
    headline = header(args.device, transformers, note=f"median of {args.repeats}")
    if args.device == "cpu":
        map_large_blocks()  # from here on RSS follows live memory (and every large block is fresh)
    for r in rows:
        r["mib"] = memory(r["fns"], r["inputs"], args.device)
        if args.mapped and args.device == "cpu":
            r["ms_mapped"] = timings(r["fns"], r["inputs"], args.device, args.repeats)
    print(headline + "\n<!-- peak MiB measured afterwards with blocks >= 64 KiB mapped -->")
    print(table(rows))
    if args.mapped and args.device == "cpu":
        print("\n" + header(args.device, transformers, note=f"median of {args.repeats}"))
        print(table(rows, "ms_mapped"))
    if args.json:
        keep = ("length", "dtype", "ms", "mib", "ms_mapped")
        with open(args.json, "w") as f:
            json.dump([{k: r[k] for k in keep if k in r} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
