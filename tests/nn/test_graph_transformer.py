import pytest
import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch import nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GINConv, GPSConv, global_mean_pool

from mmpos.encoders.maglap import MagLapEncoder
from mmpos.integrations.pyg import AddDirectionalRandomWalkPE, AddMagneticLaplacianPE
from mmpos.nn.graph_transformer import GraphTransformer

pytestmark = pytest.mark.pyg  # oldest and newest torch-geometric

TRANSFORM = T.Compose([AddMagneticLaplacianPE(k=4, q=[0.0, 0.25]), AddDirectionalRandomWalkPE(walk_length=2)])


def _graphs(sizes, seed=0, transform=TRANSFORM):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        src = torch.arange(n - 1)
        ei = torch.stack([src, src + 1])  # a directed path; the label: is it reversed in the features?
        out.append(transform(Data(x=torch.randn(n, 3, generator=g), edge_index=ei, num_nodes=n)))
    return out


def _model(**kw):
    torch.manual_seed(0)
    args = {"maglap": {"k": 4, "num_q": 2, "elem_dim": 8}, "node_pe_dim": 6, "pair_dim": 6}
    args.update(kw)
    return GraphTransformer(3, 32, 2, 4, 2, **args).eval()


def test_batched_equals_one_graph_at_a_time():
    model = _model()
    graphs = _graphs([4, 7, 2])
    out = model(Batch.from_data_list(graphs))
    assert out.shape == (3, 2)
    for i, g in enumerate(graphs):
        torch.testing.assert_close(out[i], model(Batch.from_data_list([g]))[0], atol=1e-5, rtol=0)


def test_node_readout_and_permutation_of_graphs():
    model = _model(readout="none")
    graphs = _graphs([5, 3])
    out = model(Batch.from_data_list(graphs))
    assert out.shape == (8, 2)
    swapped = model(Batch.from_data_list(graphs[::-1]))
    torch.testing.assert_close(swapped, torch.cat([out[5:], out[:5]]), atol=1e-5, rtol=0)


def test_pairwise_features_reach_the_logits():
    model = _model(maglap=None, node_pe_dim=None)
    batch = Batch.from_data_list(_graphs([6]))
    before = model(batch)
    batch.drw_pe_pair = batch.drw_pe_pair * 3
    assert (model(batch) - before).abs().max() > 1e-4
    _x, coords, _, _ = model.coords(batch)
    assert coords.pair.shape == (1, 6, 6, 6)


def test_no_node_features_and_bad_readout():
    model = GraphTransformer(None, 16, 1, 2, 1, maglap={"k": 4, "num_q": 2, "elem_dim": 8})
    batch = Batch.from_data_list(_graphs([3, 4]))
    assert model(batch).shape == (2, 1)
    with pytest.raises(ValueError, match="readout"):
        GraphTransformer(3, 16, 1, 2, 1, readout="max")


def test_pyg_gpsconv_trains_on_maglap_pe():
    torch.manual_seed(0)
    tr = AddMagneticLaplacianPE(k=4, q=0.25)
    graphs = _graphs([5, 6, 7, 5, 6, 7], transform=tr)
    for i, g in enumerate(graphs):  # label: the path runs forward (0) or backward (1)
        if i % 2:
            g.edge_index = g.edge_index.flip(0)
            tr(g)
        g.y = torch.tensor([i % 2])
    batch = Batch.from_data_list(graphs)
    dim = 16
    pe = MagLapEncoder(dim, k=4, num_q=1, elem_dim=8)
    inp = nn.Linear(3, dim)
    gps = GPSConv(dim, GINConv(nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))), heads=2)
    head = nn.Linear(dim, 2)
    params = [p for m in (pe, inp, gps, head) for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=3e-3)

    def loss_fn():
        node_pe = pe.encode(
            batch.maglap_pe.unsqueeze(-2),
            batch.maglap_pe_eigval[batch.batch].unsqueeze(-2),
            batch.maglap_pe_mask[batch.batch],
        )
        h = gps(inp(batch.x) + node_pe, batch.edge_index, batch.batch)
        return F.cross_entropy(head(global_mean_pool(h, batch.batch)), batch.y.view(-1))

    first = loss_fn().item()
    for _ in range(30):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    assert loss_fn().item() < 0.5 * first


def test_pair_readout_reads_both_endpoints():
    model = _model(readout="pair")
    batch = Batch.from_data_list(_graphs([4, 6]))
    out = model(batch)
    assert out.shape == (2, 6, 6, 2)
    assert not torch.allclose(out[1, 0, 1], out[1, 1, 0])  # ordered pairs: (u, v) differs from (v, u)
