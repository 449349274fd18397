"""A blockwise attention kernel: 64 queries at a time, so no (Lq, Lk) buffer ever exists."""

import math

import torch

BLOCK = 64


def blockwise_attention(q, k, v, attn_mask=None, is_causal=False, scale=None):
    """softmax(q k^T * scale) v, one block of queries at a time, with SDPA's call.

    q (B, H, Lq, D); k and v (B, Hkv, Lk, D) and (B, Hkv, Lk, Dv), Hkv dividing H; attn_mask None
    or bool broadcastable to (B, H, Lq, Lk), True = may attend; is_causal: query i sees keys 0..i
    (and a causal block never reads the keys after its last query). A query with no key: zeros.
    """
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    lq, lk = q.shape[2], k.shape[2]
    out = q.new_empty(*q.shape[:3], v.shape[-1])
    for start in range(0, lq, BLOCK):
        stop = min(start + BLOCK, lq)
        keys = min(stop, lk) if is_causal else lk
        scores = q[:, :, start:stop] @ k[:, :, :keys].transpose(-2, -1) * scale
        if is_causal:
            rows = torch.arange(start, stop, device=q.device)[:, None]
            later = torch.arange(keys, device=q.device) > rows
            scores = scores.masked_fill(later, -math.inf)
        if attn_mask is not None:
            block = attn_mask if attn_mask.shape[2] == 1 else attn_mask[:, :, start:stop]
            scores = scores.masked_fill(~block[..., :keys], -math.inf)
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[:, :, start:stop] = weights @ v[:, :, :keys]
    return out
