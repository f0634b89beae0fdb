"""Real directed graphs: program graphs of the installed Python standard library's functions.

The same kind of graph as ogbg-code2 (Hu et al., "Open Graph Benchmark", NeurIPS 2020: Python
ASTs with AST edges and next-token edges), the real benchmark on which Geisler et al.,
"Transformers Meet Directed Graphs" (ICML 2023, Sec. 6 / Table 4) evaluate the magnetic
Laplacian. Built offline with :mod:`ast` from the ``.py`` files of the running interpreter's
standard library (``sysconfig.get_paths()["stdlib"]``), one graph per function definition:

* nodes: the function's AST nodes in preorder (expression contexts and operator singletons
  such as ``Load`` or ``Add`` are dropped); node feature = the AST class (an index into
  :data:`NODE_TYPES`, the last index for any other class);
* edges, all from an earlier to a later node in preorder, so every graph is a DAG:
  ``parent -> child`` (AST), ``statement -> next statement`` of the same body (control flow),
  and ``last write -> read`` of a variable name (data flow: the latest preceding ``Name`` in
  ``Store`` context with the same identifier).

:func:`ancestor_pairs` gives the direction-only pair task of ``recipes.tasks.maglap``: the
ordered pairs ``(u, v)`` where one of the two reaches the other, labelled "``u`` reaches
``v``" (exactly half of them are positive, and a pair's reversal carries the other label).

Shapes: ``edge_index`` ``(2, m)`` long; ``node_type`` ``(n,)`` long; ``reach`` ``(n, n)`` bool.
"""

from __future__ import annotations

import ast
import itertools
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["NODE_TYPES", "ProgramGraph", "ancestor_pairs", "function_graph", "reachability", "stdlib_program_graphs"]

#: The AST classes with their own feature index (the most frequent in the standard library);
#: every other class shares index ``len(NODE_TYPES)``.
NODE_TYPES = (
    "FunctionDef", "arguments", "arg", "Expr", "Assign", "AugAssign", "Return", "If", "For", "While", "With",
    "Try", "ExceptHandler", "Raise", "Call", "Attribute", "Name", "Constant", "Subscript", "BinOp", "BoolOp",
    "Compare", "UnaryOp", "Tuple", "List", "Dict", "keyword", "JoinedStr", "FormattedValue", "IfExp", "Slice",
    "comprehension", "ListComp", "Lambda", "withitem", "Pass", "Break", "Continue", "AnnAssign", "Starred",
)  # fmt: skip
_INDEX = {name: i for i, name in enumerate(NODE_TYPES)}
_SKIP = (ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop)


@dataclass(frozen=True)
class ProgramGraph:
    """One function's program graph: ``edge_index (2, m)``, ``node_type (n,)``, and where it comes from."""

    edge_index: Tensor
    node_type: Tensor
    source: str

    @property
    def num_nodes(self) -> int:
        return int(self.node_type.numel())


def function_graph(func: ast.FunctionDef | ast.AsyncFunctionDef, source: str = "") -> ProgramGraph:
    """The program graph of one function definition (see the module docstring)."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TypeError(f"func must be an ast.FunctionDef or ast.AsyncFunctionDef, got {type(func).__name__}")
    order: list[ast.AST] = []
    index: dict[int, int] = {}
    edges: list[tuple[int, int]] = []

    def visit(node: ast.AST, parent: int | None) -> None:
        if isinstance(node, _SKIP):
            return
        i = len(order)
        order.append(node)
        index[id(node)] = i
        if parent is not None:
            edges.append((parent, i))  # AST edge
        for child in ast.iter_child_nodes(node):
            visit(child, i)

    visit(func, None)
    for node in order:  # next-statement edges within each statement list
        for _, value in ast.iter_fields(node):
            if isinstance(value, list):
                stmts = [index[id(s)] for s in value if isinstance(s, ast.stmt)]
                edges.extend(itertools.pairwise(stmts))
    last_write: dict[str, int] = {}
    for i, node in enumerate(order):  # data flow: last write -> read, in preorder
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                last_write[node.id] = i
            elif node.id in last_write:
                edges.append((last_write[node.id], i))
        elif isinstance(node, ast.arg):
            last_write[node.arg] = i
    types = [_INDEX.get(type(node).__name__, len(NODE_TYPES)) for node in order]
    edge_index = torch.tensor(sorted(set(edges)), dtype=torch.long).reshape(-1, 2).T.contiguous()
    return ProgramGraph(edge_index, torch.tensor(types, dtype=torch.long), source)


def stdlib_program_graphs(
    buckets: list[tuple[int, int, int]], root: str | Path | None = None
) -> list[list[ProgramGraph]]:
    """Program graphs of the standard library's functions, one list per ``(min_nodes, max_nodes, count)`` bucket.

    Files are read in sorted path order (``test/``, ``tests/`` and ``site-packages/`` left out) and
    functions in :func:`ast.walk` order; a function goes to the first bucket whose size range holds it
    that is not full yet, and reading stops once every bucket is full, so the lists are the same on
    every run of one Python version (a bucket the library cannot fill is an error). ``root`` defaults
    to ``sysconfig.get_paths()["stdlib"]``.
    """
    if not isinstance(buckets, (list, tuple)) or not buckets:
        raise ValueError(f"buckets must be a non-empty list of (min_nodes, max_nodes, count), got {buckets!r}")
    for b in buckets:
        if (
            not isinstance(b, (list, tuple))
            or len(b) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in b)
            or not (2 <= b[0] <= b[1] and b[2] >= 1)
        ):
            raise ValueError(
                f"each bucket must be (min_nodes, max_nodes, count) ints, 2 <= min <= max, count >= 1; got {b!r}"
            )
    base = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise ValueError(f"root must be a directory of Python files, got {str(base)!r}")
    out: list[list[ProgramGraph]] = [[] for _ in buckets]
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if rel.startswith(("test/", "site-packages/")) or "/test/" in rel or "/tests/" in rel or "idle_test" in rel:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences in old modules
                tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            size = sum(1 for n in ast.walk(node) if not isinstance(n, _SKIP))
            for (lo, hi, count), graphs in zip(buckets, out):
                if lo <= size <= hi and len(graphs) < count:
                    graphs.append(function_graph(node, f"{rel}:{node.lineno}:{node.name}"))
                    break
        if all(len(g) >= b[2] for g, b in zip(out, buckets)):
            return out
    short = [(b, len(g)) for g, b in zip(out, buckets) if len(g) < b[2]]
    raise ValueError(f"the standard library under {str(base)!r} has too few functions for buckets {short}")


def reachability(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``(n, n)`` bool: ``[u, v]`` when a directed path of length >= 1 leads from ``u`` to ``v``."""
    adj = np.zeros((num_nodes, num_nodes), dtype=bool)
    adj[edge_index[0].numpy(), edge_index[1].numpy()] = True
    reach = adj.copy()
    while True:
        grown = reach | ((reach.astype(np.uint8) @ adj.astype(np.uint8)) > 0)
        if (grown == reach).all():
            return torch.from_numpy(reach)
        reach = grown


def ancestor_pairs(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """``(mask (n, n) bool, label (n, n) bool)``: pairs where one node reaches the other, and whether ``u`` reaches ``v``."""
    reach = reachability(edge_index, num_nodes)
    return reach | reach.T, reach
