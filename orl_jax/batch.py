"""The packed row every training forward consumes (SFT, ORL replay, offline RCD)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import TokenMeta


@struct.dataclass
class PackedBatch:
  tokens: jax.Array      # [R, T] int32 input tokens of packed rows
  positions: jax.Array   # [R, T] int32 RoPE positions (a state repeats its block's positions)
  meta: TokenMeta        # [R, T] staircase metadata
  targets: jax.Array     # [R, T] int32 token each position is trained to predict
  ce_weight: jax.Array   # [R, T] f32 CE weight, already normalised per response
  residual: Residual | None = None   # [R, T, D] / [R, T] residual consumed at state tokens


def weighted_cross_entropy(logits, targets, weight):
  """sum(weight * -log softmax(logits)[target]) in f32, plus the weight mass for metrics."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return jnp.sum(nll * weight), nll
