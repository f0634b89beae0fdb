"""Graph maths on plain tensors (no PyG types): magnetic Laplacian, its eigenpairs,
directional random walks, and the :class:`GraphCoords` that carry graph PEs to models.

Geisler et al., "Transformers Meet Directed Graphs", ICML 2023 (google-deepmind/digraph_transformer).
The torch-geometric transforms that wrap these live in :mod:`mmpos.integrations.pyg`.
"""

from .coords import GraphCoords
from .eigen import SOLVERS, MagLapEigen, maglap_eigenpairs, maglap_eigenpairs_many, normalize_phase
from .laplacian import NORMALIZATIONS, magnetic_laplacian, num_one_way_edges, relative_q
from .random_walk import directional_random_walk_node_pe, directional_random_walks, transition_matrix

__all__ = [
    "NORMALIZATIONS",
    "SOLVERS",
    "GraphCoords",
    "MagLapEigen",
    "directional_random_walk_node_pe",
    "directional_random_walks",
    "maglap_eigenpairs",
    "maglap_eigenpairs_many",
    "magnetic_laplacian",
    "normalize_phase",
    "num_one_way_edges",
    "relative_q",
    "transition_matrix",
]
