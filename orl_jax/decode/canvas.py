"""The canvas `[prompt | response blocks]` and the forwards a denoising step runs on it: the
positions and metadata of prompts and blocks, and `Canvas`, what every step of one decode
shares. A block-causal step forwards the block against the KV cache (or, without it, the whole
canvas under the staircase mask); a bidirectional family (LLaDA) forwards the whole canvas, or,
with `decode.cache` (Fast-dLLM, approximate), the whole canvas once at each block start and
then only the block (`dual`) or the block and what follows it (`prefix`) against the K/V that
forward stored (`Canvas.cached_step_hidden`)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from orl_jax.decode.config import DecodeConfig
from orl_jax.models.transformer import Transformer, init_cache
from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                TokenMeta, make_meta)


def prompt_layout(prompt_valid, block_size: int):
  """Positions and metadata of a left-padded prompt [B, P] (P a multiple of b)."""
  b_rows, p = prompt_valid.shape
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b_rows, p))
  kind = jnp.where(prompt_valid, KIND_PROMPT, KIND_PAD)
  return positions, make_meta(kind, positions // block_size, segment=0, response=-1)


def block_layout(b_rows, start, block_size: int, kind: int):
  """Positions [B, b] and metadata of the response block starting at canvas index `start`."""
  positions = jnp.broadcast_to(start + jnp.arange(block_size, dtype=jnp.int32),
                               (b_rows, block_size))
  state_id = 0 if kind == KIND_STATE else -1
  return positions, make_meta(jnp.full((b_rows, block_size), kind), positions // block_size,
                              segment=0, response=0, state_id=state_id)


@dataclasses.dataclass(frozen=True)
class Canvas:
  """What every step of one `decode` call shares: the model, the shapes and the whole-canvas
  layout ([prompt | response blocks], used by steps that forward the whole canvas)."""
  model: Transformer
  cfg: DecodeConfig
  b_rows: int
  p: int                     # prompt length (a multiple of b)
  # the whole-canvas layout; None in the per-row engine, which never forwards the whole canvas
  valid: jax.Array | None    # [B, P + M*b] bool: prompt padding is False (M = max_blocks)
  positions: jax.Array | None  # [B, P + M*b] int32
  meta: TokenMeta | None     # [B, P + M*b] TokenMeta of a bidirectional forward
  embedding: jax.Array       # [V, D] the input embedding table the residual is built from
  lead: jax.Array | None = None   # [B] int32 prompt tokens opening the first block (`Placed`)

  @property
  def bidirectional(self) -> bool:
    return self.model.cfg.attention == "bidirectional"

  def step_meta(self, start):
    """Whole-canvas metadata of a block-causal step without cache: prompt, committed (clean)
    blocks, the active block as one state, nothing after it."""
    idx, p, b = self.positions, self.p, self.cfg.block_size
    kind = jnp.where(idx < p, jnp.where(self.valid, KIND_PROMPT, KIND_PAD),
                     jnp.where(idx < start, KIND_CLEAN,
                               jnp.where(idx < start + b, KIND_STATE, KIND_PAD)))
    return make_meta(kind, idx // b, segment=0, response=jnp.where(idx < p, -1, 0),
                     state_id=jnp.where(kind == KIND_STATE, 0, -1))

  def canvas_logits(self, canvas, block_tokens, start, res: Residual, write_cache=False):
    """`canvas_hidden` through the vocabulary head: ([B, b, V] logits, cache or None)."""
    hidden, cache = self.canvas_hidden(canvas, block_tokens, start, res, write_cache)
    return self.model.head(hidden), cache

  def canvas_hidden(self, canvas, block_tokens, start, res: Residual, write_cache=False):
    """([B, b, D] final hidden states of the active block, the KV cache of the whole canvas or
    None): one forward of the whole canvas with the block and its residual in place, its last
    layer only at the block (`keep`). `write_cache` (bidirectional families' block start) also
    stores every position's K/V; the forward is the same either way (the block's queries see
    the same keys), so its logits are `none`'s."""
    model, b_rows, b = self.model, self.b_rows, self.cfg.block_size
    width = canvas.shape[1]
    full = jax.lax.dynamic_update_slice_in_dim(canvas, block_tokens, start, axis=1)
    z = jnp.zeros((b_rows, width, model.cfg.d_model), model.cfg.compute_dtype)
    z = jax.lax.dynamic_update_slice_in_dim(z, res.z, start, axis=1)
    alpha = jax.lax.dynamic_update_slice_in_dim(jnp.zeros((b_rows, width)), res.alpha, start, 1)
    meta = self.meta if self.bidirectional else self.step_meta(start)
    if self.positions is None or meta is None:
      raise ValueError("this Canvas has no whole-canvas layout (the per-row engine's): it "
                       "cannot forward the whole canvas")
    cache = init_cache(model.cfg, b_rows, width) if write_cache else None
    hidden, cache, _ = model.hidden_states(full, self.positions, meta,
                                           residual=Residual(z, alpha), cache=cache,
                                           cache_mode="write" if write_cache else None,
                                           keep=(start, b))
    return hidden, cache

  def cached_step_logits(self, canvas, block_tokens, start, res: Residual, cache):
    """`cached_step_hidden` through the vocabulary head: [B, b, V] logits."""
    return self.model.head(self.cached_step_hidden(canvas, block_tokens, start, res, cache))

  def cached_step_hidden(self, canvas, block_tokens, start, res: Residual, cache):
    """[B, b, D] hidden states of a later step of the block (decode.cache, Fast-dLLM): the queries
    (`dual`: the b block tokens; `prefix`: the N tokens from the block start on, the canvas's
    end padded) attend to the stored K/V of the other positions plus their own fresh K/V. The
    stored block slot (and, for `prefix`, everything after it) is hidden by marking it
    KIND_PAD in the cache metadata, not sliced away, so the block start may differ per row."""
    model, cfg, b_rows, b = self.model, self.cfg, self.b_rows, self.cfg.block_size
    tokens, residual = block_tokens, res
    width = b if cfg.cache == "dual" else cfg.gen_length
    if width > b:   # prefix: the block, then the canvas after it (padded past its end)
      padded = jnp.pad(canvas, ((0, 0), (0, width)), constant_values=cfg.mask_id)
      tokens = jax.lax.dynamic_update_slice_in_dim(
          jax.lax.dynamic_slice_in_dim(padded, start, width, axis=1), block_tokens, 0, axis=1)
      pad = ((0, 0), (0, width - b))
      residual = Residual(jnp.pad(res.z, pad + ((0, 0),)), jnp.pad(res.alpha, pad))
    positions = jnp.broadcast_to(start + jnp.arange(width, dtype=jnp.int32), (b_rows, width))
    in_canvas = positions < canvas.shape[1]
    meta = make_meta(jnp.where(in_canvas, KIND_PROMPT, KIND_PAD), 0, segment=0)
    hide_end = start + b if cfg.cache == "dual" else canvas.shape[1]
    stored = cache._replace(meta=_hide_span(cache.meta, start, hide_end))
    hidden, _, _ = model.hidden_states(tokens, positions, meta, residual=residual, cache=stored,
                                       cache_mode="read", keep=(0, b) if width > b else None)
    return hidden

  def step_logits(self, canvas, block_tokens, start, res: Residual, cache):
    """`step_hidden` through the vocabulary head: ([B, b, V] logits, routes or None)."""
    hidden, routes = self.step_hidden(canvas, block_tokens, start, res, cache)
    return self.model.head(hidden), routes

  def step_hidden(self, canvas, block_tokens, start, res: Residual, cache):
    """([B, b, D] hidden states of the active block, its routes [L_moe, B, b, K] or None):
    through the KV cache, or by forwarding the whole canvas (bidirectional families;
    block-causal ones with `kv_cache=False`; neither captures routes)."""
    model, cfg, b_rows, b = self.model, self.cfg, self.b_rows, self.cfg.block_size
    if self.bidirectional or not cfg.kv_cache:
      return self.canvas_hidden(canvas, block_tokens, start, res)[0], None
    pos, meta = block_layout(b_rows, start, b, KIND_STATE)
    hidden, _, _, routing = model.hidden_states_and_routing(
        block_tokens, pos, meta, residual=res, cache=cache, cache_mode="read")
    return hidden, (routing.expert_ids if cfg.capture_routes else None)


def _hide_span(meta: TokenMeta, lo, hi) -> TokenMeta:
  """`meta` with positions lo <= t < hi marked KIND_PAD (seen by no query). lo, hi: scalars or
  [B, 1] per-row bounds."""
  idx = jnp.arange(meta.kind.shape[-1], dtype=jnp.int32)
  hidden = (idx >= lo) & (idx < hi)
  return meta._replace(kind=jnp.where(hidden, KIND_PAD, meta.kind))
