"""Position ids of every transformers VLM family mmpos serves: its token-id path against the family's own ``get_rope_index``.

For each ``config.model_type`` of the scheme registry (``mmpos.schemes.model_types()``) that the
installed transformers has, one batch of 64 samples, each with 4 images and 2 videos (where the
family has videos; HunYuan-VL and GLM-Image read images only, 6 per sample) between runs of
5--40 text tokens, left padded, tokenised as the family's processor does (Qwen3-VL-style
families: a video as timestamped one-frame blocks; GLM-4V: frames as image tokens between the
video start and end tokens; ERNIE: frames merged in time; HY-V4-VL / HunYuan-VL: a newline
token per merged row; GLM-Image: a target grid per sample). Three calls take turns, in an order
shuffled each round (seeded):

* the family's own ``get_rope_index`` of the installed release (called as the model calls it:
  with ``mm_token_type_ids`` where it takes them);
* :func:`mmpos.integrations.hf_rope_index.get_rope_index` on the token ids (``rule="installed"``,
  no ``mm_token_type_ids``);
* the floor (:func:`copy_floor`): ``input_ids`` and ``attention_mask`` read and the ids' tensor
  written once, nothing computed -- what any token-id path that returns new ids costs at least;
  the family's time over it is the *ceiling*, the most speed-up any such code reaches in that process.

The outputs are checked equal before timing. Time: wall and process CPU time per call, and its
minor page faults (median). Peak
memory: extra MiB one call adds (CUDA ``max_memory_allocated``; CPU the rise of ``VmHWM`` with
glibc mapping blocks of 64 KiB or more, measured after all timings, as ``benchmarks/rotary.py``).
MiniCPM-V 4.7: an image is a thumbnail and 2 x 2 slices, a video 2--6 thumbnail frames (its
"images / videos" column counts crops and frames). ``--table qwen2-vl-images`` gives the earlier table instead (Qwen2-VL, 64 samples x 8 images,
with ``layout.build`` and the floor). ``--processes N`` times each family in N fresh processes instead, one after
the other, and reports the speed-up of each: one process's ratio moves with the reference's own time and with
page-fault storms, so a family near 30x is decided differently from one process to the next. Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/rope_index.py [--families qwen2_vl,glm4v] [--repeats 20]
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/rope_index.py --families hy_v4_vl,qwen2_vl --processes 8
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import resource
import statistics
import subprocess
import sys
import time
import types
from types import SimpleNamespace

import numpy as np
import torch
import transformers
from _env import header
from _memory import map_large_blocks, peak_mib
from torch import Tensor

from mmpos.integrations.hf_families import FAMILY_ROPE_INDEX, minicpmv4_7_rope_index, video_markers
from mmpos.integrations.hf_omni import audio_token_counts
from mmpos.integrations.hf_omni import get_rope_index as omni_rope_index
from mmpos.integrations.hf_rope_index import get_rope_index, installed_rule
from mmpos.layout import Image, Text, build
from mmpos.schemes import SCHEMES, model_types

#: families whose get_rope_index reads audio too (the Omni models): their thinker config and the class holding it
AUDIO_FAMILIES = {
    "qwen2_5_omni": ("Qwen2_5OmniThinkerConfig", "Qwen2_5OmniPreTrainedModelForConditionalGeneration"),
    "qwen3_omni_moe": ("Qwen3OmniMoeThinkerConfig", "Qwen3OmniMoePreTrainedModelForConditionalGeneration"),
}
#: token ids the Omni thinker configs leave unset (the checkpoints' config.json set them: Qwen2.5-Omni-7B's)
OMNI_IDS = {"vision_start_token_id": 151652, "vision_end_token_id": 151653, "audio_end_token_id": 151648}
#: per family, the config arguments its get_rope_index needs that the defaults lack
CONFIG_KWARGS = {
    "hunyuan_vl": {
        "text_config": {
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "mrope_section": [16, 16, 16, 16]},
            "head_dim": 128,
        }
    },
    # MiniCPM-V's default config leaves its marker tokens unset (the tokenizer's); any distinct ids do
    "minicpmv4_7": {
        name: 5001 + k
        for k, name in enumerate(
            ("image_token_id", "video_token_id", "image_start_id", "image_end_id")
            + ("slice_start_id", "slice_end_id", "newline_id")
        )
    },
}


def family(model_type: str):
    """``(config, model class)`` of ``model_type`` in the installed transformers, or a reason to skip it."""
    try:
        cm = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
        mm = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except ImportError:
        return f"transformers {transformers.__version__} has no {model_type}"
    if model_type in AUDIO_FAMILIES:  # the thinker config holds the token ids, the pretrained class get_rope_index
        config_name, owner_name = AUDIO_FAMILIES[model_type]
        config = getattr(cm, config_name)()
        for name, value in OMNI_IDS.items():
            if getattr(config, name, None) is None:
                setattr(config, name, value)
        return config, getattr(mm, owner_name)
    configs = [
        c
        for c in vars(cm).values()
        if isinstance(c, type)
        and issubclass(c, transformers.PretrainedConfig)
        and c.model_type == model_type
        and "vision_config" in getattr(c, "sub_configs", {})
    ]
    owners = [c for c in vars(mm).values() if isinstance(c, type) and "get_rope_index" in c.__dict__]
    if not configs or not owners:
        return f"transformers {transformers.__version__}: {model_type} has no get_rope_index"
    return configs[0](**CONFIG_KWARGS.get(model_type, {})), owners[0]


def minicpm_batch(config, samples: int, images: int, videos: int, seed: int = 0) -> dict:
    """MiniCPM-V 4.7 (16x): an image is a thumbnail and 2 x 2 slices, a video 2--6 thumbnail frames."""
    rng = random.Random(seed)
    c = CONFIG_KWARGS["minicpmv4_7"]
    rows, sizes, video_sizes = [], [], []
    for _ in range(samples):
        ids, kinds = [], []

        def put(token, kind, n=1, ids=ids, kinds=kinds):
            ids.extend([token] * n)
            kinds.extend([kind] * n)

        def crop(token, kind, table, start, end):
            h, w = rng.randint(4, 12), rng.randint(4, 12)
            table.append((4 * h, 4 * w))
            put(start, 0)
            put(token, kind, h * w)
            put(end, 0)

        blocks = ["image"] * images + ["video"] * videos
        rng.shuffle(blocks)
        for kind in blocks:
            put(rng.randrange(10, 1000), 0, rng.randint(5, 40))
            if kind == "image":
                crop(c["image_token_id"], 1, sizes, c["image_start_id"], c["image_end_id"])
                for row in range(2):
                    if row:
                        put(c["newline_id"], 0)
                    for _ in range(2):
                        crop(c["image_token_id"], 1, sizes, c["slice_start_id"], c["slice_end_id"])
            else:
                for _ in range(rng.randint(2, 6)):
                    crop(c["video_token_id"], 2, video_sizes, c["image_start_id"], c["image_end_id"])
        put(rng.randrange(10, 1000), 0, rng.randint(5, 40))
        rows.append((ids, kinds))
    length = max(len(r) for r, _ in rows)
    input_ids = torch.zeros(samples, length, dtype=torch.long)
    mm_types, mask = torch.zeros_like(input_ids), torch.zeros_like(input_ids)
    for i, (r, k) in enumerate(rows):
        input_ids[i, length - len(r) :], mm_types[i, length - len(r) :] = torch.tensor(r), torch.tensor(k)
        mask[i, length - len(r) :] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": mask,
        "mm_token_type_ids": mm_types,
        "target_sizes": torch.tensor(sizes),
        "target_sizes_videos": torch.tensor(video_sizes),
    }


def omni_batch(model_type: str, config, samples: int, images: int, videos: int, seed: int = 0) -> dict:
    """An Omni batch (``use_audio_in_video=True``): per sample ``images`` images, ``videos`` videos with their
    audio (interleaved by time as the processor does: Qwen3-Omni by position, video first on ties; Qwen2.5-Omni
    in chunks of ``seconds_per_chunk``) and one audio alone, between runs of text, left padded."""
    rng = random.Random(seed)
    m, pps = config.vision_config.spatial_merge_size, config.position_id_per_seconds
    vs, ve, a_s, a_e = (
        getattr(config, f"{n}_token_id") for n in ("vision_start", "vision_end", "audio_start", "audio_end")
    )
    special = {vs, ve, a_s, a_e, config.image_token_id, config.video_token_id, config.audio_token_id}
    text_ids = [i for i in range(10, 2000) if i not in special]
    rows, image_grids, video_grids, seconds, seqlens = [], [], [], [], []
    for _ in range(samples):
        ids = []
        blocks = ["image"] * images + ["video"] * videos + ["audio"]
        rng.shuffle(blocks)
        for kind in blocks:
            ids += [rng.choice(text_ids) for _ in range(rng.randint(5, 40))]
            if kind == "image":
                g = (1, m * rng.randint(4, 16), m * rng.randint(4, 16))
                image_grids.append(g)
                ids += [vs] + [config.image_token_id] * (g[1] * g[2] // m**2) + [ve]
                continue
            n = rng.randint(200, 1500)  # mel frames
            seqlens.append(n)
            n_audio = int(audio_token_counts(config, torch.tensor([n]))[0])
            if kind == "audio":
                ids += [a_s] + [config.audio_token_id] * n_audio + [a_e]
                continue
            g = (rng.randint(2, 6), m * rng.randint(4, 10), m * rng.randint(4, 10))
            s = rng.choice((0.5, 1.0, 2.0))
            video_grids.append(g)
            seconds.append(s)
            hw = g[1] * g[2] // m**2
            t = torch.arange(g[0]).repeat_interleave(hw).float() * s * pps  # (video tokens,) positions
            a = torch.arange(n_audio).float()
            kinds = torch.cat([torch.zeros_like(t), torch.ones_like(a)])
            if model_type == "qwen2_5_omni":  # chunks: video chunk 0, audio chunk 0, video chunk 1, ...
                per = int(pps * config.seconds_per_chunk)
                key = torch.cat([t.long() // per, a.long() // per]).double()
            else:
                key = torch.cat([t, a]).double()
            order = torch.from_numpy(np.lexsort((kinds.numpy(), key.numpy())))  # stable: index order kept
            content = torch.where(kinds[order] == 0, config.video_token_id, config.audio_token_id)
            ids += [vs, a_s] + content.tolist() + [a_e, ve]
        ids += [rng.choice(text_ids) for _ in range(rng.randint(5, 40))]
        rows.append(ids)
    length = max(map(len, rows))
    input_ids = torch.zeros(samples, length, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, r in enumerate(rows):
        input_ids[i, length - len(r) :], mask[i, length - len(r) :] = torch.tensor(r), 1
    return {
        "input_ids": input_ids,
        "image_grid_thw": torch.tensor(image_grids).view(-1, 3) if image_grids else None,
        "video_grid_thw": torch.tensor(video_grids).view(-1, 3) if video_grids else None,
        "attention_mask": mask,
        "use_audio_in_video": True,
        "audio_seqlens": torch.tensor(seqlens),
        "second_per_grids": torch.tensor(seconds) if seconds else None,
    }


def make_batch(model_type: str, config, samples: int, images: int, videos: int, seed: int = 0) -> dict:
    """Token ids, types, mask and grids of a left-padded batch tokenised as ``model_type``'s processor does."""
    if model_type == "minicpmv4_7":
        return minicpm_batch(config, samples, images, videos, seed)
    if model_type in AUDIO_FAMILIES:
        return omni_batch(model_type, config, samples, images, videos, seed)
    rng = random.Random(seed)
    own = FAMILY_ROPE_INDEX.get(model_type)
    m = getattr(config.vision_config, "spatial_merge_size", 2)
    image_id = config.image_token_id
    video_id = getattr(config, "video_token_id", None)
    start_id = getattr(config, "vision_start_token_id", None) or 7  # Qwen (4.57) finds blocks after it
    markers = video_markers(config)
    temporal_merge = getattr(config.vision_config, "temporal_merge_size", None) or 1
    frames = own is None and SCHEMES[model_types()[model_type]].frames
    if model_type in ("hunyuan_vl", "glm_image"):  # images only
        images, videos = images + videos, 0
    special = {image_id, video_id, start_id, *(markers or ())}
    special |= {getattr(config, n, None) for n in ("image_start_token_id", "image_end_token_id", "im_start_id")}
    text_ids = [i for i in range(10, 2000) if i not in special]
    rows, image_grids, video_grids, seconds, per_sample = [], [], [], [], []
    for _ in range(samples):
        ids, kinds, n_grids = [], [], 0

        def text(n, ids=ids, kinds=kinds):
            ids.extend(rng.choice(text_ids) for _ in range(n))
            kinds.extend([0] * n)

        def tokens(token, kind, n, ids=ids, kinds=kinds):
            ids.extend([token] * n)
            kinds.extend([kind] * n)

        blocks = ["image"] * images + ["video"] * videos
        rng.shuffle(blocks)
        for kind in blocks:
            text(rng.randint(5, 40))
            if kind == "image":
                h, w = m * rng.randint(4, 16), m * rng.randint(4, 16)  # up to 16 x 16 merged tokens
                if model_type == "glm_image":  # grids in tokens, between image start / end tokens
                    h, w = h // m, w // m
                    image_grids.append((1, h, w))
                    tokens(config.image_start_token_id, 0, 1)
                    tokens(image_id, 1, h * w)
                    tokens(config.image_end_token_id, 0, 1)
                    n_grids += 1
                    continue
                image_grids.append((1, h, w))
                if model_type == "hunyuan_vl":  # a newline per row and 2 boundary tokens, between im_start / im_end
                    tokens(config.im_start_id, 0, 1)
                    tokens(image_id, 1, (h // m) * (w // m + 1) + 2)
                    tokens(config.im_end_id, 0, 1)
                    continue
                tokens(start_id, 0, 1)
                tokens(image_id, 1, (h // m) * (w // m + (model_type == "hy_v4_vl")))
                continue
            t, h, w = temporal_merge * rng.randint(2, 6), m * rng.randint(4, 10), m * rng.randint(4, 10)
            video_grids.append((t, h, w))
            seconds.append(rng.choice((0.5, 1.0, 2.0)))
            if model_type == "hy_v4_vl":
                tokens(video_id, 2, t * (h // m) * (w // m + 1))
            elif frames:  # per frame: a timestamp, then the frame's tokens
                if markers is not None:
                    tokens(markers[0], 0, 1)
                for _ in range(t):
                    text(3)
                    tokens(start_id, 0, 1)
                    tokens(image_id if markers is not None else video_id, 2, h * w // m**2)
                if markers is not None:
                    tokens(markers[1], 0, 1)
            else:
                tokens(start_id, 0, 1)
                tokens(video_id, 2, t // temporal_merge * h * w // m**2)
        text(rng.randint(5, 40))
        if model_type == "glm_image":  # generation: an image start token and one target grid
            tokens(config.image_start_token_id, 0, 1)
            image_grids.append((1, rng.randint(4, 16), rng.randint(4, 16)))
            n_grids += 1
        rows.append((ids, kinds))
        per_sample.append(n_grids)
    length = max(len(r) for r, _ in rows)
    input_ids = torch.zeros(samples, length, dtype=torch.long)
    mm_types, mask = torch.zeros_like(input_ids), torch.zeros_like(input_ids)
    for i, (r, k) in enumerate(rows):
        input_ids[i, length - len(r) :], mm_types[i, length - len(r) :] = torch.tensor(r), torch.tensor(k)
        mask[i, length - len(r) :] = 1
    grid = lambda g: torch.tensor(g, dtype=torch.long).view(-1, 3) if g else None
    batch = {"input_ids": input_ids, "attention_mask": mask, "image_grid_thw": grid(image_grids)}
    batch["mm_token_type_ids"] = mm_types
    if videos:
        batch["video_grid_thw"] = grid(video_grids)
    if model_type == "qwen2_5_vl":
        batch["second_per_grid_ts"] = torch.tensor(seconds)
    if model_type == "glm_image":
        batch["images_per_sample"] = torch.tensor(per_sample)
    return batch


def calls(model_type: str, config, model_cls, batch: dict, rule: str):
    """``(transformers call, mmpos call)`` on ``batch``."""
    owner = SimpleNamespace(config=config)
    if hasattr(model_cls, "get_vision_position_ids"):
        owner.get_vision_position_ids = types.MethodType(model_cls.get_vision_position_ids, owner)
    if model_type in AUDIO_FAMILIES:
        owner.spatial_merge_size = config.vision_config.spatial_merge_size
        for name in ("get_llm_pos_ids_for_vision", "get_chunked_index"):
            setattr(owner, name, types.MethodType(getattr(model_cls, name), owner))
        return (lambda: model_cls.get_rope_index(owner, **batch)), (lambda: omni_rope_index(config, **batch))
    params = inspect.signature(model_cls.get_rope_index).parameters
    ref_kwargs = {k: v for k, v in batch.items() if k in params}
    ours = {k: v for k, v in batch.items() if k != "mm_token_type_ids"}
    if model_type == "minicpmv4_7":
        owner._group_visual_frames = types.MethodType(model_cls._group_visual_frames, owner)
        owner._frame_end_idx = model_cls._frame_end_idx
        return (lambda: model_cls.get_rope_index(owner, **ref_kwargs)), (lambda: minicpmv4_7_rope_index(config, **ours))
    return (lambda: model_cls.get_rope_index(owner, **ref_kwargs)), (lambda: get_rope_index(config, **ours, rule=rule))


def time_rounds(fns: dict, repeats: int, sync, shuffle: bool = True, faults: dict | None = None) -> tuple[dict, dict]:
    """Wall and process CPU seconds of ``repeats`` calls per function; the functions take turns
    in every round so that all of them see the same load (the CPU is shared), in an order
    shuffled each round (seeded): the call right after transformers' finds the caches cold and
    the memory transformers freed handed back to the system (page faults), so no function
    always takes that place. ``faults``: filled with each call's minor page faults (a fresh page
    the allocator maps costs microseconds on a VM: a call whose output lands on fresh pages can
    take twice as long, depending on what the process allocated and freed before)."""
    for fn in fns.values():
        fn()  # warm-up
    wall, cpu = {name: [] for name in fns}, {name: [] for name in fns}
    if faults is not None:
        faults.update({name: [] for name in fns})
    names, rng = list(fns), random.Random(0)
    for _ in range(repeats):
        order = rng.sample(names, len(names)) if shuffle else names
        for name in order:
            fn = fns[name]
            sync()
            minflt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            if faults is not None:
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - minflt)
    return wall, cpu


def copy_floor(batch: dict, shape: tuple[int, ...]):
    """The memory-bound floor of any token-id path: read ``input_ids`` and ``attention_mask`` and write new
    ``shape`` ``(rows, B, L)`` ids (``input_ids * attention_mask`` on every row), nothing computed."""
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def floor() -> Tensor:
        out = torch.empty(shape, dtype=ids.dtype)
        for row in out:
            torch.mul(ids, mask, out=row)
        return out

    return floor


def timed_family(model_type: str, args, rule: str) -> dict | str:
    """One family's batch and its three calls timed in ``args.repeats`` shuffled rounds (outputs checked equal
    first): wall and CPU seconds and minor page faults per call, per function; or why the release lacks it."""
    found = family(model_type)
    if isinstance(found, str):
        return found
    config, model_cls = found
    batch = make_batch(model_type, config, args.samples, args.images, args.videos)
    ref, ours = calls(model_type, config, model_cls, batch, rule)
    want, got = ref(), ours()
    assert torch.equal(want[0], got[0]), model_type
    assert torch.equal(want[1].view(got[1].shape).to(got[1].dtype), got[1]), model_type
    faults = {}
    fns = {"ref": ref, "ours": ours, "floor": copy_floor(batch, tuple(want[0].shape))}
    wall, cpu = time_rounds(fns, args.repeats, lambda: None, faults=faults)
    return {"batch": batch, "calls": (ref, ours), "wall": wall, "cpu": cpu, "faults": faults}


def chosen_families(args) -> list[str]:
    """``--families``, else every model type of the registry (a thinker: its Omni model's rule)."""
    return [m for m in args.families.split(",") if m] or sorted(m for m in model_types() if not m.endswith("_thinker"))


def table_end(skipped: list[str]) -> None:
    """Why each family left out was left out, and the closing header."""
    for reason in skipped:
        print(f"skipped: {reason}")
    print(header("cpu", transformers, note="end"))


def processes_table(args) -> None:
    """``--processes N``: each family timed in N fresh processes, one after the other (the ratio of one process
    moves with the reference's own time and with page-fault storms, docs/benchmarks/multimodal.md): the speed-up
    of each (medians of its rounds), how many reach 30x, the ranges of the medians, and the processes whose mmpos
    calls ran in a fault storm (a median of more than 100 minor faults per call: the output on fresh pages)."""
    print(header("cpu", transformers, note=f"{args.processes} fresh processes per family, {args.repeats} rounds each"))
    print(
        "| `model_type` | speed-up of each process, sorted | processes at 30x or more | transformers median (ms), "
        "range | mmpos median (ms), range | floor median (ms), range | ceiling (transformers / floor), range "
        "| processes in a fault storm (mmpos) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    skipped = []
    for model_type in chosen_families(args):
        runs = []
        for _ in range(args.processes):
            cmd = [sys.executable, __file__, "--one-process-json", f"--families={model_type}"]
            cmd += [f"--{k}={getattr(args, k)}" for k in ("repeats", "samples", "images", "videos")]
            run = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            if "skipped" in run:  # not in this release
                skipped.append(run["skipped"])
                break
            runs.append(run)
        if not runs:
            continue
        speed = sorted(r["ref"] / r["ours"] for r in runs)
        ceiling = [r["ref"] / r["floor"] for r in runs]  # the most any code returning new ids reaches there

        def span(key: str, runs=runs) -> str:
            return f"{min(r[key] for r in runs) * 1e3:.2f}-{max(r[key] for r in runs) * 1e3:.2f}"

        print(
            f"| `{model_type}` | {', '.join(f'{x:.1f}' for x in speed)} | {sum(x >= 30 for x in speed)} / {len(runs)} "
            f"| {span('ref')} | {span('ours')} | {span('floor')} | {min(ceiling):.0f}-{max(ceiling):.0f}x "
            f"| {sum(r['faults'] > 100 for r in runs)} |"
        )
    table_end(skipped)


def one_process_json(args) -> None:
    """``--one-process-json``: one family (``--families``) timed in this process, printed as one JSON line (wall
    medians in seconds; mmpos's median minor faults per call) for :func:`processes_table`, or why the installed
    release lacks it (``{"skipped": reason}``)."""
    timed = timed_family(args.families, args, installed_rule())
    if isinstance(timed, str):
        print(json.dumps({"skipped": timed}))
        return
    wall, med = timed["wall"], statistics.median
    print(json.dumps({**{k: med(wall[k]) for k in ("ref", "ours", "floor")}, "faults": med(timed["faults"]["ours"])}))


def families_table(args) -> None:
    rule = installed_rule()
    print(header("cpu", transformers, note=f"timings; rule {rule}; {args.repeats} shuffled rounds per family"))
    rows, skipped = [], []
    for model_type in chosen_families(args):
        timed = timed_family(model_type, args, rule)
        if isinstance(timed, str):
            skipped.append(timed)
        else:
            rows.append((model_type, timed))
    map_large_blocks()  # after all timings: it slows allocations
    med = statistics.median
    print(header("cpu", transformers, note="peak memory (after the timings)"))
    print(
        "| `model_type` | scheme | batch (tokens) | images / videos | transformers median (ms) | mmpos median (ms) "
        "| speed-up, median | speed-up, best | speed-up, CPU median | peak MiB (transformers / mmpos) "
        "| page faults per call, median (transformers / mmpos) | floor median (ms) | mmpos / floor "
        "| ceiling (transformers / floor) |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model_type, timed in rows:
        batch, wall, cpu, faults, (ref, ours) = (timed[k] for k in ("batch", "wall", "cpu", "faults", "calls"))
        ref(), ours()
        mib = peak_mib(ref, "cpu"), peak_mib(ours, "cpu")
        b, length = batch["input_ids"].shape
        if model_type == "minicpmv4_7":  # crops: thumbnails and slices, video frames
            n_img, n_vid = batch["target_sizes"].shape[0], batch["target_sizes_videos"].shape[0]
        elif model_type in AUDIO_FAMILIES:  # videos with their audio, and the audios alone
            n_img, n_vid = batch["image_grid_thw"].shape[0], batch["video_grid_thw"].shape[0]
            n_vid = f"{n_vid} (+ audio) / {batch['audio_seqlens'].shape[0] - n_vid} audio"
        else:
            n_img = 0 if batch["image_grid_thw"] is None else batch["image_grid_thw"].shape[0]
            n_vid = batch["video_grid_thw"].shape[0] if "video_grid_thw" in batch else 0
        scheme = model_types()[model_type]
        print(
            f"| `{model_type}` | `{scheme}` | {b} x {length} | {n_img} / {n_vid} | {med(wall['ref']) * 1e3:.1f} | "
            f"{med(wall['ours']) * 1e3:.2f} | {med(wall['ref']) / med(wall['ours']):.1f}x | "
            f"{min(wall['ref']) / min(wall['ours']):.1f}x | {med(cpu['ref']) / med(cpu['ours']):.1f}x | "
            f"{mib[0]:.1f} / {mib[1]:.1f} | {med(faults['ref']):.0f} / {med(faults['ours']):.0f} | "
            f"{med(wall['floor']) * 1e3:.2f} | {med(wall['ours']) / med(wall['floor']):.1f}x | "
            f"{med(wall['ref']) / med(wall['floor']):.0f}x |"
        )
    table_end(skipped)


def qwen2_vl_images_table(args) -> None:
    """The earlier table: Qwen2-VL, 64 samples x 8 images, token ids and ``layout.build``."""
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

    config = Qwen2VLConfig()
    rng = random.Random(0)
    rows, segments, grids = [], [], []
    for _ in range(args.samples):
        ids, segs = [], []
        for _ in range(8):
            n_text = rng.randint(5, 40)
            ids += [rng.randrange(10, 1000) for _ in range(n_text - 1)] + [config.vision_start_token_id]
            h, w = 2 * rng.randint(4, 16), 2 * rng.randint(4, 16)
            ids += [config.image_token_id] * (h * w // 4)
            segs += [Text(n_text), Image((1, h, w))]
            grids.append((1, h, w))
        n_text = rng.randint(5, 40)
        ids += [rng.randrange(10, 1000) for _ in range(n_text)]
        segs.append(Text(n_text))
        rows.append(ids)
        segments.append(segs)
    length = max(map(len, rows))
    input_ids = torch.zeros(args.samples, length, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, r in enumerate(rows):
        input_ids[i, length - len(r) :], mask[i, length - len(r) :] = torch.tensor(r), 1
    grids = torch.tensor(grids)
    holder = SimpleNamespace(config=config)
    if hasattr(Qwen2VLModel, "get_vision_position_ids"):
        holder.get_vision_position_ids = types.MethodType(Qwen2VLModel.get_vision_position_ids, holder)
    hf_kwargs = {"input_ids": input_ids, "image_grid_thw": grids, "attention_mask": mask}
    if "mm_token_type_ids" in inspect.signature(Qwen2VLModel.get_rope_index).parameters:
        hf_kwargs["mm_token_type_ids"] = (input_ids == config.image_token_id).long()
    rule = installed_rule()
    fns = {
        "transformers `Qwen2VLModel.get_rope_index`": lambda: Qwen2VLModel.get_rope_index(holder, **hf_kwargs),
        "mmpos `integrations.hf_rope_index.get_rope_index` (token ids)": lambda: get_rope_index(
            config, input_ids, grids, attention_mask=mask, rule=rule
        ),
        "mmpos `layout.build` (segments)": lambda: build(segments, "qwen2-vl", padding_side="left", rule=rule),
    }
    ref = next(iter(fns.values()))()
    checked = list(fns.values())
    fns["floor: the inputs read, the ids written once (`copy_floor`)"] = copy_floor(hf_kwargs, tuple(ref[0].shape))
    for fn in checked:
        out = fn()
        ids, deltas = (out.position_ids, out.rope_deltas) if hasattr(out, "position_ids") else out
        assert torch.equal(ids, ref[0]) and torch.equal(deltas, ref[1])
    times, cpu = time_rounds(fns, args.repeats, lambda: None)
    map_large_blocks()
    mib = {}
    for name, fn in fns.items():
        fn()
        mib[name] = peak_mib(fn, "cpu")
    base, base_cpu, med = next(iter(times.values())), next(iter(cpu.values())), statistics.median
    print(header("cpu", transformers, note=f"batch {args.samples} x {length} tokens, {grids.shape[0]} images"))
    print(
        "| method | best (ms) | median (ms) | speed-up, best | speed-up, median | speed-up, CPU median | peak (MiB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, t in times.items():
        print(
            f"| {name} | {min(t) * 1e3:.2f} | {med(t) * 1e3:.2f} | {min(base) / min(t):.1f}x | "
            f"{med(base) / med(t):.1f}x | {med(base_cpu) / med(cpu[name]):.1f}x | {mib[name]:.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=("families", "qwen2-vl-images"), default="families")
    parser.add_argument("--families", default="", help="comma-separated model types (default: every one)")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--videos", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--processes", type=int, default=1, help="time each family in this many fresh processes (families table)"
    )
    parser.add_argument("--one-process-json", action="store_true", help=argparse.SUPPRESS)  # --processes' children
    args = parser.parse_args()
    if args.one_process_json:
        one_process_json(args)
    elif args.table == "families" and args.processes > 1:
        processes_table(args)
    else:
        (families_table if args.table == "families" else qwen2_vl_images_table)(args)


if __name__ == "__main__":
    main()
