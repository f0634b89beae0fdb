"""torch-geometric integration: directed-graph PE transforms (imports torch_geometric).

* :class:`AddMagneticLaplacianPE`: magnetic-Laplacian eigenvectors (complex, direction-aware);
* :class:`AddDirectionalRandomWalkPE`: forward/reverse random walks and PageRank,
  absolute (node features) and relative (pairwise, for attention biases).

Both follow PyG's transform conventions (``BaseTransform``, ``attr_name``, ``__repr__``,
usable inside ``T.Compose`` and as a dataset ``pre_transform``). Models that consume them:
:class:`mmpos.encoders.maglap.MagLapEncoder` (also inside PyG's ``GPSConv`` stacks) and
:class:`mmpos.nn.GraphTransformer`. Docs: ``docs/encoders/magnetic-laplacian.md``.
"""

from ..graph.transforms import AddDirectionalRandomWalkPE, AddMagneticLaplacianPE

__all__ = ["AddDirectionalRandomWalkPE", "AddMagneticLaplacianPE"]
