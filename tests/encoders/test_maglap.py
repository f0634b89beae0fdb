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


def _vec_val_mask(k=5, n=4, pad=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    vec = torch.complex(torch.randn(n, 1, k, generator=g), torch.randn(n, 1, k, generator=g))
    val = torch.rand(1, k, generator=g).add(0.05).expand(n, 1, k).clone()
    mask = (torch.arange(k) < k - pad).expand(n, k)
    val[..., k - pad :] = 0  # padding: eigenvalue 0, as the reference's zero padding
    vec[..., k - pad :] = 0
    return vec, val, mask


def test_eigval_concatenated_after_phi():
    torch.manual_seed(0)
    enc = MagLapEncoder(dim=8, k=5, eigval="concat", sign_invariant=False).eval()
    vec, val, mask = _vec_val_mask()
    x = torch.stack([vec.real, vec.imag], -1)  # (n, 1, K, 2)
    tok = torch.cat([val.unsqueeze(-1), enc.phi(x)], -1) * mask[:, None, :, None]  # lambda first, as the reference
    torch.testing.assert_close(enc.encode(vec, val, mask), enc.rho(tok.flatten(1)))
    assert enc.phi[0].in_features == 2 and enc.rho[0].in_features == 5 * 17
    into_phi = MagLapEncoder(dim=8, k=5).eval()  # the default feeds lambda into phi
    assert into_phi.phi[0].in_features == 3 and into_phi.rho[0].in_features == 5 * 16


def test_zero_first_negative_branch_for_complex_input():
    torch.manual_seed(0)
    enc = MagLapEncoder(dim=8, k=5, eigval=None, zero_first_negative=True).eval()
    vec, val, mask = _vec_val_mask()
    x = torch.stack([vec.real, vec.imag], -1)
    neg = enc.phi(-x)
    neg[..., 0, :] = 0  # the reference: trans_neg.at[..., 0, :].set(0) for complex eigenvectors
    tok = (enc.phi(x) + neg) * mask[:, None, :, None]
    torch.testing.assert_close(enc.encode(vec, val, mask), enc.rho(tok.flatten(1)))
    real = vec.real  # real input (q = 0): both branches kept, so still exactly sign invariant
    flips = torch.tensor([-1.0, 1, 1, 1, 1])
    torch.testing.assert_close(enc.encode(real * flips, val, mask), enc.encode(real, val, mask))


def test_attention_is_the_references_multi_head_attention():
    torch.manual_seed(0)
    enc = MagLapEncoder(dim=8, k=5, elem_dim=16, eigval="concat", attention=True, key_dim=4, qkv_bias=False)
    enc.eval()
    att = enc.attn
    assert att.q.bias is None and att.out.bias is not None and att.q.out_features == 16  # 4 heads x key size 4
    x, keep = torch.randn(3, 5, 17), torch.tensor([True, True, True, False, True]).expand(3, 5)
    # layers.py MultiHeadAttention: logits = q k^T / sqrt(key_size), masked keys -1e30, softmax, out projection
    heads = lambda lin: lin(x).view(3, 5, 4, 4)
    logits = torch.einsum("mthd,mThd->mhtT", heads(att.q), heads(att.k)) / 2.0
    logits = logits.masked_fill(~keep[:, None, None, :], -1e30)
    out = torch.einsum("mhtT,mThd->mthd", logits.softmax(-1), heads(att.v)).reshape(3, 5, 16)
    torch.testing.assert_close(att(x, keep), att.out(out), atol=1e-5, rtol=0)


def test_norm_replaces_tokens_before_the_residual():
    torch.manual_seed(0)
    vec, val, mask = _vec_val_mask()
    outs = {}
    for replaces in (False, True):
        torch.manual_seed(0)
        enc = MagLapEncoder(dim=8, k=5, attention=True, norm_replaces=replaces).eval()
        x = torch.stack([vec.real, vec.imag, val], -1)
        tok = (enc.phi(x) + enc.phi(torch.stack([-vec.real, -vec.imag, val], -1))).flatten(0, 1)  # (n, K, E)
        h = enc.norm(tok)
        tok = (h if replaces else tok) + enc.attn(h, mask)
        want = enc.rho((tok * mask[..., None]).flatten(1))
        outs[replaces] = enc.encode(vec, val, mask)
        torch.testing.assert_close(outs[replaces], want, atol=1e-6, rtol=0)
    assert (outs[True] - outs[False]).abs().max() > 1e-4


def _reference_maglapnet(enc, vec, val):
    """models.py MagLapNet.__call__ as configured by the sorting-network preset, written out (eval mode):
    use_signnet=False, concatenate_eigenvalues=True, use_attention=True with norm=LayerNorm, n_layers=1."""
    padding = val[:, 0] > 0  # (n, K): eigenvalues > 0 ...
    padding[:, 0] = True  # ... and the first
    trans = torch.relu(enc.phi[0](torch.stack([vec.real, vec.imag], -1)[:, 0]))  # re_element: Linear + ReLU
    trans = torch.cat([val[:, 0, :, None], trans], -1)  # eigenvalue first
    trans = enc.norm(trans)  # trans = self.norm()(trans)
    attn_mask = padding[:, None, :, None] & padding[:, None, None, :]  # (n, 1, T, T)
    a = enc.attn
    heads = lambda lin: lin(trans).view(*trans.shape[:2], a.num_heads, a.key_dim)
    logits = torch.einsum("nthd,nThd->nhtT", heads(a.q), heads(a.k)) / a.key_dim**0.5
    weights = torch.where(attn_mask, logits, torch.tensor(-1e30)).softmax(-1)
    att = torch.einsum("nhtT,nThd->nthd", weights, heads(a.v)).reshape(*trans.shape[:2], -1)
    trans = (trans + a.out(att)) * padding[..., None]
    return torch.relu(enc.rho[0](trans.flatten(1)))  # re_aggregate: Linear + ReLU


@pytest.mark.parametrize("preset", ["geisler2023-sorting", "geisler2023-playground"])
def test_preset_reproduces_the_reference_forward(preset):
    torch.manual_seed(0)
    enc = MagLapEncoder(256, 25, preset=preset).eval()
    assert enc.phi[0].out_features == 16 and enc.attn.key_dim == 4 and enc.attn.num_heads == 4  # 2 * 256 // 32
    assert not enc.sign_invariant and enc.eigval == "concat" and len(enc.phi) == 2 and len(enc.rho) == 2
    assert enc.drop.p == {"geisler2023-sorting": 0.15, "geisler2023-playground": 0.1}[preset]
    vec, val, mask = _vec_val_mask(k=25, n=6, pad=4)
    torch.testing.assert_close(enc.encode(vec, val, mask), _reference_maglapnet(enc, vec, val), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="sets"):
        MagLapEncoder(256, 25, preset=preset, dropout=0.3)
    with pytest.raises(ValueError, match="preset must be"):
        MagLapEncoder(256, 25, preset="geisler")
