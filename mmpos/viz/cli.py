"""``mmpos plot``: the figures of :mod:`mmpos.viz` from the command line.

    mmpos plot similarity --encoder rope-axial --grid 14x14 --query 7,7 -o out.png
    mmpos plot extrapolation --encoder rope-axial --grid 14x14 --query 7,7 --factor 2 -o extra.png
    mmpos plot plan --encoder mrope-i -o plan.png
    mmpos plot layout --scheme vrope "text:5,video:2x4x6,text:3" -o ids.png

Encoders are built as :class:`mmpos.nn.Transformer` builds them (``dim``, ``num_heads``,
``grid_size``, ``axes`` handed to the factories that take them), untrained;
``--set key=value`` passes factory arguments (values parsed as YAML), ``--random-init``
fills zero-initialised parameters (e.g. iRPE tables) with seeded ``N(0, 1)`` values so
that their structure shows. A user mistake prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, status 2
        self.exit(2, f"mmpos plot: error: {message}\n")


def _ints(text: str, name: str, sep: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(sep))
    except ValueError:
        raise ValueError(f"{name} must be integers separated by {sep!r}, got {text!r}") from None
    return values


def _grid(text: str) -> tuple[int, ...]:
    sizes = _ints(text, "--grid", "x")
    if not 1 <= len(sizes) <= 3 or min(sizes) <= 0:
        raise ValueError(f"--grid must be 1 to 3 positive sizes such as 14x14 or 4x8x8, got {text!r}")
    return sizes


def _settings(items: Sequence[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"--set takes key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def _encoder(args: argparse.Namespace, grid: tuple[int, ...] | None, axes: tuple[str, ...] | None):
    import torch

    from ..encoders.registry import create_in_model, encoder_info, model_context

    info = encoder_info(args.encoder)
    if info.kind == "none":
        raise ValueError(f"encoder {args.encoder!r} has no position encoding to draw")
    if args.dim % args.heads:
        raise ValueError(f"--dim {args.dim} must be divisible by --heads {args.heads}")
    context = {**model_context(args.dim, args.heads, 1, grid_size=grid, axes=axes), "layer": 0}
    torch.manual_seed(args.seed)
    encoder = create_in_model(args.encoder, context, **_settings(args.set))
    if getattr(args, "random_init", False):
        g = torch.Generator().manual_seed(args.seed)
        with torch.no_grad():
            for p in encoder.parameters():
                if not bool(p.any()):
                    p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return encoder.eval()


def _head(text: str) -> int | str:
    if text in ("mean", "all"):
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--head must be 'mean', 'all' or a head index, got {text!r}") from None


def _cmd_similarity(args: argparse.Namespace) -> int:
    from ..coords import Coords
    from .figures import plot_similarity

    grid = _grid(args.grid)
    coords = Coords.grid(*grid, num_prefix_tokens=args.num_prefix_tokens)
    query = _ints(args.query, "--query", ",")
    encoder = _encoder(args, grid, coords.axes)
    smap = plot_similarity(encoder, coords, query, args.output, _head(args.head), args.content, args.seed, args.encoder)
    print(f"wrote {args.output} ({smap.kind} map of {args.encoder}, query token {smap.query})")
    return 0


def _cmd_extrapolation(args: argparse.Namespace) -> int:
    from ..coords import Coords
    from .figures import plot_extrapolation

    grid = _grid(args.grid)
    query = _ints(args.query, "--query", ",")
    if args.rules is not None:  # one panel per scaling rule (mmpos.viz.extrapolation)
        import json

        from .extrapolation import RULE_CHOICES, plot_scaling_extrapolation

        rules = RULE_CHOICES if args.rules == "all" else tuple(r.strip() for r in args.rules.split(","))

        def build(scaling: dict | None):
            settings = args.set if scaling is None else [*args.set, f"scaling={json.dumps(scaling)}"]
            return _encoder(argparse.Namespace(**{**vars(args), "set": settings}), grid, Coords.grid(*grid).axes)

        _, maps = plot_scaling_extrapolation(build, grid, query, args.output, args.factor, rules, args.content)
        drifts = ", ".join(f"{m.rule} {m.drift:.3f}" if m.error is None else f"{m.rule} n/a" for m in maps)
        print(f"wrote {args.output} ({args.encoder} at {args.factor}x {args.grid}; drift per rule: {drifts})")
        return 0
    encoder = _encoder(args, grid, Coords.grid(*grid).axes)
    plot_extrapolation(
        encoder, grid, query, args.output, args.factor, args.num_prefix_tokens, _head(args.head), args.content
    )
    print(f"wrote {args.output} ({args.encoder} on {args.grid} and {args.factor}x)")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from ..encoders.base import RotaryEncoder
    from .figures import plot_plan

    encoder = _encoder(args, None, None)
    if not isinstance(encoder, RotaryEncoder):
        raise TypeError(f"--encoder must name a rotary encoder (see 'mmpos list'), {args.encoder!r} is {encoder.kind}")
    table = plot_plan(encoder, args.output, f"{args.encoder}: axis read by each rotary pair")
    print(f"wrote {args.output} ({table.axis.shape[1]} pairs, axes {table.axes})")
    return 0


def _segments(text: str) -> list:
    from ..layout import Image, Text, Video

    segments = []
    for part in text.split(","):
        kind, colon, spec = part.strip().partition(":")
        if not colon:
            raise ValueError(f"segments look like text:5,image:8x8,video:2x4x6[@0.5], got {part!r}")
        if kind == "text":
            segments.append(Text(_ints(spec, "text", ",")[0]))
        elif kind == "image":
            sizes = _ints(spec, "image", "x")
            segments.append(Image((1, *sizes) if len(sizes) == 2 else sizes))
        elif kind == "video":
            grid, at, seconds = spec.partition("@")
            segments.append(Video(_ints(grid, "video", "x"), float(seconds) if at else None))
        else:
            raise ValueError(f"segment kind must be text, image or video, got {kind!r} in {part!r}")
    return segments


# with several schemes, an option goes to the schemes that take it
_SCHEME_OPTIONS = {"delta": ("v2pe",), "temporal_scale": ("hope", "mrope-i")}


def _cmd_layout(args: argparse.Namespace) -> int:
    from ..layout import build
    from .figures import plot_layout

    segments = _segments(args.segments)
    layouts = []
    for scheme in (s.strip() for s in args.scheme.split(",")):
        options = {"spatial_merge_size": args.merge}
        for option, schemes in _SCHEME_OPTIONS.items():
            if getattr(args, option) is not None and (scheme in schemes or "," not in args.scheme):
                options[option] = getattr(args, option)  # one scheme: build() judges the option
        layouts.append(build([segments], scheme, **options))
    rows = plot_layout(layouts, args.output)
    print(f"wrote {args.output} ({len(rows)} scheme(s), {rows[0].values.shape[1]} tokens)")
    return 0


def _encoder_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoder", required=True, help="registered encoder name (see 'mmpos list')")
    p.add_argument("--dim", type=int, default=512, help="model width (default 512)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4: head_dim 128)")
    p.add_argument("--set", action="append", default=[], metavar="key=value", help="encoder factory argument")
    p.add_argument("--seed", type=int, default=0, help="seed of the encoder's init and random content")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")


def _map_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grid", required=True, help="token grid, e.g. 14x14, 4x8x8 or 64")
    p.add_argument("--query", required=True, help="query coordinates, one per axis, e.g. 7,7")
    p.add_argument(
        "--num-prefix-tokens",
        type=int,
        default=0,
        dest="num_prefix_tokens",
        help="class/register tokens before the grid",
    )
    p.add_argument("--head", default="mean", help="'mean' (default), 'all' or a head index")
    p.add_argument("--content", default="constant", choices=("constant", "random"), help="content vector u")
    p.add_argument("--random-init", action="store_true", help="fill zero-initialised parameters with N(0, 1)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mmpos plot", description="Figures of what a position encoder does.")
    sub = p.add_subparsers(dest="figure", required=True, metavar="{similarity,extrapolation,plan,layout}")
    sim = sub.add_parser("similarity", help="a query's map over the token grid")
    ext = sub.add_parser("extrapolation", help="the map on the training grid and on factor x the grid")
    for q in (sim, ext):
        _encoder_options(q)
        _map_options(q)
    sim.set_defaults(fn=_cmd_similarity)
    ext.add_argument("--factor", type=int, default=2, help="grid multiplier (default 2)")
    ext.add_argument("--rules", default=None, help="scaling rules to compare, comma-separated, or 'all'")
    ext.set_defaults(fn=_cmd_extrapolation)
    plan = sub.add_parser("plan", help="axis and frequency of every rotary pair")
    _encoder_options(plan)
    plan.set_defaults(fn=_cmd_plan)
    lay = sub.add_parser("layout", help="position ids of an interleaved prompt, one row per axis")
    lay.add_argument("segments", help="e.g. text:5,image:8x8,video:2x4x6@0.5,text:3 (grids in patches)")
    lay.add_argument("--scheme", required=True, help="layout scheme, or several separated by commas")
    lay.add_argument("--merge", type=int, default=2, help="spatial merge size (default 2)")
    lay.add_argument("--delta", type=float, default=None, help="v2pe visual step")
    lay.add_argument("--temporal-scale", type=float, default=None, help="hope temporal scale")
    lay.add_argument("-o", "--output", required=True, help="PNG file to write")
    lay.set_defaults(fn=_cmd_layout)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``mmpos plot ...``; returns the exit status (2 with a one-line message on a user mistake)."""
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, TypeError, OSError) as e:
        print(f"mmpos plot {args.figure}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
