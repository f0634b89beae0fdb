"""torch-geometric transforms over :mod:`mmpos.graph` (imports torch_geometric), one per file.

Public names are re-exported by :mod:`mmpos.integrations.pyg`.
"""

from .add_directional_random_walk_pe import AddDirectionalRandomWalkPE
from .add_magnetic_laplacian_pe import AddMagneticLaplacianPE

__all__ = ["AddDirectionalRandomWalkPE", "AddMagneticLaplacianPE"]
