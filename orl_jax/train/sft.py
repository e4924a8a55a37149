"""Masked-diffusion SFT in the block-diffusion layout `[prompt | x_0 | x_t]` (DESIGN §2.7).

Each response block j appears noised (x_t, kind STATE of block j, its own state_id) and, except
the last block (no state ever sees it), clean (x_0, kind CLEAN). Under the staircase mask the noised block sees the prompt and the clean
blocks before j — exactly what a decoding step of block j sees through the KV cache — so SFT,
ORL replay and decoding share one layout. Loss: 1/t-weighted CE on masked response tokens,
normalised per response (by its length N), at least one masked token per block.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from orl_jax.batch import PackedBatch
from orl_jax.residual import Residual, residual_from_logits
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                make_meta)

MIN_T = 1e-3  # lower bound of the sampled mask ratio (keeps the 1/t weight finite)


def noise_blocks(key, response, *, block_size: int, mask_id: int):
  """Masks each block of `response` [B, N] with its own ratio t ~ U(MIN_T, 1].

  Returns (noised [B, N], masked [B, N] bool, t [B, N] per-token ratio of its block).
  At least one token per block is masked (the one with the smallest uniform draw).
  """
  b_rows, n = response.shape
  n_blocks = n // block_size
  k_t, k_u = jax.random.split(key)
  t = jax.random.uniform(k_t, (b_rows, n_blocks, 1), minval=MIN_T, maxval=1.0)
  u = jax.random.uniform(k_u, (b_rows, n_blocks, block_size))
  masked = u < t
  first = jnp.arange(block_size) == jnp.argmin(u, axis=-1, keepdims=True)
  masked = (masked | first).reshape(b_rows, n)
  t = jnp.broadcast_to(t, (b_rows, n_blocks, block_size)).reshape(b_rows, n)
  return jnp.where(masked, mask_id, response), masked, t


def sft_batch(key, prompt_tokens, prompt_valid, response, *, block_size: int,
              mask_id: int) -> PackedBatch:
  """One row per example: [prompt (P) | clean blocks 0..n-2 (N - b) | noised response (N)]."""
  b_rows, p = prompt_tokens.shape
  n = response.shape[1]
  c = n - block_size                       # the last clean block is visible to no state
  noised, masked, t = noise_blocks(key, response, block_size=block_size, mask_id=mask_id)
  tokens = jnp.concatenate([prompt_tokens, response[:, :c], noised], axis=1)
  resp_pos = p + jnp.arange(n, dtype=jnp.int32)
  positions = jnp.concatenate([jnp.arange(p, dtype=jnp.int32), resp_pos[:c], resp_pos])
  positions = jnp.broadcast_to(positions, tokens.shape)
  kind = jnp.concatenate([jnp.where(prompt_valid, KIND_PROMPT, KIND_PAD),
                          jnp.full((b_rows, c), KIND_CLEAN), jnp.full((b_rows, n), KIND_STATE)],
                         axis=1)
  block = positions // block_size
  response_id = jnp.where(jnp.arange(p + c + n) < p, -1, 0)
  state_id = jnp.where(kind == KIND_STATE, block, -1)
  meta = make_meta(kind, block, segment=0, response=response_id, state_id=state_id)
  weight = jnp.where(masked, 1.0 / t, 0.0) / n
  zeros = jnp.zeros((b_rows, p + c), jnp.float32)
  return PackedBatch(tokens=tokens, positions=positions, meta=meta,
                     targets=jnp.concatenate([prompt_tokens, response[:, :c], response], axis=1),
                     ce_weight=jnp.concatenate([zeros, weight], axis=1))


def masked_state_tokens(pb: PackedBatch, mask_id: int):
  """[R, T] bool: the noised tokens a residual is fed at (masked tokens of state blocks)."""
  return (pb.meta.kind == KIND_STATE) & (pb.tokens == mask_id)


def self_conditioning_residual(model, pb: PackedBatch, key, probability: float) -> Residual:
  """The residual warm-up's input (`train.mode = "residual_warmup"`, DESIGN §2.1): for a random
  `probability` share of the rows, a first no-gradient pass of the model itself gives p on the
  noised input and the second pass consumes z = p @ E (scaled like the token embeddings) at the
  masked state tokens; the other rows get no residual (a block's first step: cold start)."""
  cfg = model.cfg
  logits = jax.lax.stop_gradient(model(pb.tokens, pb.positions, pb.meta).logits)
  res = residual_from_logits(logits, jax.lax.stop_gradient(model.embedding_table),
                             embed_scale=cfg.embed_scale, temperature=cfg.residual_temperature,
                             dtype=cfg.compute_dtype)
  use = jax.random.bernoulli(key, probability, (pb.tokens.shape[0], 1))
  at = masked_state_tokens(pb, cfg.mask_id) & use
  return Residual(jnp.where(at[..., None], res.z, 0), jnp.where(at, res.alpha, 0))
