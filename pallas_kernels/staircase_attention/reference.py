"""Dense XLA staircase attention: the oracle every kernel is checked against."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.staircase_attention.meta import TokenMeta, staircase_visible

_MASKED = -1e30  # finite, so fully masked rows never produce inf - inf


def masked_attention(q, k, v, mask, *, scale: float | None = None):
  """Softmax attention with an explicit boolean mask.

  q: [B, Tq, Hq, Dh]; k, v: [B, Tk, Hkv, Dh] with Hq % Hkv == 0 (GQA); mask: [B, Tq, Tk].
  A query with no visible key outputs zeros and receives zero gradients (guarded softmax).
  Logits and softmax are computed in f32; the output has q's dtype.
  """
  b, tq, hq, dh = q.shape
  hkv = k.shape[2]
  if hq % hkv:
    raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
  groups = hq // hkv
  scale = dh ** -0.5 if scale is None else scale
  qg = q.reshape(b, tq, hkv, groups, dh)
  logits = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scale
  m = mask[:, None, None, :, :]
  logits = jnp.where(m, logits, _MASKED)
  row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  probs = jnp.exp(logits - row_max) * m
  denom = jnp.sum(probs, axis=-1, keepdims=True)
  probs = probs / jnp.where(denom > 0, denom, 1.0)
  out = jnp.einsum("bhgqk,bkhd->bqhgd", probs.astype(v.dtype), v,
                   preferred_element_type=jnp.float32)
  return out.reshape(b, tq, hq, dh).astype(q.dtype)


def staircase_attention_reference(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *,
                                  scale: float | None = None):
  """Builds the dense [B, Tq, Tk] mask from the metadata and runs `masked_attention`."""
  return masked_attention(q, k, v, staircase_visible(q_meta, k_meta), scale=scale)
