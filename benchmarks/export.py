"""Eager PyTorch against the ONNX export (``torch.onnx.export(..., dynamo=True)``) run by onnxruntime, on CPU.

Four models, the ones ``tests/export/test_onnx.py`` checks for equality, at a small
DeiT-Ti-like width (dim 192, 3 heads, depth 4):

* ``vit-rope``: ViT, 2-D axial RoPE, 64 x 64 images, patch 8 (8 x 8 tokens + class), batch 8;
* ``vit-peg``: the same with a PEG after block 0;
* ``vit-irpe``: the same with iRPE ``product`` contextual on q, k, v (static grid);
* ``dec-mrope``: causal decoder with M-RoPE, vocabulary 1000, 256 tokens, ``(3, B, L)`` ids, batch 4.

Time: median of ``--repeats`` forward passes (``torch.inference_mode``), the two engines
interleaved call by call; process CPU time (``time.process_time``, all threads of the process),
so that the load of a shared machine does not count, with ``--threads`` threads in both
(``torch.set_num_threads`` and onnxruntime's intra-op threads). The export time is the CPU
time of ``torch.onnx.export``. Outputs are compared (max abs diff).

    python benchmarks/export.py [--repeats 20] [--threads 1] [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
import torch
from torch import nn
from torch.export import Dim

from mmpos import Coords
from mmpos.export import to_onnx
from mmpos.nn import Transformer, VisionTransformer

DIM, HEADS, DEPTH = 192, 3, 4


class MRopeDecoder(nn.Module):
    """Embedding, a causal :class:`mmpos.nn.Transformer` with M-RoPE, LM head; ids ``(B, L)``, positions ``(3, B, L)``."""

    def __init__(self, vocab: int = 1000) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM)
        self.net = Transformer(DIM, DEPTH, HEADS, pos="mrope", causal=True)
        self.head = nn.Linear(DIM, vocab)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        coords = Coords(position_ids.permute(1, 2, 0).float(), ("t", "h", "w"))
        return self.head(self.net(self.embed(input_ids), coords))


def _vit(pos: str, **kwargs) -> nn.Module:
    kw = {pos: kwargs} if kwargs else None
    model = VisionTransformer(64, 8, dim=DIM, depth=DEPTH, num_heads=HEADS, pos=pos, pos_kwargs=kw, num_classes=10)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.2)
    return model.eval()


def _cases():
    b = Dim("b", min=1, max=64)
    image = {0: b, 2: 8 * Dim("h", min=1, max=64), 3: 8 * Dim("w", min=1, max=64)}  # multiples of the patch
    images = (torch.randn(8, 3, 64, 64),)
    yield "vit-rope", _vit("rope-axial"), images, (image,)
    yield "vit-peg", _vit("peg"), images, (image,)
    yield "vit-irpe", _vit("irpe", rpe_on="qkv"), images, ({0: b},)
    n = Dim("n", min=2, max=4096)
    ids = torch.randint(0, 1000, (4, 256))
    pos = torch.arange(256).expand(3, 4, 256).contiguous()
    yield "dec-mrope", MRopeDecoder().eval(), (ids, pos), ({0: b, 1: n}, {1: b, 2: n})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, inputs, dynamic in _cases():
            start = time.process_time()
            program = to_onnx(model, inputs, dynamic_shapes=dynamic, verbose=False)
            export_s = time.process_time() - start
            path = Path(tmp) / f"{name}.onnx"
            program.save(str(path))
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
            with torch.inference_mode():
                expected = model(*inputs)
                got = torch.from_numpy(session.run(None, feed)[0])
                eager, onnx = [], []
                for _ in range(args.repeats):
                    t = time.process_time()
                    model(*inputs)
                    eager.append(time.process_time() - t)
                    t = time.process_time()
                    session.run(None, feed)
                    onnx.append(time.process_time() - t)
            row = {
                "model": name,
                "inputs": [list(x.shape) for x in inputs],
                "eager_ms": 1e3 * statistics.median(eager),
                "onnxruntime_ms": 1e3 * statistics.median(onnx),
                "export_s": export_s,
                "max_abs_diff": float((got - expected).abs().max()),
            }
            row["speedup"] = row["eager_ms"] / row["onnxruntime_ms"]
            rows.append(row)
            print(
                f"{name:<10} eager {row['eager_ms']:8.2f} ms  onnxruntime {row['onnxruntime_ms']:8.2f} ms  "
                f"x{row['speedup']:.2f}  export {export_s:5.1f} s  max|diff| {row['max_abs_diff']:.1e}",
                flush=True,
            )
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "threads": args.threads,
        "clock": "process CPU time",
        "repeats": args.repeats,
        "torch": torch.__version__,
        "onnxruntime": ort.__version__,
    }
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
