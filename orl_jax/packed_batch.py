"""The packed rows every training forward consumes (SFT, ORL replay, offline RCD) and the SFT
layout that builds them from data (`sft_batch`). Three types: `PackedBatch`, what every forward
reads (tokens, positions, staircase metadata, the residual consumed at state tokens, targets);
`SftBatch` adds the 1/t CE weight; `ReplayBatch` (built by `replay/gather.py`) adds the rollout
statistics, the response/state slots and AEC pairs its losses need, the captured MoE routes and,
once attached (`losses.attach_reference`), the frozen reference's outputs on its rows."""
from __future__ import annotations

import dataclasses
from typing import ClassVar, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from orl_jax.decode.placement import place_prompts
from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                TokenMeta, make_meta)


@struct.dataclass
class PackedBatch:
  """The packed rows a forward reads; the losses' types extend it."""
  tokens: jax.Array          # [R, T] int32 input tokens of packed rows
  positions: jax.Array       # [R, T] int32 RoPE positions (a state repeats its block's positions)
  meta: TokenMeta            # [R, T] staircase metadata
  residual: Residual | None  # z [R, T, D], alpha [R, T] consumed at state tokens (None: none)
  targets: jax.Array         # [R, T] int32 token each position is trained to predict

  # the fields with one entry per row; the others (AEC pairs, state slots) are per update
  ROW_FIELDS: ClassVar[tuple[str, ...]] = ("tokens", "positions", "meta", "residual", "targets")


@struct.dataclass
class SftBatch(PackedBatch):
  """SFT rows (`sft_batch`): the 1/t-weighted masked CE's weight on top of the packed rows."""
  ce_weight: jax.Array       # [R, T] f32, already normalised per response

  ROW_FIELDS: ClassVar[tuple[str, ...]] = PackedBatch.ROW_FIELDS + ("ce_weight",)


@struct.dataclass
class ReplayBatch(PackedBatch):
  """ORL replay rows (`replay.gather_batch`) with what the ORL losses read."""
  masked: jax.Array            # [R, T] bool state token the losses train (masked / not accepted)
  rollout_entropy: jax.Array   # [R, T]
  topk_ids: jax.Array          # [R, T, K]
  topk_logprobs: jax.Array     # [R, T, K]
  state_slot: jax.Array        # [R, T] selected-state slot, -1 elsewhere
  resp_slot: jax.Array         # [R, T] response slot, -1 elsewhere
  pair_a: jax.Array            # [Q] state slot k of an AEC pair (k, k+1)
  pair_b: jax.Array            # [Q] state slot k + 1
  pair_resp: jax.Array         # [Q] response slot of the pair
  pair_valid: jax.Array        # [Q] bool
  state_resp: jax.Array        # [S] response slot of each state slot
  n_responses: jax.Array       # scalar: responses that produce gradient
  rollout_step: jax.Array      # scalar: update the trajectories were drawn for
  routes: jax.Array | None = None  # [R, T, L_moe, K] int32 captured expert ids of each token
                                   # (-1: route afresh); None: no capture
  # The frozen KL reference on these rows (losses.attach_reference; None until attached):
  ref_hidden: jax.Array | None = None   # [R, T, D] its final hidden states
  ref_entropy: jax.Array | None = None  # [R, T] its normalized entropy (the anchor's gate)

  ROW_FIELDS: ClassVar[tuple[str, ...]] = PackedBatch.ROW_FIELDS + (
      "masked", "rollout_entropy", "topk_ids", "topk_logprobs", "state_slot", "resp_slot",
      "routes", "ref_hidden", "ref_entropy")


def layer_routes(batch: ReplayBatch):
  """The captured routes as the model's `routes=` argument ([L_moe, R, T, K]), or None."""
  return None if batch.routes is None else jnp.moveaxis(batch.routes, 2, 0)


def masked_state_tokens(batch: PackedBatch, mask_id: int):
  """[R, T] bool: the noised tokens a residual is fed at (masked tokens of state blocks)."""
  return (batch.meta.kind == KIND_STATE) & (batch.tokens == mask_id)


_Batch = TypeVar("_Batch", bound=PackedBatch)


def micro_batch_of_rows(n_rows: int, micro_batches: int, n_shards: int = 1) -> np.ndarray:
  """[R] micro-batch index of each row under `split_rows`: every data shard's block of rows
  is cut into `micro_batches` consecutive chunks, so a micro-batch keeps rows on their shard."""
  per_shard = n_rows // n_shards
  return (np.arange(n_rows) % per_shard) // (per_shard // micro_batches)


