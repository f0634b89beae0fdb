"""M-RoPE rotation of q and k: mmpos against the installed transformers' eager functions and the copy floor.

One attention layer's rotary work at Qwen2-VL-7B sizes (28 query heads, 4 KV heads,
head_dim 128, ``mrope_section`` [16, 24, 24], theta 1e6), B = 1, L = 2048 and 8192, fp32 and
bf16. In a model the cos / sin tables are made once per forward and every layer rotates its
q and k with them, so the two parts are timed apart:

* **rotation** (every layer): ``hf`` is the installed release's eager function, found by
  feature detection -- ``apply_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section)`` on
  ``(3, B, L, 128)`` tables (transformers < 5.17, which selects the sections in every layer)
  or ``apply_rotary_pos_emb(q, k, cos, sin)`` on ``(B, L, 128)`` tables (later releases, whose
  rotary embedding selects them once); ``mmpos`` is :meth:`mmpos.rotary.Rotation.rotate`
  (bit-exact to transformers), ``mmpos-fast`` the same with ``exact=False`` (fused
  multiply-add), ``mmpos-compiled`` :func:`mmpos.rotary.apply_rotary` on q and k under
  ``torch.compile`` (inductor: one fused pass, rounding once in bf16), ``compiled-exact`` the same
  compiled with inductor's ``emulate_precision_casts`` (rounding after every operation as eager
  does: bit-exact to transformers in bf16 too); ``clone`` is ``q.clone(), k.clone()``, the floor of any rotation that
  returns new tensors (reading q and k and writing fresh memory);
* **into existing storage** (a KV-cache slot, a fused QKV buffer): ``mmpos-into`` is
  ``Rotation.rotate(q, k, out=(q_out, k_out))``, ``mmpos-in-place`` ``Rotation.rotate_`` on
  copies of q and k, ``compiled-into`` the compiled rotation writing into given buffers, and
  ``copy-into`` is ``q_out.copy_(q), k_out.copy_(k)``: the same bytes read and written into memory
  that exists, the **physical floor** (its GB/s, read + write, is this machine's copy bandwidth);
* **tables** (once per forward): transformers' ``Qwen2VLRotaryEmbedding(x, position_ids)``
  against mmpos's ``create("mrope").rotation(coords)``.

q and k are laid out as in the model (``(B, L, H, D)`` projections viewed as ``(B, H, L, D)``);
positions are a text / image (14 x 14 after the merge) / text / video (8 x 12 x 12) / text
prompt built by hand (``(3, B, L)`` ids and the matching ``(t, h, w)`` coordinates). Before
timing, each output is compared with transformers' (``bit-exact`` or the max difference).

Time: median of ``--repeats`` calls, variants interleaved call by call (a shared machine's
load hits them alike); process CPU time on CPU (with one thread, the call's compute), wall
time on CUDA. **Allocator**: the timings are taken first with the allocator as the process
found it (glibc's default unless ``MALLOC_*`` variables or ``LD_PRELOAD`` say otherwise: what
users get); then glibc is made to map every block of 64 KiB or more (``_memory.map_large_blocks``)
for the peak memory (extra MiB one call adds: the rise of ``VmHWM``, which then follows live
memory; CUDA ``max_memory_allocated``) and, unless ``--no-mapped``, the timings are taken again
under that setting as a second, labelled table (every large temporary then pays fresh page faults).

``--stack`` instead times a whole ``mmpos.nn.Transformer`` forward (DeiT-S: dim 384, 12 blocks,
6 heads, ``rope-axial``; N = 197 batch 8 and N = 1025 batch 2) with the angles computed once per
forward (the shared encoder) against every block computing them again (the same encoder handed
to each block's attention, as before the placement module).

    python benchmarks/rotary.py [--device cpu|cuda] [--repeats 15] [--threads 1] [--no-compile] [--no-mapped] [--stack]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
import transformers
from _env import header
from _memory import map_large_blocks, peak_mib
from transformers.models.qwen2_vl import modeling_qwen2_vl as hf_qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig

from mmpos import Coords, create
from mmpos.nn import Transformer
from mmpos.rotary import apply_rotary

HEADS, KV_HEADS, HEAD_DIM, SECTION, THETA = 28, 4, 128, [16, 24, 24], 1e6
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
ROTATIONS = ("hf", "mmpos", "mmpos-fast", "mmpos-compiled", "compiled-exact", "clone")  # each returns new tensors
INTO = ("mmpos-into", "mmpos-in-place", "compiled-into", "copy-into")  # each writes into existing tensors
FLOOR = "copy-into"


def positions(length: int) -> torch.Tensor:
    """``(3, 1, L)`` Qwen2-VL ids: text, a 14 x 14 image, text, an 8 x 12 x 12 video, text."""
    rows, start = [], 0
    text = length - 14 * 14 - 8 * 12 * 12
    if text < 3:
        raise ValueError(f"length must be at least {14 * 14 + 8 * 12 * 12 + 3}, got {length}")
    for part in ("text", (1, 14, 14), "text", (8, 12, 12), "text"):
        if part == "text":
            n = text // 3 if len(rows) < 4 else text - 2 * (text // 3)
            ids = torch.arange(start, start + n).expand(3, n)
            start += n
        else:
            t, h, w = part
            grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
            ids = grid.reshape(3, -1) + start
            start += max(part)
        rows.append(ids)
    return torch.cat(rows, dim=1).unsqueeze(1)


def hf_path(device: str):
    """The installed release's eager tables and rotation, by feature detection."""
    rope = {"rope_type": "default", "rope_theta": THETA, "mrope_section": SECTION}
    kwargs = {"hidden_size": HEADS * HEAD_DIM, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS}
    if hasattr(Qwen2VLTextConfig(), "rope_parameters"):
        cfg = Qwen2VLTextConfig(**kwargs, rope_parameters=rope)
    else:
        cfg = Qwen2VLTextConfig(**kwargs, rope_theta=THETA, rope_scaling={"type": "mrope", "mrope_section": SECTION})
    emb = hf_qwen2_vl.Qwen2VLRotaryEmbedding(cfg).to(device)
    if hasattr(hf_qwen2_vl, "apply_multimodal_rotary_pos_emb"):
        fn = hf_qwen2_vl.apply_multimodal_rotary_pos_emb
        return emb, (lambda q, k, cos, sin: fn(q, k, cos, sin, SECTION)), "apply_multimodal_rotary_pos_emb"
    return emb, hf_qwen2_vl.apply_rotary_pos_emb, "apply_rotary_pos_emb"


