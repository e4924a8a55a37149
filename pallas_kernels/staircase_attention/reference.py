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

  Written for the dense XLA path's cost, which is the [Tq, Tk] passes: the matmuls run
  head-major (XLA:CPU was ~2x slower on the heads-in-the-middle einsum at replay shapes), the
  no-visible-key guard is on the row maximum instead of a second mask pass, and the softmax
  denominator divides the [Tq, Dh] output instead of the [Tq, Tk] probabilities.
  """
  b, tq, hq, dh = q.shape
  hkv = k.shape[2]
  if hq % hkv:
    raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
  groups = hq // hkv
  scale = dh ** -0.5 if scale is None else scale
  qg = q.reshape(b, tq, hkv, groups, dh).transpose(0, 2, 3, 1, 4)
  logits = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k.transpose(0, 2, 1, 3),
                      preferred_element_type=jnp.float32) * scale
  logits = jnp.where(mask[:, None, None, :, :], logits, _MASKED)
  row_max = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  row_max = jnp.where(row_max > _MASKED / 2, row_max, 0.0)  # no visible key: every exp is 0
  weights = jnp.exp(logits - row_max)                       # unnormalised probabilities
  denom = jnp.sum(weights, axis=-1, keepdims=True)
  out = jnp.einsum("bhgqk,bhkd->bhgqd", weights.astype(v.dtype), v.transpose(0, 2, 1, 3),
                   preferred_element_type=jnp.float32)
  out = out / jnp.where(denom > 0, denom, 1.0)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, tq, hq, dh).astype(q.dtype)


def staircase_attention_reference(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *,
                                  scale: float | None = None, window: int = 0):
  """Builds the dense [B, Tq, Tk] mask from the metadata and runs `masked_attention`."""
  return masked_attention(q, k, v, staircase_visible(q_meta, k_meta, window=window),
                          scale=scale)
