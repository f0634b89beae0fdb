import pytest
import torch

import mmpos
from mmpos.encoders.maglap import MagLapEncoder
from mmpos.graph import GraphCoords, maglap_eigenpairs, normalize_phase


def _inputs(q, normalize=False):
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 9, (2, 20), generator=g)
    eig = maglap_eigenpairs(ei[:, ei[0] != ei[1]], 9, 6, q, normalize=normalize)
    return eig.eigvec.to(torch.complex64), eig.eigval.float().expand(9, -1, -1), eig.mask.expand(9, -1)


@pytest.mark.parametrize("attention", [False, True])
@pytest.mark.parametrize("q", [0.0, 0.25])
def test_exactly_sign_invariant_per_eigenvector(q, attention):
    torch.manual_seed(0)
    enc = MagLapEncoder(dim=16, k=6, num_q=1, attention=attention).eval()
    vec, val, mask = _inputs(q)
    signs = torch.tensor([1, -1, -1, 1, -1, 1], dtype=torch.float32)  # independent flips per eigenvector
    torch.testing.assert_close(enc.encode(vec * signs, val, mask), enc.encode(vec, val, mask), atol=1e-6, rtol=0)


def test_general_phase_is_not_removed_by_the_network_but_by_the_normalisation():
    torch.manual_seed(0)
    enc = MagLapEncoder(dim=16, k=6, num_q=1).eval()
    vec, val, mask = _inputs(0.25)
    phase = torch.exp(1j * torch.linspace(0.3, 2.0, 6))
    out = enc.encode(vec, val, mask)
    assert (enc.encode(vec * phase, val, mask) - out).abs().max() > 1e-3  # as in the reference: sign only
    normed, _, _ = _inputs(0.25, normalize=True)
    rotated = (vec * phase)[:, 0].numpy().astype("complex128")  # (n, K)
    renormed = torch.from_numpy(normalize_phase(rotated)).to(torch.complex64).unsqueeze(1)
    torch.testing.assert_close(enc.encode(renormed, val, mask), enc.encode(normed, val, mask), atol=1e-5, rtol=0)


def test_padding_eigenpairs_are_ignored():
    torch.manual_seed(0)
    enc = MagLapEncoder(dim=8, k=4, attention=True).eval()
    vec, val = torch.randn(5, 1, 4, dtype=torch.complex64), torch.rand(5, 1, 4)
    mask = torch.tensor([True, True, False, False]).expand(5, 4)
    noisy = vec.clone()
    noisy[..., 2:] = torch.randn(5, 1, 2, dtype=torch.complex64)
    torch.testing.assert_close(enc.encode(noisy, val, mask), enc.encode(vec, val, mask))


def test_registered_and_used_through_the_additive_hook():
    assert mmpos.encoders.registry.encoder_info("maglap").kind == "additive"
    enc = mmpos.create("maglap", dim=8, k=3, num_q=2)
    b, n = 2, 5
    coords = GraphCoords(
        pos=torch.arange(n).float().expand(b, n)[..., None],
        axes=("node",),
        mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]),
        eigvec=torch.randn(b, n, 2, 3, dtype=torch.complex64),
        eigval=torch.rand(b, 2, 3),
        eig_mask=torch.ones(b, 3, dtype=torch.bool),
    )
    out = enc.embed(coords)
    assert out.shape == (b, n, 8) and out[1, 3:].abs().max() == 0
    x = torch.zeros(b, n, 8)
    torch.testing.assert_close(enc(x, coords), out)


def test_bad_arguments():
    with pytest.raises(ValueError, match="elem_dim"):
        MagLapEncoder(dim=8, k=4, elem_dim=6, num_heads=4, attention=True)
    with pytest.raises(ValueError, match="k must be"):
        MagLapEncoder(dim=8, k=0)
    enc = MagLapEncoder(dim=8, k=4)
    with pytest.raises(ValueError, match=r"\(\.\.\., Q, K\)"):
        enc.encode(torch.randn(3, 1, 5), torch.rand(3, 1, 5), torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="GraphCoords"):
        enc.embed(mmpos.Coords.sequence(4))