def _rotate(q, k, cos, sin):
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def _rotate_into(q, k, q_out, k_out, cos, sin):
    return apply_rotary(q, cos, sin, out=q_out), apply_rotary(k, cos, sin, out=k_out)


def warm_peak_mib(fn, device: str) -> float:
    """Extra peak memory (MiB) of one call, after a warm-up call."""
    fn()
    return peak_mib(fn, device)


def _describe(got, ref) -> str:
    if all(torch.equal(a, b) for a, b in zip(got, ref, strict=True)):
        return "bit-exact"
    return f"max diff {max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, ref, strict=True)):.1e}"


def setup(length: int, dtype: torch.dtype, device: str, compiled: bool) -> dict:
    """The variants (name -> call) on one set of inputs, and their outputs checked against transformers'."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, length, HEADS, HEAD_DIM, generator=g).to(device, dtype).transpose(1, 2)
    k = torch.randn(1, length, KV_HEADS, HEAD_DIM, generator=g).to(device, dtype).transpose(1, 2)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)  # existing storage (a cache slot), q's layout
    q_in, k_in = q.clone(), k.clone()  # rotated in place again and again (a rotation keeps the scale)
    ids = positions(length).to(device)
    coords = Coords(ids[:, 0].T.unsqueeze(0).float(), ("t", "h", "w"))  # (1, L, 3)
    emb, hf_rotate, hf_name = hf_path(device)
    enc = create("mrope", head_dim=HEAD_DIM, mrope_section=SECTION, theta=THETA).to(device)
    hf_cos, hf_sin = emb(q, ids)
    exact = enc.rotation(coords)
    fast = type(exact)(exact.cos, exact.sin, exact.convention, exact.head_dim, exact=False)
    fns = {
        "hf": lambda: hf_rotate(q, k, hf_cos, hf_sin),
        "mmpos": lambda: exact.rotate(q, k),
        "mmpos-fast": lambda: fast.rotate(q, k),
        "clone": lambda: (q.clone(), k.clone()),
        "mmpos-into": lambda: exact.rotate(q, k, out=(q_out, k_out)),
        "mmpos-in-place": lambda: exact.rotate_(q_in, k_in),
        "copy-into": lambda: (q_out.copy_(q), k_out.copy_(k)),
        "hf-tables": lambda: emb(q, ids),
        "mmpos-tables": lambda: enc.rotation(coords),
    }
    if compiled:
        rotate_compiled = torch.compile(_rotate, dynamic=False)
        into_compiled = torch.compile(_rotate_into, dynamic=False)
        fns["mmpos-compiled"] = lambda: rotate_compiled(q, k, exact.cos, exact.sin)
        fns["compiled-into"] = lambda: into_compiled(q, k, q_out, k_out, exact.cos, exact.sin)
        # inductor rounding after every operation as eager does: bit-exact to transformers in bf16 too
        emulated = torch.compile(_rotate, dynamic=False, options={"emulate_precision_casts": True})
        fns["compiled-exact"] = lambda: emulated(q, k, exact.cos, exact.sin)
    ref = fns["hf"]()
    notes = {}
    for name in ("mmpos", "mmpos-fast", "mmpos-compiled", "compiled-exact", "mmpos-into", "compiled-into"):
        if name in fns:
            notes[name] = _describe(fns[name](), ref)
    q_in.copy_(q), k_in.copy_(k)
    notes["mmpos-in-place"] = _describe(fns["mmpos-in-place"](), ref)
    nbytes = 2 * (q.numel() * q.element_size() + k.numel() * k.element_size())  # read + write q and k
    return {"fns": fns, "notes": notes, "hf_function": hf_name, "bytes": nbytes}


def interleaved(fns: dict, device: str, repeats: int) -> dict[str, float]:
    """Median ms per call, the variants taking turns call by call (the first round warms up)."""
    clock = time.perf_counter if device == "cuda" else time.process_time
    samples: dict[str, list[float]] = {n: [] for n in fns}
    for i in range(repeats + 1):
        for name, fn in fns.items():
            if device == "cuda":
                torch.cuda.synchronize()
            start = clock()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                samples[name].append(clock() - start)
    return {n: 1e3 * statistics.median(v) for n, v in samples.items()}


def rotation_table(rows: list, key: str) -> str:
    """Out-of-place rotation against transformers (``key``: which timings, ``ms`` or ``ms_mapped``)."""
    names = [n for n in ROTATIONS if n in rows[0][2][key]]
    lines = [
        "| L | dtype | "
        + " | ".join(f"{n} ms" for n in names)
        + " | hf / mmpos | hf / fast | compiled / clone | compiled-exact / clone | hf tables ms | mmpos tables ms "
        "| mmpos vs hf |",
        "|---" * (len(names) + 9) + "|",
    ]
    for length, dname, r in rows:
        ms = r[key]
        compiled = [f"{ms[n] / ms['clone']:.2f}x" if n in ms else "-" for n in ("mmpos-compiled", "compiled-exact")]
        cells = [str(length), dname, *(f"{ms[n]:.1f}" for n in names)]
        cells += [f"{ms['hf'] / ms['mmpos']:.2f}x", f"{ms['hf'] / ms['mmpos-fast']:.2f}x", *compiled]
        cells += [f"{ms['hf-tables']:.2f}", f"{ms['mmpos-tables']:.2f}"]
        cells += [
            "; ".join(
                f"{n}: {r['notes'][n]}"
                for n in ("mmpos", "mmpos-fast", "mmpos-compiled", "compiled-exact")
                if n in r["notes"]
            )
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def floor_table(rows: list, key: str) -> str:
    """Every variant as a multiple of the copy into existing storage (the floor), with GB/s (read + write)."""
    names = [n for n in (*INTO[:-1], *ROTATIONS) if n in rows[0][2][key]]
    lines = [
        "| L | dtype | MiB read + written | floor: copy-into ms | floor GB/s | "
        + " | ".join(f"{n} x floor (GB/s)" for n in names)
        + " | into / in place vs hf |",
        "|---" * (len(names) + 6) + "|",
    ]
    for length, dname, r in rows:
        ms, nbytes = r[key], r["bytes"]
        floor = ms[FLOOR]
        cells = [str(length), dname, f"{nbytes / 2**20:.0f}", f"{floor:.1f}", f"{nbytes / floor / 1e6:.1f}"]
        cells += [f"{ms[n] / floor:.2f}x ({nbytes / ms[n] / 1e6:.1f})" for n in names]
        cells += [
            "; ".join(
                f"{n}: {r['notes'][n]}" for n in ("mmpos-into", "mmpos-in-place", "compiled-into") if n in r["notes"]
            )
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@torch.no_grad()
def stack(device: str, repeats: int) -> str:
    """Forward of a 12-block stack: shared angles (once per forward) vs angles in every block."""
    lines = ["| N | batch | once per forward ms | every block ms | every block / once |", "|---|---|---|---|---|"]
    clock = time.perf_counter if device == "cuda" else time.process_time
    for n, grid, batch in ((197, (14, 14), 8), (1025, (32, 32), 2)):
        torch.manual_seed(0)
        shared = Transformer(384, 12, 6, pos="rope-axial", axes=("h", "w")).to(device).eval()
        per_block = copy.deepcopy(shared)
        for block in per_block.blocks:
            block.attn.encoders.insert(0, per_block.rotary["rope-axial"])
        per_block.rotary = torch.nn.ModuleDict()
        x, coords = torch.randn(batch, n, 384, device=device), Coords.grid(*grid, num_prefix_tokens=1, device=device)
        torch.testing.assert_close(shared(x, coords), per_block(x, coords))
        samples = {"once": [], "every": []}
        for i in range(repeats + 1):
            for name, model in (("once", shared), ("every", per_block)):
                start = clock()
                model(x, coords)
                if device == "cuda":
                    torch.cuda.synchronize()
                if i:
                    samples[name].append(clock() - start)
        once, every = (1e3 * statistics.median(samples[k]) for k in ("once", "every"))
        lines.append(f"| {n} | {batch} | {once:.1f} | {every:.1f} | {every / once:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    parser.add_argument("--stack", action="store_true", help="time a 12-block stack instead (angles once vs per block)")
    parser.add_argument(
        "--no-mapped",
        action="store_true",
        help="CPU: skip the second timing table with glibc mapping every block >= 64 KiB (peak memory is still measured)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.stack:
        print(header(args.device, note=f"median of {args.repeats}"))
        print(stack(args.device, args.repeats))
        return
    rows, setups = [], []
    for length in args.lengths:
        for dname in args.dtypes:
            print(f"L={length} {dname}", file=sys.stderr)
            r = setup(length, DTYPES[dname], args.device, not args.no_compile)
            setups.append(r)
            rows.append((length, dname, r))
    for _, _, r in rows:  # default allocator: interleaved timings, one configuration at a time
        r["ms"] = interleaved(r["fns"], args.device, args.repeats)
    headline = header(args.device, transformers, note=f"{rows[0][2]['hf_function']}, median of {args.repeats}")
    if args.device == "cpu":
        map_large_blocks()  # from here on every block >= 64 KiB is mapped afresh: RSS follows live memory
    for _, _, r in rows:
        names = [n for n in (*ROTATIONS, *INTO) if n in r["fns"]]
        r["mib"] = {n: warm_peak_mib(r["fns"][n], args.device) for n in names}
        if args.device == "cpu" and not args.no_mapped:
            r["ms_mapped"] = interleaved(r["fns"], args.device, args.repeats)
    mapped = header(args.device, transformers, note=f"median of {args.repeats}")
    print(f"### Allocator as found (the headline)\n\n{headline}\n")
    print(rotation_table(rows, "ms") + "\n")
    print(floor_table(rows, "ms") + "\n")
    print(f"### Peak memory (extra MiB one call adds)\n\n{mapped}\n")
    names = [n for n in (*ROTATIONS, *INTO) if n in rows[0][2]["mib"]]
    print("| L | dtype | " + " | ".join(names) + " |\n" + "|---" * (len(names) + 2) + "|")
    for length, dname, r in rows:
        print(f"| {length} | {dname} | " + " | ".join(f"{r['mib'][n]:.0f}" for n in names) + " |")
    if "ms_mapped" in rows[0][2]:
        print(f"\n### Second column: glibc mapping every block >= 64 KiB\n\n{mapped}\n")
        print(rotation_table(rows, "ms_mapped") + "\n")
        print(floor_table(rows, "ms_mapped"))


if __name__ == "__main__":
    main()
