"""GRAPE: what the learned planes cost against the canonical (cos / sin) mode, one attention layer's q and k.

Sizes: B = 1, 28 query heads, 4 KV heads, head_dim 128, positions of a Qwen2-VL-style prompt (text, an image,
text, a video) from :func:`mmpos.layout.build` (``grape`` layout), built once outside the timed region.

* ``grape-i``: ``create("grape-i").rotate(q, k, coords)`` (plan angles, one cos / sin, a rotation), eager;
* ``axis``, ``mixed``, ``block_mixed``: ``create("grape-learned", mode=...).rotate(q, k, coords)`` at the
  reference's defaults (64 planes per bank; blocks of 16 with 8 planes), eager;
* ``copy``: ``q.clone(), k.clone()``, the memory-bound floor.

Each variant is timed forward (``no_grad``) and forward + backward (gradients to q, k and the planes). Time:
median of ``--repeats`` calls, variants interleaved call by call; process CPU time on CPU (one thread: the
call's compute), wall time on CUDA. Peak memory: the extra MiB of one call (``benchmarks/_memory.py``). The
reference (JJJYmmm/Multimodal-RoPEs ``freq_allocation/grape.py``) is not installed, so the ratios are against
the canonical mode, not against the reference.

    python benchmarks/grape.py [--device cpu|cuda] [--length 2048] [--repeats 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from _env import header
from _memory import peak_mib

from mmpos import create
from mmpos.layout import Image, Text, Video, build

HEADS, KV_HEADS, HEAD_DIM = 28, 4, 128


def _clock(device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
        return time.perf_counter()
    return time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = args.device
    video = 64  # a 4-frame 8 x 8 (merged) video, an image of 16 x 16 merged tokens, the rest text
    text = args.length - 256 - 4 * video
    if text < 3:
        sys.exit(f"--length must be at least {256 + 4 * video + 3}")
    segments = [Text(text // 3), Image((1, 32, 32)), Text(text // 3), Video((4, 16, 16)), Text(text - 2 * (text // 3))]
    coords = build([segments], "grape").coords.to(device)
    n = coords.num_tokens
    q = torch.randn(1, n, HEADS, HEAD_DIM, device=device).transpose(1, 2)  # (B, H, L, D) view of the projection
    k = torch.randn(1, n, KV_HEADS, HEAD_DIM, device=device).transpose(1, 2)
    variants = {
        "grape-i": create("grape-i", head_dim=HEAD_DIM).to(device),
        "axis": create("grape-learned", head_dim=HEAD_DIM, mode="axis").to(device),
        "mixed": create("grape-learned", head_dim=HEAD_DIM, mode="mixed").to(device),
        "block_mixed": create("grape-learned", head_dim=HEAD_DIM, mode="block_mixed").to(device),
    }
    for name in ("axis", "mixed", "block_mixed"):  # mixed starts as grape-i; all keep norms at rope_init
        with torch.no_grad():
            qr, _ = variants[name].rotate(q, k, coords)
        torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1), rtol=1e-4, atol=1e-4)

    def forward(enc):
        def run():
            with torch.no_grad():
                return enc.rotate(q, k, coords) if enc is not None else (q.clone(), k.clone())

        return run

    def backward(enc):
        qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)

        def run():
            qr, kr = enc.rotate(qg, kg, coords)
            (qr.square().sum() + kr.square().sum()).backward()

        return run

    calls = {("copy", "fwd"): forward(None)}
    for name, enc in variants.items():
        calls[(name, "fwd")] = forward(enc)
        calls[(name, "fwd+bwd")] = backward(enc)
    for fn in calls.values():  # warm-up
        fn()
    times = {key: [] for key in calls}
    for _ in range(args.repeats):
        for key, fn in calls.items():  # interleaved: the load of a shared machine hits every variant alike
            start = _clock(device)
            fn()
            times[key].append(_clock(device) - start)
    print(header(device, note=f"B = 1, L = {n}, {HEADS}/{KV_HEADS} heads, head_dim {HEAD_DIM}, fp32"))
    print("| variant | pass | median ms | vs grape-i | peak MiB |")
    print("|---|---|---|---|---|")
    for (name, kind), samples in times.items():
        median = statistics.median(samples) * 1e3
        base = statistics.median(times[("grape-i", kind)]) * 1e3 if ("grape-i", kind) in times else None
        ratio = f"{median / base:.2f}x" if base else "-"
        print(f"| {name} | {kind} | {median:.1f} | {ratio} | {peak_mib(calls[(name, kind)], device):.1f} |")


if __name__ == "__main__":
    main()
