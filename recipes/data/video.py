"""Video event clips, written to and read back from video files with OpenCV.

A clip shows ``frames`` frames of a ``rows x cols`` cell scene with static coloured
objects; at frame ``f`` the mark (a white square, :func:`recipes.data.scenes.paint_mark`)
flashes in cell ``(r, c)`` for ``duration`` frames. Questions (token ids of
:mod:`recipes.data.vocab`: those of :mod:`recipes.data.grounding` plus ``WHEN`` and ``EVENT``,
:data:`~recipes.data.vocab.VIDEO_VOCAB_SIZE` in all; the names stay importable from here):

* ``WHEN`` -> ``[index f, EMPTY]`` -- when does the flash start;
* ``EVENT`` -> ``[row r, column c]`` -- where is it.

Clips go through a real codec (Motion-JPEG in an AVI container by default), so the
frames the model sees carry compression artefacts like decoded video does.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import cv2
import numpy as np
import torch
from torch import Tensor

from .scenes import add_noise, paint_mark, random_scene, render_scene
from .vocab import ANSWER, EMPTY, EVENT, INDEX0, MAX_CELLS, VIDEO_VOCAB_SIZE, WHEN

__all__ = [
    "EVENT",
    "VIDEO_VOCAB_SIZE",
    "WHEN",
    "EventClips",
    "flash_clip",
    "make_event_clips",
    "read_video",
    "roundtrip_video",
    "write_video",
]


def write_video(path: str, frames: np.ndarray, fps: float = 8.0, codec: str = "MJPG") -> None:
    """Write float ``(T, 3, H, W)`` RGB frames in [0, 1] to ``path`` with OpenCV."""
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"frames must be (T, 3, H, W), got {frames.shape}")
    _t, _, h, w = frames.shape
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*codec), fps, (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV could not open a {codec} writer for {path}")
    for frame in frames:
        rgb = (frame.transpose(1, 2, 0) * 255.0 + 0.5).astype(np.uint8)
        writer.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    writer.release()


def read_video(path: str) -> np.ndarray:
    """Read a video file into float32 ``(T, 3, H, W)`` RGB frames in [0, 1]."""
    cap = cv2.VideoCapture(path)
    frames = []
    while True:
        ok, bgr = cap.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB).transpose(2, 0, 1))
    cap.release()
    if not frames:
        raise RuntimeError(f"OpenCV read no frame from {path}")
    return np.stack(frames).astype(np.float32) / 255.0


def roundtrip_video(frames: np.ndarray, path: str) -> np.ndarray:
    """``frames`` after writing them to ``path`` and decoding them again (codec artefacts included)."""
    write_video(path, frames)
    return read_video(path)


def flash_clip(
    base: np.ndarray,
    frames: int,
    event: tuple[int, int, int],
    duration: int,
    cell: int,
    rng: np.random.Generator,
    noise: float,
) -> np.ndarray:
    """``(T, 3, H, W)``: the still ``base`` with the mark in cell ``(r, c)`` for frames
    ``f .. f + duration - 1`` (``event = (f, r, c)``), plus Gaussian noise of std ``noise``."""
    f, r, c = event
    clip = np.repeat(base[None], frames, axis=0)
    paint_mark(clip[f : f + duration], r, c, cell)  # a view: paints those frames of clip
    return add_noise(clip, noise, rng)


@dataclass(frozen=True)
class EventClips:
    """``clips`` ``(B, T, 3, H, W)``; ``question`` ``(B, 2)`` = ``[kind, ANSWER]``; ``answer`` ``(B, 2)``;
    ``event`` ``(B, 3)`` = ``(frame, row, col)``."""

    clips: Tensor
    question: Tensor
    answer: Tensor
    event: Tensor


def make_event_clips(
    n: int,
    frames: int,
    rows: int,
    cols: int,
    seed: int,
    cell: int = 16,
    duration: int = 2,
    roundtrip: bool = True,
    noise: float = 0.03,
) -> EventClips:
    """``n`` clips, half ``WHEN`` and half ``EVENT`` questions; ``roundtrip`` encodes through a file."""
    if not 1 <= frames - duration + 1 <= MAX_CELLS or duration < 1:
        raise ValueError(f"frames - duration + 1 must be in [1, {MAX_CELLS}], got frames={frames}, duration={duration}")
    if not (1 <= rows <= MAX_CELLS and 1 <= cols <= MAX_CELLS):
        raise ValueError(f"rows and cols must be in [1, {MAX_CELLS}], got {(rows, cols)}")
    rng = np.random.default_rng(seed)
    clips, questions, answers, events = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            scene = random_scene(rows, cols, max(1, rows * cols // 3), rng)
            f = int(rng.integers(frames - duration + 1))
            r, c = int(rng.integers(rows)), int(rng.integers(cols))
            clip = flash_clip(render_scene(scene, cell, rng, noise=0.0), frames, (f, r, c), duration, cell, rng, noise)
            clips.append(roundtrip_video(clip, os.path.join(tmp, f"clip{i}.avi")) if roundtrip else clip)
            if i % 2 == 0:
                questions.append([WHEN, ANSWER])
                answers.append([INDEX0 + f, EMPTY])
            else:
                questions.append([EVENT, ANSWER])
                answers.append([INDEX0 + r, INDEX0 + c])
            events.append([f, r, c])
    return EventClips(
        torch.from_numpy(np.stack(clips)),
        torch.tensor(questions, dtype=torch.long),
        torch.tensor(answers, dtype=torch.long),
        torch.tensor(events, dtype=torch.long),
    )
