"""Position ids of a Qwen2-VL batch: mmpos against transformers' ``get_rope_index``.

64 samples x 8 images with text between them (left padding), one run, four timings:

* transformers ``Qwen2VLModel.get_rope_index`` of the installed release (a Python loop over
  samples and blocks; from 5.3 on it reads ``mm_token_type_ids``),
* :func:`mmpos.integrations.hf_rope_index.get_rope_index` on the same token ids (vectorised,
  ``rule="installed"``),
* :func:`mmpos.layout.build` from the segment lists (what a data loader would call), and the
  same followed by reading ``Layout.coords`` (built on first read, float32 ``(B, L, 3)``).

The outputs are checked equal before timing. Time: wall and process CPU time per call, the
functions taking turns call by call (a shared machine's load hits them alike), in an order
shuffled each round (``--fixed-order``: always the order above). Peak memory:
extra MiB one call adds (CUDA ``max_memory_allocated``; CPU the rise of ``VmHWM`` with glibc
mapping blocks of 64 KiB or more, measured after the timings, as ``benchmarks/rotary.py`` does).
Usage::

    OMP_NUM_THREADS=1 python benchmarks/rope_index.py [--device cuda] [--samples 64] [--images 8]
"""

from __future__ import annotations

import argparse
import inspect
import platform
import random
import statistics
import time
import types
from types import SimpleNamespace

import torch
import transformers
from _memory import map_large_blocks, peak_mib
from transformers import Qwen2VLConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

from mmpos.integrations.hf_rope_index import get_rope_index, installed_rule
from mmpos.layout import Image, Text, build


def make_batch(samples: int, images: int, seed: int = 0):
    """Token ids, mask and grids of a batch, and the same batch as segment lists."""
    config = Qwen2VLConfig()
    rng = random.Random(seed)
    rows, segments, grids = [], [], []
    for _ in range(samples):
        ids, segs = [], []
        for _ in range(images):
            n_text = rng.randint(5, 40)
            ids += [rng.randrange(10, 1000) for _ in range(n_text - 1)] + [config.vision_start_token_id]
            h, w = 2 * rng.randint(4, 16), 2 * rng.randint(4, 16)  # up to 32 x 32 patches
            ids += [config.image_token_id] * (h * w // 4)
            segs += [Text(n_text), Image((1, h, w))]
            grids.append((1, h, w))
        n_text = rng.randint(5, 40)
        ids += [rng.randrange(10, 1000) for _ in range(n_text)]
        segs.append(Text(n_text))
        rows.append(ids)
        segments.append(segs)
    length = max(map(len, rows))
    input_ids = torch.zeros(samples, length, dtype=torch.long)
    mask = torch.zeros(samples, length, dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, length - len(r) :] = torch.tensor(r)
        mask[i, length - len(r) :] = 1
    return config, input_ids, mask, torch.tensor(grids), segments


def time_rounds(fns: dict, repeats: int, sync, shuffle: bool = True) -> tuple[dict, dict]:
    """Wall and process CPU seconds of ``repeats`` calls per function; the functions take turns
    in every round so that all of them see the same load (the CPU is shared), in an order
    shuffled each round (seeded): the call right after transformers' finds the caches cold and
    the memory transformers freed handed back to the system (page faults), so no function
    always takes that place."""
    for fn in fns.values():
        fn()  # warm-up
    wall, cpu = {name: [] for name in fns}, {name: [] for name in fns}
    names, rng = list(fns), random.Random(0)
    for _ in range(repeats):
        order = rng.sample(names, len(names)) if shuffle else names
        for name in order:
            fn = fns[name]
            sync()
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fixed-order", action="store_true", help="call the functions in one order every round")
    args = parser.parse_args()

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    config, input_ids, mask, grids, segments = make_batch(args.samples, args.images)
    input_ids, mask, grids = input_ids.to(device), mask.to(device), grids.to(device)
    holder = SimpleNamespace(config=config)  # get_rope_index reads self.config (and, from 5.3, a helper)
    if hasattr(Qwen2VLModel, "get_vision_position_ids"):
        holder.get_vision_position_ids = types.MethodType(Qwen2VLModel.get_vision_position_ids, holder)
    hf_kwargs = {"input_ids": input_ids, "image_grid_thw": grids, "attention_mask": mask}
    if "mm_token_type_ids" in inspect.signature(Qwen2VLModel.get_rope_index).parameters:
        hf_kwargs["mm_token_type_ids"] = (input_ids == config.image_token_id).long()
    rule = installed_rule()

    ref = Qwen2VLModel.get_rope_index(holder, **hf_kwargs)
    ours = get_rope_index(config, input_ids, grids, attention_mask=mask, rule=rule)
    lay = build(segments, "qwen2-vl", padding_side="left", device=device, rule=rule)
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1].to(device))
    assert torch.equal(lay.position_ids, ref[0]) and torch.equal(lay.rope_deltas, ref[1].to(device))

    fns = {
        "transformers `Qwen2VLModel.get_rope_index`": lambda: Qwen2VLModel.get_rope_index(holder, **hf_kwargs),
        "mmpos `integrations.hf_rope_index.get_rope_index` (token ids)": lambda: get_rope_index(
            config, input_ids, grids, attention_mask=mask, rule=rule
        ),
        "mmpos `layout.build` (segments)": lambda: build(
            segments, "qwen2-vl", padding_side="left", device=device, rule=rule
        ),
        "mmpos `layout.build` + `.coords` (built on first read)": lambda: (
            build(segments, "qwen2-vl", padding_side="left", device=device, rule=rule).coords
        ),
    }
    times, cpu = time_rounds(fns, args.repeats, sync, shuffle=not args.fixed_order)
    if device.type == "cpu":
        map_large_blocks()  # after timing: it slows allocations
    mib = {}
    for name, fn in fns.items():
        fn()  # warm-up
        mib[name] = peak_mib(fn, device)
    base, base_cpu = next(iter(times.values())), next(iter(cpu.values()))  # transformers

    b, length = input_ids.shape
    print(
        f"batch {b} x {length} tokens, {grids.shape[0]} images; device {device}, torch threads "
        f"{torch.get_num_threads()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{platform.processor() or platform.machine()}, order {'fixed' if args.fixed_order else 'shuffled'}"
    )
    print(
        "| method | best (ms) | median (ms) | speed-up, best | speed-up, median | CPU median (ms) "
        "| speed-up, CPU median | peak (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    for name, t in times.items():
        c = cpu[name]
        print(
            f"| {name} | {min(t) * 1e3:.2f} | {med(t) * 1e3:.2f} | {min(base) / min(t):.1f}x | "
            f"{med(base) / med(t):.1f}x | {med(c) * 1e3:.2f} | {med(base_cpu) / med(c):.1f}x | {mib[name]:.1f} |"
        )


if __name__ == "__main__":
    main()
