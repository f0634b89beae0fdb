import pytest
import torch
import torch_geometric.transforms as T
from torch_geometric.data import Batch, Data
from torch_geometric.utils import to_dense_adj, to_undirected

from mmpos.graph import directional_random_walks, maglap_eigenpairs
from mmpos.integrations.pyg import AddDirectionalRandomWalkPE, AddMagneticLaplacianPE

pytestmark = pytest.mark.pyg  # run on the oldest and the newest supported torch-geometric


def _graph(n, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.arange(n - 1)
    extra = torch.randint(0, n, (2, n), generator=g)
    ei = torch.cat([torch.stack([src, src + 1]), extra], dim=1)
    return Data(edge_index=ei[:, ei[0] != ei[1]], num_nodes=n)


def test_q0_matches_pyg_laplacian_eigenvector_pe_up_to_sign():
    data = _graph(40, 0)
    data.edge_index = to_undirected(data.edge_index)
    ours = AddMagneticLaplacianPE(k=6, q=0.0)(data.clone())
    pyg = T.AddLaplacianEigenvectorPE(k=5, is_undirected=True)(data.clone())
    vec = ours.maglap_pe.real.double()[:, 1:]  # PyG drops the first eigenvector
    ref = pyg.laplacian_eigenvector_pe.double()
    val = ours.maglap_pe_eigval[0]
    assert (val[1:] - val[:-1]).min() > 1e-4  # simple spectrum: vectors defined up to sign
    signs = torch.sign((vec * ref).sum(0))
    torch.testing.assert_close(vec * signs, ref, atol=1e-4, rtol=0)


def test_stores_pyg_style_attributes_and_batches():
    tr = T.Compose([AddMagneticLaplacianPE(k=4, q=[0.0, 0.25]), AddDirectionalRandomWalkPE(walk_length=2)])
    graphs = [tr(_graph(n, n)) for n in (6, 3, 5)]
    assert graphs[0].maglap_pe.dtype == torch.complex64 and graphs[0].maglap_pe.shape == (6, 2, 4)
    assert graphs[1].maglap_pe_mask.tolist() == [[True, True, True, False]]
    batch = Batch.from_data_list(graphs)
    assert batch.maglap_pe.shape == (14, 2, 4) and batch.maglap_pe_eigval.shape == (3, 2, 4)
    assert batch.maglap_pe_mask.shape == (3, 4) and batch.drw_pe.shape == (14, 6)
    dense = to_dense_adj(batch.drw_pe_pair_index, batch.batch, edge_attr=batch.drw_pe_pair)
    for i, g in enumerate(graphs):
        n = g.num_nodes
        ref = directional_random_walks(g.edge_index, n, 2, 0.1).float()
        torch.testing.assert_close(dense[i, :n, :n], ref)
        assert dense[i, n:].abs().sum() == 0


def test_one_q_has_no_q_axis_and_matches_graph_maths():
    data = AddMagneticLaplacianPE(k=3)(_graph(7, 1))
    assert data.maglap_pe.shape == (7, 3) and data.maglap_pe_eigval.shape == (1, 3)
    ref = maglap_eigenpairs(data.edge_index, 7, 3, 0.25)
    torch.testing.assert_close(data.maglap_pe, ref.eigvec[:, 0].to(torch.complex64))


def test_apply_many_equals_forward():
    tr = AddMagneticLaplacianPE(k=5, q=0.25, solver="dense")
    one = [tr(_graph(n, n)) for n in (4, 8, 8, 3)]
    many = tr.apply_many([_graph(n, n) for n in (4, 8, 8, 3)])
    for a, b in zip(one, many):
        torch.testing.assert_close(a.maglap_pe, b.maglap_pe, atol=1e-6, rtol=0)
        torch.testing.assert_close(a.maglap_pe_eigval, b.maglap_pe_eigval)


def test_repr_and_bad_arguments():
    assert repr(AddMagneticLaplacianPE(8)) == "AddMagneticLaplacianPE(k=8, q=0.25, q_relative=True)"
    assert repr(AddDirectionalRandomWalkPE()) == "AddDirectionalRandomWalkPE(walk_length=3, ppr_alpha=0.1, mode='both')"
    with pytest.raises(ValueError, match="attr_name"):
        AddMagneticLaplacianPE(4, attr_name="")
    with pytest.raises(ValueError, match="solver"):
        AddMagneticLaplacianPE(4, solver="lanczos")
    with pytest.raises(ValueError, match="dtype"):
        AddMagneticLaplacianPE(4, dtype=torch.float16)
    with pytest.raises(ValueError, match="k must be"):
        AddMagneticLaplacianPE(0)
    with pytest.raises(ValueError, match="mode"):
        AddDirectionalRandomWalkPE(mode="pairs")
    with pytest.raises(ValueError, match="edge_index"):
        AddMagneticLaplacianPE(4)(Data(num_nodes=3))


def test_attr_name_none_concatenates_onto_x_as_pyg():
    data = _graph(9, 2)
    data.x = torch.randn(9, 3)
    ref = AddMagneticLaplacianPE(k=4, q=[0.0, 0.25])(data.clone())
    out = AddMagneticLaplacianPE(k=4, q=[0.0, 0.25], attr_name=None)(data.clone())
    vec = ref.maglap_pe  # (9, 2, 4)
    want = torch.cat([data.x, vec.real.flatten(1), vec.imag.flatten(1)], dim=1)
    torch.testing.assert_close(out.x, want)
    assert "maglap_pe" not in out and "maglap_pe_eigval" not in out
    bare = _graph(9, 2)  # no x: x becomes the PE, as PyG's add_node_attr
    assert AddMagneticLaplacianPE(k=4, attr_name=None)(bare).x.shape == (9, 8)
    # PyG's own transform follows the same rule
    pyg = T.AddLaplacianEigenvectorPE(k=2, attr_name=None)(data.clone())
    assert pyg.x.shape == (9, 5) and torch.equal(pyg.x[:, :3], data.x)


def test_reference_preset_uses_sign_rotate():
    tr = AddMagneticLaplacianPE.from_preset("geisler2023-sorting")
    assert (tr.k, tr.q, tr.q_relative, tr.normalize) == (25, 0.25, True, "sign_rotate")
    data = tr(_graph(30, 3))
    ref = maglap_eigenpairs(data.edge_index, 30, 25, 0.25, normalize="sign_rotate")
    torch.testing.assert_close(data.maglap_pe, ref.eigvec[:, 0].to(torch.complex64))
    with pytest.raises(ValueError, match="sets"):
        AddMagneticLaplacianPE.from_preset("geisler2023-sorting", k=8)
    with pytest.raises(ValueError, match="name must be"):
        AddMagneticLaplacianPE.from_preset("geisler")


def test_node_pe_feeds_gpsconv_without_glue():
    from torch_geometric.nn import GINConv, GPSConv

    from mmpos.integrations.pyg import MagLapNodePE

    tr = AddMagneticLaplacianPE(k=4, q=0.25)
    graphs = []
    for n in (6, 3, 5):
        g = tr(_graph(n, n))
        g.x = torch.randn(n, 7)
        graphs.append(g)
    batch = Batch.from_data_list(graphs)
    torch.manual_seed(0)
    node_pe = MagLapNodePE(16, k=4, in_dim=7)
    h = node_pe(batch)
    # the glue users wrote by hand before: add the Q axis, spread the per-graph eigenpairs to nodes
    enc = node_pe.encoder
    want = node_pe.input(batch.x) + enc.encode(
        batch.maglap_pe.unsqueeze(-2),
        batch.maglap_pe_eigval[batch.batch].unsqueeze(-2),
        batch.maglap_pe_mask[batch.batch],
    )
    torch.testing.assert_close(h, want)
    torch.testing.assert_close(node_pe(graphs[1])[:, :], h[6:9], atol=1e-6, rtol=0)  # a single Data works too
    conv = GPSConv(16, GINConv(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())), heads=4)
    out = conv(h, batch.edge_index, batch.batch)
    out.square().mean().backward()
    assert out.shape == (14, 16) and all(p.grad is not None for p in node_pe.encoder.parameters() if p.requires_grad)
    multi = Batch.from_data_list([AddMagneticLaplacianPE(k=3, q=[0.0, 0.25])(_graph(5, 0)) for _ in range(2)])
    assert MagLapNodePE(8, k=3, num_q=2)(multi).shape == (10, 8)