def split_rows(batch: _Batch, micro_batches: int, n_shards: int = 1) -> _Batch:
  """The batch with a leading [micro_batches] axis on every leaf, for `lax.scan`: row fields
  (`ROW_FIELDS` of its type) are cut as `micro_batch_of_rows` says ([R, ...] -> [M, R / M, ...]),
  per-update fields are repeated."""
  n_rows = batch.tokens.shape[0]
  if n_rows % (n_shards * micro_batches):
    raise ValueError(f"{n_rows} replay rows cannot be split into {micro_batches} micro-batches "
                     f"on each of {n_shards} data shards; make replay.n_rows a multiple of "
                     f"{n_shards * micro_batches}")

  def rows(x):  # [R, ...] = [shard, micro, row, ...] -> [micro, shard * row, ...]
    x = x.reshape((n_shards, micro_batches, n_rows // (n_shards * micro_batches)) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape((micro_batches, n_rows // micro_batches) + x.shape[3:])

  repeat = lambda x: jnp.broadcast_to(x, (micro_batches,) + jnp.shape(x))
  return dataclasses.replace(
      batch, **{f.name: jax.tree.map(rows if f.name in batch.ROW_FIELDS else repeat,
                                     getattr(batch, f.name))
                for f in dataclasses.fields(batch)})


# --- the SFT layout (docs/method.md#the-losses) -----------------------------------------------
# Masked-diffusion SFT in the block-diffusion layout `[prompt | x_0 | x_t]`: each response block j
# appears noised (x_t, kind STATE of block j, its own state_id) and, except the last block (no
# state ever sees it), clean (x_0, kind CLEAN). Under the staircase mask the noised block sees
# the prompt and the clean blocks before j - exactly what a decoding step of block j sees through
# the KV cache - so SFT, ORL replay and decoding share one layout, blocks placed alike
# (`decode.placement.place_prompts`: with absolute placement the prompt's last n mod b tokens
# open the first block, clean and never masked, and the response follows them).

MIN_T = 1e-3  # lower bound of the sampled mask ratio (keeps the 1/t weight finite)


def noise_blocks(key, response, *, block_size: int, mask_id: int, fixed=None):
  """Masks each block of `response` [B, N] with its own ratio t ~ U(MIN_T, 1].

  Returns (noised [B, N], masked [B, N] bool, t [B, N] per-token ratio of its block).
  At least one token per block is masked (the one with the smallest uniform draw); positions
  `fixed` [B, N] (prompt tokens inside a block) never are.
  """
  b_rows, n = response.shape
  n_blocks = n // block_size
  k_t, k_u = jax.random.split(key)
  t = jax.random.uniform(k_t, (b_rows, n_blocks, 1), minval=MIN_T, maxval=1.0)
  u = jax.random.uniform(k_u, (b_rows, n_blocks, block_size))
  if fixed is not None:
    u = jnp.where(fixed.reshape(u.shape), jnp.inf, u)
  masked = u < t
  first = jnp.arange(block_size) == jnp.argmin(u, axis=-1, keepdims=True)
  masked = (masked | (first & jnp.isfinite(u))).reshape(b_rows, n)
  t = jnp.broadcast_to(t, (b_rows, n_blocks, block_size)).reshape(b_rows, n)
  return jnp.where(masked, mask_id, response), masked, t


def placed_blocks(prompt_tokens, prompt_valid, response, *, block_size: int, mask_id: int,
                  eos_id: int, placement: str):
  """(prompt [B, P] as the prefill reads it, blocks [B, M*b] of the response placed on the
  block grid: the prompt's last `lead` tokens, the response, EOS after it; fixed [B, M*b] the
  prompt positions among them). M = N / b, one more with absolute placement."""
  b_rows, n = response.shape
  grid = place_prompts(prompt_tokens, prompt_valid, block_size, mask_id, placement)
  width = n + (block_size if placement == "absolute" else 0)
  col = jnp.arange(width)[None, :]
  at = jnp.clip(col - grid.lead[:, None], 0, n - 1)
  head = jnp.pad(grid.head, ((0, 0), (0, width - block_size)), constant_values=mask_id)
  fixed = col < grid.lead[:, None]
  blocks = jnp.where(fixed, head, jnp.where(col < grid.lead[:, None] + n,
                                            jnp.take_along_axis(response, at, axis=1), eos_id))
  return grid, blocks.astype(jnp.int32), fixed


def sft_batch(key, prompt_tokens, prompt_valid, response, *, block_size: int,
              mask_id: int, eos_id: int = 0, placement: str = "prompt_end") -> SftBatch:
  """One row per example: [prompt (P) | clean blocks 0..M-2 | noised blocks (M*b)], the blocks
  placed as `placement` (`decode.config.PLACEMENTS`) places them; `eos_id` fills the tail of the
  last block past the response (absolute placement)."""
  grid, blocks, fixed = placed_blocks(prompt_tokens, prompt_valid, response,
                                      block_size=block_size, mask_id=mask_id, eos_id=eos_id,
                                      placement=placement)
  b_rows, p = prompt_tokens.shape
  n, width = response.shape[1], blocks.shape[1]
  c = width - block_size                   # the last clean block is visible to no state
  noised, masked, t = noise_blocks(key, blocks, block_size=block_size, mask_id=mask_id,
                                   fixed=fixed)
  tokens = jnp.concatenate([grid.tokens, blocks[:, :c], noised], axis=1)
  resp_pos = p + jnp.arange(width, dtype=jnp.int32)
  positions = jnp.concatenate([jnp.arange(p, dtype=jnp.int32), resp_pos[:c], resp_pos])
  positions = jnp.broadcast_to(positions, tokens.shape)
  kind = jnp.concatenate([jnp.where(grid.valid, KIND_PROMPT, KIND_PAD),
                          jnp.full((b_rows, c), KIND_CLEAN),
                          jnp.full((b_rows, width), KIND_STATE)], axis=1)
  block = positions // block_size
  response_id = jnp.where(jnp.arange(p + c + width) < p, -1, 0)
  state_id = jnp.where(kind == KIND_STATE, block, -1)
  meta = make_meta(kind, block, segment=0, response=response_id, state_id=state_id)
  weight = jnp.where(masked, 1.0 / t, 0.0) / n
  zeros = jnp.zeros((b_rows, p + c), jnp.float32)
  return SftBatch(tokens=tokens, positions=positions, meta=meta, residual=None,
                     targets=jnp.concatenate([grid.tokens, blocks[:, :c], blocks], axis=1),
                     ce_weight=jnp.concatenate([zeros, weight], axis=1))
