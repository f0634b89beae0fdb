"""The import map of the package: imports run one way, from the top floor down, with no circle.

Every ``import`` / ``from ... import`` in ``mmpos/`` (at module level or inside a function: a lazy
import is still an arrow) is read with :mod:`ast`. A module's *room* is its first component below
``mmpos`` (``mmpos.nn.attention`` -> ``nn``). A room may import its own floor or any floor below;
``recipes`` (beside the library) is never imported by it, and nothing imports the ``mmpos`` package
facade from inside.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: floor of each room, bottom up (docs/concepts.md, "The import map")
FLOORS: dict[str, int] = {
    **dict.fromkeys(["_arrays", "_validate", "_deprecate", "_extras", "_lazy", "coords"], 0),
    **dict.fromkeys(["rotary", "graph"], 1),
    **dict.fromkeys(["scaling", "schemes", "age"], 2),
    "layout": 3,
    **dict.fromkeys(["encoders", "table", "media"], 4),
    **dict.fromkeys(["nn", "layers", "export"], 5),
    **dict.fromkeys(["integrations", "viz"], 6),
    "runner": 7,
    "cli": 8,
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """``{module: the mmpos / recipes modules it imports}``."""
    edges: dict[str, set[str]] = {}
    for path in sorted((ROOT / "mmpos").rglob("*.py")):
        module = _module(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = edges.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [target] + [f"{target}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in ("mmpos", "recipes"):
                    found.add(name)
    return edges


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_every_room_has_a_floor():
    rooms = {_room(m) for m in _imports()} - {"mmpos"}
    assert rooms <= FLOORS.keys(), sorted(rooms - FLOORS.keys())


def test_imports_run_downwards_only():
    upward = []
    for module, targets in _imports().items():
        if module == "mmpos":  # the facade re-exports from below
            continue
        for target in targets:
            if target.split(".")[0] == "recipes":
                upward.append(f"{module} -> {target} (the library never imports the recipes)")
            elif target == "mmpos" and module != "mmpos.cli":
                upward.append(f"{module} -> mmpos (the package facade)")
            elif target != "mmpos" and _room(target) in FLOORS and FLOORS[_room(target)] > FLOORS[_room(module)]:
                upward.append(f"{module} -> {target}")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_circle_between_modules():
    edges = _imports()
    modules = set(edges)
    # an import of ``pkg.mod.name`` is an arrow to the deepest module it names
    graph = {
        m: {next((t for t in _prefixes(target) if t in modules), None) for target in ts} - {None, m}
        for m, ts in edges.items()
    }
    for m, targets in graph.items():  # a package's own __init__ importing its submodules is not a circle with them
        graph[m] = {t for t in targets if not t.startswith(m + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, ()):
            if state.get(t) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(t) :] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def test_no_private_name_is_imported_across_modules():
    crossing = []
    for path in sorted((ROOT / "mmpos").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("mmpos")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        crossing.append(
                            f"{path.relative_to(ROOT)}: from {'.' * node.level}{node.module} import {alias.name}"
                        )
    assert not crossing, "\n".join(crossing)
