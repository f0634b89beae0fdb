"""The ``mmpos`` command: ``list``, ``run``, ``cp``, ``info``, ``plot``.

    mmpos list [encoders]                        encoders with kind and paper
    mmpos list recipes                           shipped recipes with their descriptions
    mmpos run RECIPE [key=value ...] [--resume RUN_FOLDER] [--out DIR]
    mmpos cp RECIPE DEST [--force]               copy a shipped recipe to edit and run as your own
    mmpos info                                   versions and device
    mmpos plot {similarity,extrapolation,plan,layout} ...   figures of an encoder (mmpos.viz)

``RECIPE`` is a YAML path or the name of a shipped recipe (e.g. ``quickstart``); overrides
use dotted keys with YAML values (``optim.lr=3e-4 encoders=[none,rope]``). Under
``torchrun --nproc_per_node N -m mmpos.cli run ...`` the run uses DDP.

Every command imports only what it uses: ``list recipes``, ``cp`` and ``info`` load no
model library (timm, open_clip, transformers); ``list`` loads the encoder modules.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

_PACKAGES = (
    ("torch", "torch"),
    ("timm", "timm"),
    ("open_clip", "open_clip_torch"),
    ("torch_geometric", "torch-geometric"),
    ("transformers", "transformers"),
)


def _cmd_list(args: argparse.Namespace) -> int:
    if args.what == "recipes":
        from .runner.config import list_recipes, recipe_description

        names = list_recipes()
        width = max(len(n) for n in names) if names else 4
        print(f"{'name':<{width}}  description")
        for name in names:
            print(f"{name:<{width}}  {recipe_description(name)}")
        return 0
    from . import list_encoders

    infos = list_encoders()
    width = max(len(i.name) for i in infos)
    print(f"{'name':<{width}}  {'kind':<8}  paper")
    for i in infos:
        print(f"{i.name:<{width}}  {i.kind:<8}  {i.paper}")
    return 0


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cmd_info(args: argparse.Namespace) -> int:
    import torch

    from . import __version__

    print(f"mmpos            {__version__} ({Path(__file__).resolve().parent})")
    print(f"python           {platform.python_version()} ({sys.executable})")
    for module, dist in _PACKAGES:
        version = _version(dist)
        print(f"{module:<16} {version if version else 'not installed'}")
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        print(f"device           cuda ({torch.cuda.device_count()}: {names}; CUDA {torch.version.cuda})")
    else:
        print(f"device           cpu ({torch.get_num_threads()} threads; no CUDA device)")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .runner import run_recipe

    recipe, overrides = args.recipe, list(args.overrides)
    if args.resume and recipe and "=" in recipe and not Path(recipe).exists():  # mmpos run --resume DIR k=v
        recipe, overrides = None, [recipe, *overrides]
    if not recipe and not args.resume:
        raise ValueError("name a recipe (mmpos list recipes) or a run folder to continue with --resume")
    run_recipe(recipe, overrides, out=args.out, resume=args.resume)
    return 0


def _cmd_cp(args: argparse.Namespace) -> int:
    from .runner.config import shipped_recipe

    source = shipped_recipe(args.recipe)  # FileNotFoundError names the shipped recipes
    dest = Path(args.dest)
    if dest.is_dir():
        dest = dest / source.name
    if dest.exists() and not args.force:
        raise FileExistsError(f"{dest} exists; add --force to overwrite it")
    if not dest.parent.is_dir():
        raise FileNotFoundError(f"folder {dest.parent} does not exist")
    try:
        dest.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    except OSError as e:  # e.g. no permission: one line, exit 2
        raise ValueError(f"cannot write {dest}: {e.strerror}") from None
    print(f"copied {source.name} to {dest}; run it with: mmpos run {dest}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from .viz.cli import main as plot_main  # matplotlib is loaded only here

    try:
        return plot_main(args.args)
    except SystemExit as e:  # argparse inside mmpos plot: help (0) or a one-line mistake (2)
        return e.code if isinstance(e.code, int) else 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmpos", description="Position encoders for multimodal and structured data.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{list,run,cp,info,plot}")
    lst = sub.add_parser("list", help="list the registered encoders, or the shipped recipes")
    lst.add_argument("what", nargs="?", choices=("encoders", "recipes"), default="encoders")
    lst.set_defaults(fn=_cmd_list)
    sub.add_parser("info", help="versions of mmpos and its dependencies, and the device").set_defaults(fn=_cmd_info)
    run = sub.add_parser("run", help="run a recipe (a YAML path or the name of a shipped recipe)")
    run.add_argument(
        "recipe", nargs="?", help="YAML path or recipe name, e.g. quickstart (with --resume: may be left out)"
    )
    run.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, values parsed as YAML")
    run.add_argument("--resume", metavar="RUN_FOLDER", help="continue an interrupted run folder")
    run.add_argument("--out", metavar="DIR", help="root folder of the runs (default: the config's out, 'runs')")
    run.set_defaults(fn=_cmd_run)
    cp = sub.add_parser("cp", help="copy a shipped recipe to a file of your own (then: mmpos run FILE)")
    cp.add_argument("recipe", help="name of a shipped recipe (mmpos list recipes)")
    cp.add_argument("dest", help="destination file, or an existing folder (the file keeps the recipe's name)")
    cp.add_argument("--force", action="store_true", help="overwrite the destination if it exists")
    cp.set_defaults(fn=_cmd_cp)
    plot = sub.add_parser(  # no options of its own: everything after "plot" goes to mmpos.viz.cli
        "plot",
        help="figures: similarity, extrapolation, plan, layout (mmpos plot -h)",
        add_help=False,
        prefix_chars="\0",
    )
    plot.add_argument("args", nargs=argparse.REMAINDER, help="arguments of mmpos plot")
    plot.set_defaults(fn=_cmd_plot)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mmpos`` console script; returns the exit status."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "run" and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]  # key=value after --resume DIR / --out DIR
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError, FileExistsError) as e:  # bad recipe, override or folder: no traceback
        print(f"mmpos {args.command}: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a run that failed (e.g. its loss diverged): one line, marked failed, status 1
        from .runner.runner import TrainingDiverged

        if not isinstance(e, TrainingDiverged):
            raise
        print(f"mmpos {args.command}: failed: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
