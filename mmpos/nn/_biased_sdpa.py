"""Attention with a bias gathered from per-query bucket scores, forward and backward on CPU.

``bias[b, h, i, j] = sum_m z[b, h, i, ids[m, i, j]]`` (the form of iRPE's key-side terms:
``z = s q @ table``). Given such a bias that needs a gradient, CPU
``F.scaled_dot_product_attention`` leaves its fused flash kernel for the math kernel, which
forms and keeps the ``(B, H, N, N)`` logits and probabilities. This function instead:

* forward: gathers the bias and runs the fused CPU flash kernel with it as a constant mask
  (``aten._scaled_dot_product_flash_attention_for_cpu``), keeping the output and the
  log-sum-exp ``(B, H, N)``, not the bias nor the probabilities;
* backward: over blocks of (batch x head slices, query rows) of about ``_BLOCK_ELEMENTS``
  logits, re-gathers the block's bias, recomputes its probabilities
  ``P = exp(s q k^T + bias - lse)`` in place, forms ``dS = P (dO v^T - delta)``
  (``delta_i = dO_i . out_i``), sums ``dS`` per bucket into ``dz`` (``scatter_add``) and
  accumulates ``dq = s dS k``, ``dk = s dS^T q``, ``dv = P^T dO``. Every block reuses the same
  two buffers, so the backward forms nothing ``(B, H, N, N)``; the forward forms the bias once
  for the flash kernel and keeps it no longer.

The math is the softmax attention backward (FlashAttention-2, Dao 2023, Alg. 2, with the
bias gradient ``dS`` summed per bucket). Shapes: q, k, v ``(B, H, N, D)``; z
``(B, H, N, buckets)``; ids ``(maps, N, N)`` long; output ``(B, H, N, D)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["gathered_bias_attention", "supports_gathered_bias"]

_aten = torch.ops.aten
_BLOCK_ELEMENTS = 2**17  # elements per (batch x head, rows, N) block: 512 KiB float32 (L2-sized)
_SELECT_ELEMENTS = 2**16  # bias elements per slice from which one index_select per slice beats one gather


def supports_gathered_bias(q: Tensor) -> bool:
    """Whether :func:`gathered_bias_attention` serves ``q``'s device and dtype (CPU, float32/64)."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)


def _gather_into(out: Tensor, z: Tensor, ids: Tensor) -> Tensor:
    """``out = sum_m z.gather(-1, ids[m])`` with ``z`` ``(BH, rows, buckets)``, ids ``(maps, rows, N)``."""
    shape = (z.shape[0], *ids.shape[1:])
    torch.gather(z, -1, ids[0].expand(shape), out=out)
    for extra in ids[1:]:  # cross: the column map
        out.add_(z.gather(-1, extra.expand(shape)))
    return out


def _row_ids(ids: Tensor, buckets: int) -> Tensor:
    """``(maps, N, N)`` ids into one query's row of ``z`` -> ids into all ``N * buckets`` entries of a slice."""
    n = ids.shape[1]
    return ids + (torch.arange(n, device=ids.device) * buckets).view(1, n, 1)


def _use_select(rows: int, n: int) -> bool:
    """One ``index_select`` per slice for blocks of ``rows x n`` bias elements; else (and under
    ``torch.compile``, which would unroll the slices) one broadcast ``gather``."""
    return rows * n >= _SELECT_ELEMENTS and not torch.compiler.is_compiling()


def _select_rows_into(out: Tensor, z: Tensor, flat: Tensor, start: int, stop: int) -> Tensor:
    """:func:`_gather_into` for query rows ``start:stop`` of every slice, by ``index_select`` on flat ids.

    ``out`` ``(G, stop - start, N)`` and ``z`` ``(G, N, buckets)`` contiguous; ``flat = _row_ids(ids, buckets)``.
    On CPU a 1-D ``index_select`` runs about twice as fast as ``gather`` with an index broadcast over the
    slices, but takes one call per batch x head slice (not per token): :func:`_use_select` says when.
    """
    for g in range(z.shape[0]):
        zs, dst = z[g].view(-1), out[g].view(-1)
        torch.index_select(zs, 0, flat[0, start:stop].reshape(-1), out=dst)
        for extra in flat[1:]:  # cross: the column map
            dst.add_(zs.index_select(0, extra[start:stop].reshape(-1)))
    return out


