"""The ``mmpos`` command: ``list``, ``run``, ``cp``, ``info``, ``plot``.

    mmpos list [encoders]                        encoders with kind and paper
    mmpos list recipes                           shipped recipes with their descriptions
    mmpos list schemes                           layout schemes: axes, rotary encoder, paper, reference, HF model types
    mmpos run RECIPE [key=value ...] [--resume RUN_FOLDER] [--out DIR]
    mmpos cp RECIPE DEST [--force]               copy a shipped recipe to edit and run as your own
    mmpos info                                   versions and device
    mmpos plot {similarity,extrapolation,plan,layout} ...   figures of an encoder (mmpos.viz)

``RECIPE`` is a YAML path or the name of a shipped recipe (e.g. ``quickstart``); overrides
use dotted keys with YAML values (``optim.lr=3e-4 encoders=[none,rope]``). Under
``torchrun --nproc_per_node N -m mmpos.cli run ...`` the run uses DDP.

Every command imports only what it uses: ``--help``, ``list recipes`` and ``cp`` do not
import torch; ``info`` loads no model library (timm, open_clip, transformers); ``list`` loads
the encoder modules.

Every mistake is one line on stderr and exit status 2 (no traceback); a run that failed (its
loss diverged, a write failed: full disk, read-only folder) is one line and status 1; Ctrl-C
during a run prints the ``--resume`` command that continues it and exits with 130. Warnings
are one line each (``mmpos run: warning: ...``).
"""

from __future__ import annotations

import argparse
import difflib
import platform
import shlex
import sys
import warnings
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
    if args.what == "schemes":
        from .schemes import SCHEMES

        width = max(len(n) for n in SCHEMES)
        print(f"{'name':<{width}}  {'axes':<11}  {'encoder':<10}  paper; reference; Hugging Face model types")
        for name, scheme in sorted(SCHEMES.items()):
            fields = [scheme.paper or "-", scheme.reference or "-"]
            if scheme.model_types:
                fields.append(", ".join(scheme.model_types))
            print(f"{name:<{width}}  {','.join(scheme.axes):<11}  {scheme.encoder:<10}  {'; '.join(fields)}")
        return 0
    from . import list_encoders

    infos = list_encoders()
    width = max(len(i.name) for i in infos)
    print(f"{'name':<{width}}  {'kind':<8}  paper")
    for i in infos:
        print(f"{i.name:<{width}}  {i.kind:<8}  {i.paper}")
    return 0


def _version(dist: str) -> str | None:
    import importlib.metadata  # not at start-up: it costs ~0.2 s that --help does not need

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


class _Interrupted(Exception):
    """Ctrl-C during ``mmpos run``: the message is the one line to print (with the ``--resume`` command)."""


def _resume_hint(folder: Path | None) -> str:
    return f"mmpos run --resume {shlex.quote(str(folder))}" if folder is not None else ""


def _cmd_run(args: argparse.Namespace) -> int:
    from .runner import run_recipe

    recipe, overrides = args.recipe, list(args.overrides)
    if args.resume and recipe and "=" in recipe and not Path(recipe).exists():  # mmpos run --resume DIR k=v
        recipe, overrides = None, [recipe, *overrides]
    if not recipe and not args.resume:
        raise ValueError("name a recipe (mmpos list recipes) or a run folder to continue with --resume")
    try:
        run_recipe(recipe, overrides, out=args.out, resume=args.resume)
    except KeyboardInterrupt as e:
        folder = getattr(e, "run_folder", None)
        if folder is None and args.resume:
            folder = Path(args.resume)
        if folder is None:
            raise _Interrupted("interrupted before anything was saved; nothing to resume") from None
        raise _Interrupted(f"interrupted; continue the run with: {_resume_hint(folder)}") from None
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


class _Parser(argparse.ArgumentParser):
    """``argparse`` whose mistakes are one line (``mmpos run: error: ...``), exit status 2, no usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="mmpos", description="Position encoders for multimodal and structured data.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{list,run,cp,info,plot}", parser_class=_Parser)
    lst = sub.add_parser("list", help="list the registered encoders, or the shipped recipes")
    lst.add_argument("what", nargs="?", choices=("encoders", "recipes", "schemes"), default="encoders")
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


_RUN_OPTIONS = ("--resume", "--out", "--help")


def _unknown_option_hint(extra: list[str], positional: list[str]) -> str:
    """``--steps 10`` / ``--steps=10`` -> ``; ... write steps=10`` (``positional``: what argparse took as overrides)."""
    option = next((e for e in extra if e.startswith("--")), None)
    if option is None:
        return ""
    key, sep, value = option[2:].partition("=")
    if not sep:
        i = extra.index(option)
        loose = [p for p in positional if "=" not in p]  # argparse may have taken the value as a positional
        if i + 1 < len(extra) and not extra[i + 1].startswith("-"):
            value = extra[i + 1]
        else:
            value = loose[0] if loose else "VALUE"
    close = difflib.get_close_matches(f"--{key}", _RUN_OPTIONS, n=1, cutoff=0.75)
    if close:
        return f"; did you mean {close[0]}?"
    return f"; config overrides are key=value, not options: write {key.replace('-', '_')}={value}"


def _one_line_warnings(command: str):
    """``warnings.showwarning`` that prints ``mmpos <command>: warning: <message>`` (no source path or line)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())
        print(f"mmpos {command}: warning: {text}", file=file or sys.stderr)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mmpos`` console script; returns the exit status."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "run" and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]  # key=value after --resume DIR / --out DIR
    elif extra:
        hint = _unknown_option_hint(extra, [args.recipe or "", *args.overrides]) if args.command == "run" else ""
        print(f"mmpos {args.command}: error: unrecognized arguments: {' '.join(extra)}{hint}", file=sys.stderr)
        return 2
    show = warnings.showwarning
    warnings.showwarning = _one_line_warnings(args.command)
    try:
        return args.fn(args)
    except _Interrupted as e:
        print(f"mmpos {args.command}: {e}", file=sys.stderr)
        return 130
    except (ValueError, KeyError, FileNotFoundError, FileExistsError, IsADirectoryError, PermissionError) as e:
        # a bad recipe, override, encoder name or folder: one line, no traceback
        text = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"mmpos {args.command}: error: {' '.join(str(text).split())}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a run that failed (its loss diverged, a write failed): one line, status 1
        from .runner.train import TrainingDiverged, WriteFailed

        if not isinstance(e, (TrainingDiverged, WriteFailed)):
            raise
        message = str(e)
        resume = getattr(args, "resume", None)
        folder = getattr(e, "run_folder", None) or (Path(resume) if resume else None)
        if isinstance(e, WriteFailed) and folder is not None:
            message += f"; once fixed, continue with: {_resume_hint(folder)}"
        print(f"mmpos {args.command}: failed: {message}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = show


if __name__ == "__main__":
    sys.exit(main())
