"""Per-token metadata of packed rows and the staircase visibility rule
(docs/method.md#replay-states-packing-staircase-attention).

Every attention in the project (SFT rows, packed replay, KV-cache decoding, bidirectional
canvases) is described by two `TokenMeta` — one for the queries, one for the keys — and the rule
in `staircase_visible`. Simple layouts are special cases:

* bidirectional canvas: every token `kind=PROMPT`, `block=0` -> everyone sees everyone in the
  segment;
* block-causal stream: every token `kind=PROMPT` (or CLEAN of one response), `block=pos // b`;
* a decoding step of block j: queries `kind=STATE, block=j, state_id=s` against the KV cache
  (`kind=CLEAN/PROMPT`, earlier blocks) plus the step's own keys (`kind=STATE, state_id=s`);
* a **token-causal** context stream (DiffusionGemma's commit forward) is a block-causal stream
  with blocks of one token: `block = position` for prompt and clean tokens, and a state's
  `block` is the first position of its canvas (it sees every committed token before it);
* a **sliding window** (`window > 0`, the sliding layers of a token-causal stream) keeps a
  context key only when `block[k] > block[q] − window`: a context query sees itself and the
  `window − 1` tokens before it (the commit forward), a state the last `window − 1` committed
  tokens before its canvas (the decoder's sliding cache); state keys are not windowed.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

KIND_PAD = 0
KIND_PROMPT = 1
KIND_CLEAN = 2
KIND_STATE = 3


class TokenMeta(NamedTuple):
  """Per-token ids of a packed row. All fields are int32 `[B, T]` (or `[T]`)."""
  segment: jax.Array   # prompt group; tokens of different segments never interact
  response: jax.Array  # response index inside the segment, -1 for prompt tokens
  kind: jax.Array      # KIND_PAD | KIND_PROMPT | KIND_CLEAN | KIND_STATE
  block: jax.Array     # absolute position // block_size (a state: the block it denoises)
  state_id: jax.Array  # unique per captured state within a row, -1 for non-state tokens

  @property
  def shape(self):
    return self.kind.shape

  def slice(self, start: int, size: int, axis: int = -1) -> "TokenMeta":
    return TokenMeta(*(jax.lax.slice_in_dim(f, start, start + size, axis=axis) for f in self))

  def concat(self, other: "TokenMeta", axis: int = -1) -> "TokenMeta":
    return TokenMeta(*(jnp.concatenate([a, b], axis=axis) for a, b in zip(self, other)))


def make_meta(kind, block, *, segment=None, response=None, state_id=None) -> TokenMeta:
  """Builds a TokenMeta, defaulting segment to 0 (1 for non-pad), response and state_id to -1."""
  kind = jnp.asarray(kind, jnp.int32)
  block = jnp.broadcast_to(jnp.asarray(block, jnp.int32), kind.shape)
  full = lambda x, default: (jnp.full(kind.shape, default, jnp.int32) if x is None
                             else jnp.broadcast_to(jnp.asarray(x, jnp.int32), kind.shape))
  return TokenMeta(segment=full(segment, 0), response=full(response, -1), kind=kind,
                   block=block, state_id=full(state_id, -1))


def staircase_visible(q: TokenMeta, k: TokenMeta, xp=jnp, window: int = 0):
  """Boolean [..., Tq, Tk]: may query q attend to key k
  (docs/method.md#replay-states-packing-staircase-attention; `window` > 0: a sliding window over the
  context keys, see the module docstring).

  Works with jax.numpy or numpy (`xp=np`) so kernels, tile maps and tests share one rule.
  """
  q_cols = TokenMeta(*(f[..., :, None] for f in q))
  k_rows = TokenMeta(*(f[..., None, :] for f in k))
  return staircase_visible_pairs(q_cols, k_rows, window)


def staircase_visible_pairs(q: TokenMeta, k: TokenMeta, window: int = 0):
  """The staircase rule on fields that already broadcast against each other.

  Kernels call this on a `[bq, 1]` query tile and a `[1, bk]` key tile of ids, so the
  in-kernel mask is the very rule the dense reference uses (one implementation).
  """
  real = (q.kind != KIND_PAD) & (k.kind != KIND_PAD)
  same_group = (q.segment == k.segment) & ((k.kind == KIND_PROMPT) | (k.response == q.response))
  q_ctx = (q.kind == KIND_PROMPT) | (q.kind == KIND_CLEAN)
  k_ctx = (k.kind == KIND_PROMPT) | (k.kind == KIND_CLEAN)
  q_state = q.kind == KIND_STATE
  k_state = k.kind == KIND_STATE
  if window:
    k_ctx = k_ctx & (k.block > q.block - window)
  ctx_ctx = q_ctx & k_ctx & (k.block <= q.block)
  state_ctx = q_state & k_ctx & (k.block < q.block)
  state_state = q_state & k_state & (q.state_id == k.state_id)
  return real & same_group & (ctx_ctx | state_ctx | state_state)
