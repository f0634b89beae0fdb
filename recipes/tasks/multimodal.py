"""Multimodal tasks: grounding, video events, multi-image needle in a haystack.

Each task trains a :class:`recipes.vlm.TinyVLM` -- an open_clip vision tower with
random initialisation (:func:`vision_tower`), Qwen2-VL's 2x2 patch merger and a small
causal decoder -- to answer a question with two tokens. The sweep's *encoder* string
names a layout scheme (see :data:`mmpos.schemes.SCHEMES`), optionally with
an option after ``@``:

* ``v2pe@0.0625`` trains and evaluates V2PE with that fixed visual step ``delta``;
  ``v2pe@rand`` draws ``delta`` per image in training (V2PE's recipe) and evaluates with
  ``data.eval_delta``;
* ``hope`` draws HoPE's temporal scale per block in training and evaluates with
  ``data.hope_scale``; ``hope@s`` evaluates with ``s``;
* ``circlerope@strategy_4`` (``strategy_2``, ``strategy_3``): CircleRoPE's AGE
  (:mod:`mmpos.age`), the decoder layers the strategy marks on Circle-RoPE positions, the
  others on the ``qwen2.5-vl`` layout of the same segments.

Sequences (one per sample, the same structure for the whole batch):
``[BOS, <visual parts>, question ..., ANSWER, answer[0]]`` (the images, then the
question, as in a VLM chat turn); the loss predicts ``answer[0]`` at ``ANSWER`` and ``answer[1]`` at
``answer[0]`` (teacher forcing); ``acc`` is the exact match of both tokens.

Positions are computed outside the model, from the batch structure, with
:func:`mmpos.layout.build` (grids in patches before the merge; the merged grid has one
token per scene cell). Batches: ``train_batch(step)`` draws its data from the seed
``seed * 1_000_003 + step``; the evaluation sets are fixed per task and seed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmpos.age import AGE_STRATEGIES, age_coords
from mmpos.coords import Coords
from mmpos.layout import Layout, build
from mmpos.runner.tasks import NUMBER, Task, parse_encoders, register_task
from mmpos.schemes import SCHEMES

from ..data import grounding, haystack, relations, video
from ..vlm import Part, PatchTokens, TinyVLM, segments_of

__all__ = ["build_grounding", "build_haystack", "build_video", "parse_scheme", "vision_tower"]

_VISION = {"width": 32, "layers": 1, "heads": 2, "patch_size": 8, "pos": "none"}
_DECODER = {"dim": 64, "depth": 3, "num_heads": 4, "num_kv_heads": 4, "theta": 10.0}
_EVAL_CHUNK = 64


#: ``@`` variants per scheme: V2PE's visual step (or ``rand``), HoPE's evaluation temporal scale, CircleRoPE's AGE
_SCHEME_VARIANTS = {"v2pe": ("rand", NUMBER), "hope": (NUMBER,), "circlerope": AGE_STRATEGIES}


def parse_scheme(encoder: str) -> tuple[str, str | None]:
    """``"v2pe@0.25"`` -> ``("v2pe", "0.25")``; ``"qwen2-vl"`` -> ``("qwen2-vl", None)``."""
    ((scheme, option),) = parse_encoders(encoder, _SCHEME_VARIANTS, combine=False).items
    if scheme not in SCHEMES:
        raise ValueError(f"encoder must name a layout scheme {sorted(SCHEMES)} (optionally '@option'), got {encoder!r}")
    return scheme, option


def vision_tower(cfg: dict) -> tuple[nn.Module, int]:
    """The run's vision tower (random init) and its width.

    An open_clip ``VisionTransformer`` of ``cfg["vision"]`` (``width``, ``layers``,
    ``heads``, ``patch_size``) converted by :func:`mmpos.integrations.open_clip.convert`
    to the tower encoder ``cfg["vision"]["pos"]`` and wrapped in :class:`recipes.vlm.PatchTokens`.
    The recipes use ``pos: none``, the same for every decoder scheme: a tower with its own
    2-D position encoding can solve the spatial part of the questions before the decoder
    sees the tokens, and the comparison is about the decoder's layout. Within a merged
    token the merger's concatenation still orders its 2x2 patches.
    """
    from open_clip.transformer import VisionTransformer

    from mmpos.integrations.open_clip import convert

    v = cfg["vision"]
    nominal = 4 * v["patch_size"]  # only sizes the unused table; the converted tower takes any grid
    tower = VisionTransformer(
        nominal, v["patch_size"], v["width"], v["layers"], v["heads"], mlp_ratio=4.0, output_dim=v["width"],
        output_tokens=True,
    )  # fmt: skip
    convert(tower, pos=v["pos"], keep_abs_pos=False)
    return PatchTokens(tower), v["width"]


def _layout_options(scheme: str, option: str | None, data: dict, training: bool) -> dict[str, Any]:
    """Keyword arguments of :func:`mmpos.layout.build` for ``scheme@option``."""
    if scheme == "v2pe":
        if option is None:
            raise ValueError("v2pe needs a visual step: 'v2pe@<delta>' or 'v2pe@rand'")
        if option == "rand":
            return {"training": True} if training else {"delta": float(data["eval_delta"])}
        try:
            return {"delta": float(option)}
        except ValueError:
            raise ValueError(f"v2pe option must be a number in (0, 1] or 'rand', got {option!r}") from None
    if scheme == "circlerope" and option in AGE_STRATEGIES:  # AGE: a per-layer choice, not a layout option
        return {}
    if scheme == "hope":
        if training:
            return {"training": True}
        try:
            return {"temporal_scale": float(option if option is not None else data["hope_scale"])}
        except ValueError:
            raise ValueError(
                f"hope option must be a positive number (the eval temporal scale), got {option!r}"
            ) from None
    if option is not None:
        raise ValueError(f"scheme {scheme!r} takes no '@' option, got {option!r}")
    return {}


class _Answerer:
    """The model of a run and its glue: layout, answer logits, loss, accuracy."""

    def __init__(self, cfg: dict, encoder: str, vocab_size: int, device: torch.device) -> None:
        self.scheme, self.option = parse_scheme(encoder)
        self.data = cfg["data"]
        _layout_options(self.scheme, self.option, self.data, False)  # bad options fail before training
        tower, width = vision_tower(cfg)
        dec = dict(cfg["decoder"])
        theta = float(dec.pop("theta"))
        self.model = TinyVLM(tower, width, cfg["vision"]["patch_size"], vocab_size, self.scheme,
                             pos_kwargs={"theta": theta}, **dec)  # fmt: skip
        self.device = device

    def layout(self, parts: list[Part], training: bool, seed: int) -> Layout:
        batch = parts[0][1].shape[0]
        segments = segments_of(parts, self.model.patch_size)
        options = _layout_options(self.scheme, self.option, self.data, training)
        gen = torch.Generator().manual_seed(seed) if options.get("training") else None
        return build([segments] * batch, self.scheme, generator=gen, device=parts[0][1].device, **options)

    def coords(self, parts: list[Part], training: bool, seed: int) -> Coords | list[Coords]:
        """The decoder's coordinates: the layout's, or one per decoder layer under AGE (``circlerope@strategy_N``)."""
        circle = self.layout(parts, training, seed).coords
        if self.scheme != "circlerope" or self.option is None:
            return circle
        segments = [segments_of(parts, self.model.patch_size)] * parts[0][1].shape[0]
        qwen = build(segments, "qwen2.5-vl", device=parts[0][1].device).coords
        return age_coords(self.option, circle, qwen, depth=len(self.model.decoder.blocks))

    def logits(self, model: nn.Module, parts: list[Part], training: bool = False, seed: int = 0) -> Tensor:
        """``(B, 2, vocab)``: the predictions of ``answer[0]`` and ``answer[1]``."""
        return model(parts, self.coords(parts, training, seed))[:, -2:]

    def loss(self, model: nn.Module, parts: list[Part], answer: Tensor, seed: Tensor):
        logits = self.logits(model, parts, True, int(seed[0]))
        loss = F.cross_entropy(logits.flatten(0, 1), answer.flatten())
        return loss, {"acc": float(_hits(logits, answer).float().mean())}

    @torch.no_grad()
    def hits(self, model: nn.Module, make_parts: Callable[..., list[Part]], *tensors: Tensor) -> Tensor:
        """``(N,)`` bool exact matches over a held-out set, in chunks; ``tensors[-1]`` is the answer."""
        out = []
        for i in range(0, tensors[0].shape[0], _EVAL_CHUNK):
            chunk = [t[i : i + _EVAL_CHUNK].to(self.device) for t in tensors]
            out.append(_hits(self.logits(model, make_parts(*chunk)), chunk[-1]).cpu())
        return torch.cat(out)


def _hits(logits: Tensor, answer: Tensor) -> Tensor:
    return (logits.argmax(-1) == answer).all(-1)


def _sequence(question: Tensor, visual: list[Part], answer: Tensor) -> list[Part]:
    """``[BOS, visual ..., question ... (ending in ANSWER), answer[0]]``."""
    bos = torch.full_like(question[:, :1], grounding.PAD)
    return [("text", bos), *visual, ("text", torch.cat([question, answer[:, :1]], dim=1))]


def _step_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


def _seed_column(n: int, s: int) -> Tensor:
    """The layout seed as a batch column (so that it survives the runner's DDP sharding)."""
    return torch.full((n,), s, dtype=torch.long)


# --------------------------------------------------------------------------- grounding
#: question sources of ``vlm_grounding``: WHAT/WHERE (absolute) and BELOW/RIGHT (relations)
_GROUNDING_SOURCES = {"absolute": grounding.make_grounding, "relations": relations.make_relations}
_KIND_NAMES = {grounding.WHAT: "what", grounding.WHERE: "where", relations.BELOW: "below", relations.RIGHT: "right"}


@register_task(
    "vlm_grounding",
    defaults={
        "vision": dict(_VISION),
        "decoder": dict(_DECODER),
        "data": {
            "questions": ["relations"],
            "train_grids": [[2, 2], [2, 3], [3, 2], [3, 3], [2, 4], [4, 2]],
            "eval_grids": [[3, 4], [4, 3], [4, 4]],
            "eval_size": 240,
            "cell": 16,
            "eval_delta": 0.0625,
            "hope_scale": 0.75,
        },
    },
)
def build_grounding(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Questions about cell scenes whose answers need 2-D position, on grids of varying shape.

    ``data.questions`` lists the sources: ``relations`` (:mod:`recipes.data.relations`:
    which object is below / right of a named one) and ``absolute``
    (:mod:`recipes.data.grounding`: which object is at row r, column c; where is an object).
    Training cycles through ``data.train_grids`` (one grid and source per batch).
    Metrics: ``acc`` on held-out scenes of the training grids, ``acc@new_grids`` on
    ``data.eval_grids``, and ``acc_<kind>`` per question kind (training grids).
    """
    d = cfg["data"]
    sources = list(d["questions"])
    unknown = [q for q in sources if q not in _GROUNDING_SOURCES]
    if not sources or unknown:
        raise ValueError(f"data.questions must be a non-empty list of {sorted(_GROUNDING_SOURCES)}, got {sources!r}")
    glue = _Answerer(cfg, encoder, relations.RELATION_VOCAB_SIZE, device)
    train_grids = [tuple(g) for g in d["train_grids"]]

    def parts_of(images: Tensor, question: Tensor, answer: Tensor) -> list[Part]:
        return _sequence(question, [("image", images)], answer)

    def make(source: str, n: int, grid: tuple[int, int], s: int) -> grounding.GroundingBatch:
        return _GROUNDING_SOURCES[source](n, *grid, seed=s, cell=d["cell"])

    def train_batch(step: int):
        s = _step_seed(seed, step)
        grid = train_grids[step % len(train_grids)]
        g = make(sources[(step // len(train_grids)) % len(sources)], cfg["batch_size"], grid, s)
        return g.images, g.question, g.answer, _seed_column(len(g.answer), s)

    def loss(model, batch):
        images, question, answer, s = batch
        return glue.loss(model, parts_of(images, question, answer), answer, s)

    def held_out(grids) -> list[grounding.GroundingBatch]:
        n = max(d["eval_size"] // (len(grids) * len(sources)), 2)
        return [
            make(q, n, g, 10**9 + 1000 * seed + 10 * i + j) for i, g in enumerate(grids) for j, q in enumerate(sources)
        ]

    eval_sets = {"acc": held_out(train_grids), "acc@new_grids": held_out([tuple(g) for g in d["eval_grids"]])}

    def evaluate(model) -> dict[str, float]:
        out = {}
        for name, sets in eval_sets.items():
            hits = torch.cat([glue.hits(model, parts_of, g.images, g.question, g.answer) for g in sets])
            out[name] = float(hits.float().mean())
            if name == "acc":
                kinds = torch.cat([g.question[:, 0] for g in sets])
                for kind in kinds.unique().tolist():
                    out[f"acc_{_KIND_NAMES[kind]}"] = float(hits[kinds == kind].float().mean())
        return out

    return Task(glue.model, train_batch, loss, evaluate, metric="acc")


# --------------------------------------------------------------------------- video
#: question sources of ``video_temporal``: HIDDEN (relations) and WHEN / EVENT (events)
_VIDEO_SOURCES = {"hidden": relations.make_hidden_clips, "events": video.make_event_clips}
_KIND_NAMES.update({video.WHEN: "when", video.EVENT: "where", relations.HIDDEN: "hidden"})


@lru_cache(maxsize=16)
def _clip_pool(source: str, n: int, frames: int, rows: int, cols: int, seed: int, cell: int) -> video.EventClips:
    """A fixed pool of clips (encoding through OpenCV is the slow part: done once per seed and process)."""
    return _VIDEO_SOURCES[source](n, frames, rows, cols, seed=seed, cell=cell)


@register_task(
    "video_temporal",
    defaults={
        "vision": dict(_VISION),
        "decoder": dict(_DECODER),
        "data": {
            "questions": ["hidden"],
            "frames": 4,
            "grids": [[2, 2], [2, 3], [3, 2], [3, 3]],
            "cell": 16,
            "pool_size": 1024,
            "eval_size": 256,
            "eval_delta": 0.0625,
            "hope_scale": 0.75,
        },
    },
)
def build_video(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Questions about video clips whose answers need the time axis, on cell grids of varying shape.

    ``data.questions`` lists the sources: ``hidden`` (:func:`recipes.data.relations.make_hidden_clips`:
    which object does the flash hide -- the same cell in another frame) and ``events``
    (:func:`recipes.data.video.make_event_clips`: WHEN does the flash start, WHERE is it).
    Clips are written to and read back from MJPG files with OpenCV; training samples fixed
    pools of ``data.pool_size`` clips per seed (split over grids and sources), one grid and
    source per batch; evaluation uses ``data.eval_size`` other clips. Metrics: ``acc`` and
    ``acc_<kind>`` per question kind.
    """
    d = cfg["data"]
    sources = list(d["questions"])
    if not sources or any(q not in _VIDEO_SOURCES for q in sources):
        raise ValueError(f"data.questions must be a non-empty list of {sorted(_VIDEO_SOURCES)}, got {sources!r}")
    glue = _Answerer(cfg, encoder, relations.RELATION_VOCAB_SIZE, device)
    grids = [tuple(g) for g in d["grids"]]
    splits = [(q, g) for q in sources for g in grids]  # batch `step` uses splits[step % len(splits)]

    def pools(size: int, base_seed: int) -> list[video.EventClips]:
        n = max(size // len(splits), 2)
        return [_clip_pool(q, n, d["frames"], *g, base_seed + i, d["cell"]) for i, (q, g) in enumerate(splits)]

    train_pools, held = pools(d["pool_size"], 1000 * seed), pools(d["eval_size"], 10**9 + 1000 * seed)

    def parts_of(clips: Tensor, question: Tensor, answer: Tensor) -> list[Part]:
        return _sequence(question, [("video", clips)], answer)

    def train_batch(step: int):
        s = _step_seed(seed, step)
        pool = train_pools[step % len(splits)]
        idx = torch.randint(len(pool.answer), (cfg["batch_size"],), generator=torch.Generator().manual_seed(s))
        return pool.clips[idx], pool.question[idx], pool.answer[idx], _seed_column(len(idx), s)

    def loss(model, batch):
        clips, question, answer, s = batch
        return glue.loss(model, parts_of(clips, question, answer), answer, s)

    def evaluate(model) -> dict[str, float]:
        hits = torch.cat([glue.hits(model, parts_of, p.clips, p.question, p.answer) for p in held])
        kinds = torch.cat([p.question[:, 0] for p in held])
        out = {"acc": float(hits.float().mean())}
        for kind in kinds.unique().tolist():
            out[f"acc_{_KIND_NAMES[kind]}"] = float(hits[kinds == kind].float().mean())
        return out

    return Task(glue.model, train_batch, loss, evaluate, metric="acc")


# --------------------------------------------------------------------------- needle in a haystack
@register_task(
    "v2pe_long",
    defaults={
        "vision": dict(_VISION),
        "decoder": dict(_DECODER),
        "data": {
            "train_images": [2, 3, 4],
            "eval_images": [4, 8, 16],
            "eval_size": 128,
            "cell": 16,
            "eval_delta": 0.0625,
            "hope_scale": 0.75,
        },
    },
)
def build_haystack(cfg: dict, encoder: str, seed: int, device: torch.device) -> Task:
    """Which object shares an image with the white square, among K images (K grows at test).

    Each image is preceded by an ``IMAGE_SEP`` text token. Training cycles through
    ``data.train_images``; metrics ``acc@K`` for every K of ``data.eval_images`` and
    ``acc``, their mean.
    """
    glue = _Answerer(cfg, encoder, haystack.HAYSTACK_VOCAB_SIZE, device)
    d = cfg["data"]

    def parts_of(images: Tensor, question: Tensor, answer: Tensor) -> list[Part]:
        sep = ("text", torch.full_like(question[:, :1], haystack.IMAGE_SEP))
        visual = [p for i in range(images.shape[1]) for p in (sep, ("image", images[:, i]))]  # over images, not tokens
        return _sequence(question, visual, answer)

    def train_batch(step: int):
        s = _step_seed(seed, step)
        k = d["train_images"][step % len(d["train_images"])]
        h = haystack.make_haystack(cfg["batch_size"], k, seed=s, cell=d["cell"])
        return h.images, h.question, h.answer, _seed_column(len(h.answer), s)

    def loss(model, batch):
        images, question, answer, s = batch
        return glue.loss(model, parts_of(images, question, answer), answer, s)

    held = {
        k: haystack.make_haystack(d["eval_size"], k, seed=10**9 + 100 * seed + k, cell=d["cell"])
        for k in d["eval_images"]
    }

    def evaluate(model) -> dict[str, float]:
        out = {f"acc@{k}": float(glue.hits(model, parts_of, h.images, h.question, h.answer).float().mean())
               for k, h in held.items()}  # fmt: skip
        out["acc"] = sum(out.values()) / len(out)
        return out

    return Task(glue.model, train_batch, loss, evaluate, metric="acc")
