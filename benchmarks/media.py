"""``mmpos.media`` against the Hugging Face Qwen-VL processors: file in, pixel rows out, on CPU.

Cases (files written once to a temporary folder with Pillow / OpenCV):

* ``image-pil``: a 1280 x 720 JPEG, ``image_patches(path, "qwen2-vl")`` against
  ``Qwen2VLImageProcessorPil`` (transformers 5.x) / ``Qwen2VLImageProcessor`` (4.x) on
  ``load_image(path)``: resized to 1288 x 728, 4784 rows;
* ``image-torch``: the same with ``resample="torch"`` against the torchvision image processor;
* ``video-qwen2``: a 4 s 640 x 360 MJPG clip at 30 fps, 2 fps sampling (8 frames),
  ``video_patches(path, "qwen2-vl", fps=2)`` against ``read_video_opencv`` with the
  processor's ``sample_frames`` then ``Qwen2VLVideoProcessor``;
* ``video-qwen3``: the same clip with the Qwen3-VL rules (``Qwen3VLVideoProcessor``);
* families (transformers 5.x, where the classes exist): ``image-cosmos3-edge`` (the JPEG,
  ``"cosmos3-edge"`` against ``Cosmos3EdgeImageProcessorPil``), ``slices-minicpm`` (the JPEG,
  ``image_slices`` against ``MiniCPMV4_6ImageProcessorPil``: a thumbnail and 2 x 3 slices, compared in
  the processor's layout), ``video-hy-v4-vl`` (the clip, ``"hy-v4-vl"`` against ``read_video_opencv``
  with the processor's ``sample_frames``, then ``HYV4VLVideoProcessor``).

Time: median of ``--repeats`` calls, the two sides interleaved call by call, both **wall time**
(``time.perf_counter``: what a data loader waits; decoders may use threads) and process CPU time
(``time.process_time``: all threads of the process, which a shared machine's load inflates less),
with ``--threads`` torch threads. Outputs are compared (``torch.equal`` of the rows). The header
line gives versions, threads, load and the allocator.

    python benchmarks/media.py [--repeats 10] [--threads 1] [--out results.json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch
import transformers
from _env import header
from PIL import Image as PILImage

from mmpos import media

HF5 = int(transformers.__version__.split(".")[0]) >= 5


def _files(folder: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:720, 0:1280]
    picture = ((yy // 3 + xx // 5)[..., None] + np.array([0, 60, 120]) + rng.integers(0, 40, (720, 1280, 3))) % 256
    image = folder / "photo.jpg"
    PILImage.fromarray(picture.astype(np.uint8)).save(image, quality=90)
    clip = folder / "clip.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (640, 360))
    small = picture[:360, :640].astype(np.uint8)
    for i in range(120):
        writer.write(np.roll(small, 4 * i, axis=1))
    writer.release()
    return image, clip


def _image_processor(resample: str):
    if HF5:
        if resample == "pil":
            module = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
            return importlib.import_module(module).Qwen2VLImageProcessorPil()
        return importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl").Qwen2VLImageProcessor()
    if resample == "pil":
        return importlib.import_module("transformers.models.qwen2_vl.image_processing_qwen2_vl").Qwen2VLImageProcessor()
    module = "transformers.models.qwen2_vl.image_processing_qwen2_vl_fast"
    return importlib.import_module(module).Qwen2VLImageProcessorFast()


def _video_processor(rule: str):
    name = "qwen3_vl" if rule == "qwen3-vl" else "qwen2_vl"
    module = importlib.import_module(f"transformers.models.{name}.video_processing_{name}")
    kwargs = {"cap_pixels_per_frame": False} if HF5 else {}
    cls = module.Qwen3VLVideoProcessor if name == "qwen3_vl" else module.Qwen2VLVideoProcessor
    return cls(do_sample_frames=False, **kwargs)


def _cases(image: Path, clip: Path) -> dict:
    from transformers.video_utils import read_video_opencv

    cases = {}
    for resample in ("pil", "torch"):
        proc = _image_processor(resample)

        def hf_image(proc=proc):
            return proc(images=[media.load_image(image)], return_tensors="pt")["pixel_values"]

        def ours_image(resample=resample):
            return media.image_patches(image, "qwen2-vl", resample=resample).pixel_values

        cases[f"image-{resample}"] = (ours_image, hf_image)
    for rule, fps in (("qwen2-vl", 2.0), ("qwen3-vl", 2.0)):
        proc = _video_processor(rule)

        def hf_video(proc=proc, fps=fps):
            frames, _ = read_video_opencv(str(clip), sample_indices_fn=lambda metadata, **kw: proc.sample_frames(
                metadata, fps=fps))  # fmt: skip
            video = torch.from_numpy(np.asarray(frames)).permute(0, 3, 1, 2)
            return proc(videos=[video], return_tensors="pt")["pixel_values_videos"]

        def ours_video(rule=rule, fps=fps):
            return media.video_patches(clip, rule, fps=fps).pixel_values

        cases[f"video-{rule.split('-')[0]}"] = (ours_video, hf_video)
    if HF5:
        cases.update(_family_cases(image, clip))
    return cases


def _family_cases(image: Path, clip: Path) -> dict:
    from transformers.video_utils import read_video_opencv

    def module(name: str, kind: str):
        return importlib.import_module(f"transformers.models.{name}.{kind}_{name}")

    cases = {}
    try:
        cosmos = module("cosmos3_edge", "image_processing_pil").Cosmos3EdgeImageProcessorPil()
        minicpm = module("minicpmv4_6", "image_processing_pil").MiniCPMV4_6ImageProcessorPil()
        hy = module("hy_v4_vl", "video_processing").HYV4VLVideoProcessor()
    except ImportError:  # a 5.x release before these families
        return cases

    def hf_cosmos():
        return cosmos(images=[media.load_image(image)], return_tensors="pt")["pixel_values"]

    def hf_minicpm():
        return minicpm(images=[media.load_image(image)], return_tensors="pt")["pixel_values"]

    def hf_hy():
        frames, _ = read_video_opencv(str(clip), sample_indices_fn=lambda metadata, **kw: hy.sample_frames(
            metadata))  # fmt: skip
        video = torch.from_numpy(np.asarray(frames)).permute(0, 3, 1, 2)
        return hy(videos=[video], return_tensors="pt")["pixel_values_videos"]

    cases["image-cosmos3-edge"] = (lambda: media.image_patches(image, "cosmos3-edge").pixel_values, hf_cosmos)
    cases["slices-minicpm"] = (lambda: media.image_slices(image).navit(), hf_minicpm)
    cases["video-hy-v4-vl"] = (lambda: media.video_patches(clip, "hy-v4-vl").pixel_values, hf_hy)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = _cases(*_files(Path(tmp)))
        for name, (ours, ref) in cases.items():
            a, b = ours(), ref()  # warm-up and equality
            equal = a.shape == b.shape and torch.equal(a, b)
            wall: dict[str, list[float]] = {"mmpos": [], "hf": []}
            cpu: dict[str, list[float]] = {"mmpos": [], "hf": []}
            for _ in range(args.repeats):
                for side, fn in (("mmpos", ours), ("hf", ref)):
                    start, start_cpu = time.perf_counter(), time.process_time()
                    fn()
                    wall[side].append(time.perf_counter() - start)
                    cpu[side].append(time.process_time() - start_cpu)
            ms = {side: 1000 * statistics.median(t) for side, t in wall.items()}
            cpu_ms = {side: 1000 * statistics.median(t) for side, t in cpu.items()}
            rows.append({"case": name, "rows": list(a.shape), "equal": equal, "mmpos_ms": ms["mmpos"],
                         "hf_ms": ms["hf"], "ratio": ms["mmpos"] / ms["hf"], "mmpos_cpu_ms": cpu_ms["mmpos"],
                         "hf_cpu_ms": cpu_ms["hf"], "cpu_ratio": cpu_ms["mmpos"] / cpu_ms["hf"]})  # fmt: skip
    line = header("cpu", transformers, cv2, note=f"median of {args.repeats}, OpenCV threads {cv2.getNumThreads()}")
    print(line + "\n")
    print("| case | rows | equal | mmpos wall ms | HF wall ms | wall ratio | mmpos CPU ms | HF CPU ms | CPU ratio |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| `{r['case']}` | {' x '.join(map(str, r['rows']))} | {'yes' if r['equal'] else 'NO'} "
              f"| {r['mmpos_ms']:.1f} | {r['hf_ms']:.1f} | {r['ratio']:.2f} "
              f"| {r['mmpos_cpu_ms']:.1f} | {r['hf_cpu_ms']:.1f} | {r['cpu_ratio']:.2f} |")  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"header": line, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