class _GatheredBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor, z: Tensor, ids: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        b, h, n, _ = q.shape
        zf, bias = z.reshape(b * h, n, -1), z.new_empty(b * h, n, n)
        if _use_select(n, n):
            _select_rows_into(bias, zf.contiguous(), _row_ids(ids, zf.shape[-1]), 0, n)
        else:
            _gather_into(bias, zf, ids)
        bias = bias.view(b, h, n, n)
        return _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias, scale=scale)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        q, k, v, z, ids, scale = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, z, ids, out, lse)
        ctx.scale = scale
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(ctx, dout: Tensor, _dlse: Tensor | None):
        q, k, v, z, ids, out, lse = ctx.saved_tensors
        scale = ctx.scale
        b, h, n, d = q.shape
        bh, buckets = b * h, z.shape[-1]
        flat = (bh, n, d)
        q, k, v, dout = (t.reshape(flat) for t in (q, k, v, dout))
        zf, lse = z.reshape(bh, n, buckets).contiguous(), lse.reshape(bh, n, 1)  # contiguous: flat rows per slice
        delta = (dout * out.reshape(flat)).sum(-1, keepdim=True)  # (BH, N, 1)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dz = torch.zeros_like(zf)
        rows = max(16, min(n, _BLOCK_ELEMENTS // n))  # query rows per block
        select = _use_select(rows, n)
        row_ids = _row_ids(ids, buckets) if select else None
        group = max(1, min(bh, _BLOCK_ELEMENTS // (rows * n)))  # batch x head slices per block
        p_buf, ds_buf = q.new_empty(group * rows * n), q.new_empty(group * rows * n)
        dq_buf = q.new_empty(group * rows * d)
        k_t, v_t = k.transpose(1, 2), v.transpose(1, 2)
        for g0 in range(0, bh, group):  # static blocks of (batch x head, query rows)
            g1 = min(g0 + group, bh)
            for start in range(0, n, rows):
                stop = min(start + rows, n)
                size = (g1 - g0, stop - start, n)  # contiguous views of the buffers' leading elements
                p, ds = p_buf[: math.prod(size)].view(size), ds_buf[: math.prod(size)].view(size)
                block_ids = ids[:, start:stop]
                q_blk, dout_blk = q[g0:g1, start:stop], dout[g0:g1, start:stop]
                if select:  # bias rows
                    _select_rows_into(p, zf[g0:g1], row_ids, start, stop)
                else:
                    _gather_into(p, zf[g0:g1, start:stop], block_ids)
                p.baddbmm_(q_blk, k_t[g0:g1], alpha=scale).sub_(lse[g0:g1, start:stop]).exp_()  # P
                torch.bmm(dout_blk, v_t[g0:g1], out=ds)
                ds.sub_(delta[g0:g1, start:stop]).mul_(p)  # dS = P (dP - delta)
                for ids_map in block_ids:
                    dz[g0:g1, start:stop].scatter_add_(-1, ids_map.expand(size), ds)
                dq_blk = dq_buf[: size[0] * size[1] * d].view(size[0], size[1], d)
                dq[g0:g1, start:stop] = torch.bmm(ds, k[g0:g1], out=dq_blk)
                dk[g0:g1].baddbmm_(ds.transpose(1, 2), q_blk)
                dv[g0:g1].baddbmm_(p.transpose(1, 2), dout_blk)
        dq.mul_(scale)
        dk.mul_(scale)
        shape = (b, h, n, d)
        return dq.view(shape), dk.view(shape), dv.view(shape), dz.view(z.shape), None, None


def gathered_bias_attention(q: Tensor, k: Tensor, v: Tensor, z: Tensor, ids: Tensor) -> Tensor:
    """``softmax(q k^T / sqrt(D) + bias) v`` with ``bias[..., i, j] = sum_m z[..., i, ids[m, i, j]]``.

    Args:
        q, k, v: ``(B, H, N, D)`` (CPU, float32 or float64; see :func:`supports_gathered_bias`).
        z: ``(B, H, N, buckets)`` per-query bucket scores, in logit units.
        ids: ``(maps, N, N)`` long bucket ids into ``z``'s last axis.

    Returns:
        ``(B, H, N, D)``, with gradients for q, k, v and z.
    """
    out, _ = _GatheredBiasAttention.apply(q, k, v, z.expand(*q.shape[:3], z.shape[-1]), ids, q.shape[-1] ** -0.5)
    return out
