"""``mmpos.media`` against the Hugging Face Qwen-VL processors: file in, pixel rows out, on CPU.

Cases (files written once to a temporary folder with Pillow / OpenCV):

* ``image-pil``: a 1280 x 720 JPEG, ``image_patches(path, "qwen2-vl")`` against
  ``Qwen2VLImageProcessorPil`` (transformers 5.x) / ``Qwen2VLImageProcessor`` (4.x) on
  ``load_image(path)``: resized to 1288 x 728, 4784 rows;
* ``image-torch``: the same with ``resample="torch"`` against the torchvision image processor;
* ``video-qwen2``: a 4 s 640 x 360 MJPG clip at 30 fps, 2 fps sampling (8 frames),
  ``video_patches(path, "qwen2-vl", fps=2)`` against ``read_video_opencv`` with the
  processor's ``sample_frames`` then ``Qwen2VLVideoProcessor``;
* ``video-qwen3``: the same clip with the Qwen3-VL rules (``Qwen3VLVideoProcessor``).

Time: median of ``--repeats`` calls, the two sides interleaved call by call; process CPU time
(``time.process_time``) so that the load of a shared machine does not count, with
``--threads`` torch threads. Outputs are compared (``torch.equal`` of the rows).

    python benchmarks/media.py [--repeats 10] [--threads 1] [--out results.json]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch
import transformers
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
            times: dict[str, list[float]] = {"mmpos": [], "hf": []}
            for _ in range(args.repeats):
                for side, fn in (("mmpos", ours), ("hf", ref)):
                    start = time.process_time()
                    fn()
                    times[side].append(time.process_time() - start)
            ms = {side: 1000 * statistics.median(t) for side, t in times.items()}
            rows.append({"case": name, "rows": list(a.shape), "equal": equal, "mmpos_ms": ms["mmpos"],
                         "hf_ms": ms["hf"], "ratio": ms["mmpos"] / ms["hf"]})  # fmt: skip
            print(f"{name:12s} rows {tuple(a.shape)!s:14s} equal {equal!s:5s} mmpos {ms['mmpos']:8.1f} ms  "
                  f"hf {ms['hf']:8.1f} ms  ratio {ms['mmpos'] / ms['hf']:.2f}")  # fmt: skip
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.platform(), "processor": platform.processor(), "torch": torch.__version__,
            "transformers": transformers.__version__, "threads": args.threads, "repeats": args.repeats}  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
