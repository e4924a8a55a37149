"""Block-diffusion decoding inside `jit` (DESIGN §2.2) with optional exact state capture (§2.3).

For each block: fill with [MASK]; repeat denoising steps until no mask remains (each step:
forward the block against the KV cache, propose a token per position, commit by the unmasking
rule, carry the residual); then one commit forward writes the block into the KV cache.
Bidirectional families (LLaDA) forward the whole canvas each step and need no commit forward,
or, with `cache` (Fast-dLLM, approximate), forward the whole canvas once at each block start
and then only the block (`dual`) or the block and what follows it (`prefix`) against the K/V
that forward stored (see `Canvas.cached_step_logits`).

Where blocks sit follows each family's authors (`block_placement`, `place_prompts`):
"prompt_end" starts the first block at the prompt's end (Fast-dLLM's LLaDA-8B; our tiny
model); "absolute" puts block boundaries at multiples of b counted from the first prompt token
(LLaDA2.x, SDAR), so a prompt of n tokens shares its last block with the first b - n mod b
generated tokens: those prompt tokens sit in the first decoded block (bidirectional with its
masks, never rewritten), the KV prefill covers the prompt's complete blocks only, and a row
decodes ceil((n mod b + N) / b) blocks, its response cut to N tokens. Prompts arrive
left-padded to P (a block multiple); each row is shifted right by its `lead` = n mod b so its
blocks align with the canvas's (the response of row r starts at canvas index P + lead[r]).

Everything runs in `lax.while_loop`s with static shapes: a batch of prompts decodes together,
rows finish independently (EOS, `eos_early_stop`), and there is no host synchronisation per
step.

Forwards are counted three ways (DESIGN §2.2, §6). `nfe_denoise` is the authors' count: the
denoising forwards. `nfe` is the paper's count, which TPF uses: denoising steps plus one commit
forward per decoded block, the last block included. The engine spends commit forwards only
where a later block needs the cache (not after a row's last block, not for a row that stops
after this block); `nfe_engine` counts the forwards it actually ran. Bidirectional families
have no KV cache and so no commit forward: all three are the denoising steps (with `cache`, the
block-start forward is the block's first step, as in Fast-dLLM).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax import residual as residual_lib
from orl_jax.decode.types import (ROUTE_DTYPE, Capture, DecodeOutput, RouteCapture,
                                   token_major_routes)
from orl_jax.models.transformer import Transformer, init_cache
from orl_jax.residual import Residual
from orl_jax.unmasking import COMMIT_COMPARES, UnmaskRule, select_commits, select_edits
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                TokenMeta, current_platform, make_meta)


# Bidirectional canvases (decode.cache): "none" forwards the whole canvas every step (exact);
# "prefix" and "dual" are Fast-dLLM's approximate caches, refreshed at every block start.
CACHE_MODES = ("none", "prefix", "dual")
# Where the blocks sit (module docstring): at the prompt's end, or at absolute positions.
PLACEMENTS = ("prompt_end", "absolute")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  gen_length: int                 # N, a multiple of block_size
  block_size: int                 # b
  mask_id: int
  eos_id: int
  rule: UnmaskRule = UnmaskRule()
  temperature: float = 0.0        # 0 = greedy; > 0 = Gumbel sampling at this temperature
  max_steps_per_block: int = 0    # safety bound; 0 -> block_size (every step commits >= 1)
  capture_states: int = 0         # > 0: record up to this many states per row (rollouts)
  top_k: int = 16                 # rollout statistics: top-K ids / log-probs per position
  kv_cache: bool = True           # False: block-causal steps re-forward the whole canvas with the
                                  # staircase mask (the reference the cached path is tested against)
  # LLaDA2.1 token editing (DESIGN §4): a step also rewrites committed tokens of the block whose
  # candidate differs with probability > edit_threshold (1.0 = never: editing off), and a
  # filled block takes up to max_post_edit_steps more steps, until one edits nothing.
  edit_threshold: float = 1.0
  max_post_edit_steps: int = 0
  capture_routes: bool = False    # capture: the MoE expert ids of every forward (exact replay)
  # bidirectional families: none | prefix (later steps forward the block and what follows it
  # against the prefix K/V of the block-start forward) | dual (later steps forward only the
  # block against the prefix and suffix K/V of the block-start forward). Both approximate.
  cache: str = "none"
  # The vocabulary head (and the proposal) only at the block's masked positions: the smallest
  # of b, b/2, b/4, ... 1 slots that holds every row's (one lax.switch per step). Exact; off
  # where a step reads every position's logits (token editing, rollout capture).
  masked_head: bool = True
  # The authors' rules of the model's family (DESIGN §2.2): where blocks sit (PLACEMENTS), how
  # the threshold rule compares (COMMIT_COMPARES), and whether a row stops after the block in
  # which it committed EOS (False: it decodes all its blocks, as LLaDA2.1's and Fast-dLLM's
  # `generate` do by default; the response is cut at the first EOS either way).
  block_placement: str = "prompt_end"
  commit_compare: str = ">="
  eos_early_stop: bool = True

  def __post_init__(self):
    if self.gen_length % self.block_size:
      raise ValueError(f"decode.gen_length ({self.gen_length}) must be a multiple of "
                       f"decode.block_size ({self.block_size})")
    if not 0.0 <= self.edit_threshold <= 1.0:
      raise ValueError(f"decode.edit_threshold={self.edit_threshold} must be in [0, 1] "
                       "(1.0 = no token editing)")
    if self.max_post_edit_steps < 0:
      raise ValueError(f"decode.max_post_edit_steps={self.max_post_edit_steps} must be >= 0")
    if self.max_post_edit_steps and not self.editing:
      raise ValueError(f"decode.max_post_edit_steps={self.max_post_edit_steps} adds editing "
                       "steps, but decode.edit_threshold=1.0 never edits: lower "
                       "decode.edit_threshold (dllm 0.9, SGLang 0.0) or set "
                       "decode.max_post_edit_steps=0")
    if self.cache not in CACHE_MODES:
      raise ValueError(f"decode.cache={self.cache!r} must be one of {CACHE_MODES}")
    if self.cache != "none" and self.capture_states:
      raise ValueError(f"decode.cache={self.cache!r} is approximate: a rollout's captured "
                       "states could not be replayed exactly; rollouts use decode.cache='none'")
    if self.block_placement not in PLACEMENTS:
      raise ValueError(f"decode.block_placement={self.block_placement!r} must be one of "
                       f"{PLACEMENTS}")
    if self.commit_compare not in COMMIT_COMPARES:
      raise ValueError(f"decode.commit_compare={self.commit_compare!r} must be one of "
                       f"{COMMIT_COMPARES}")
    if self.capture_routes and not self.capture_states:
      raise ValueError("orl.capture_routes records routes with the captured states: it needs "
                       "capture_states > 0 (a rollout)")

  @property
  def editing(self) -> bool:
    return self.edit_threshold < 1.0

  @property
  def full_head(self) -> bool:
    """Every position of the block gets logits (editing rewrites committed tokens; capture
    records every position's statistics)."""
    return not self.masked_head or self.editing or self.capture_states > 0

  @property
  def n_blocks(self) -> int:
    return self.gen_length // self.block_size

  @property
  def max_blocks(self) -> int:
    """Blocks a row decodes at most: one more than N / b with absolute placement (the block
    the prompt's last tokens share with the first generated ones)."""
    return self.n_blocks + (self.block_placement == "absolute")

  @property
  def steps_bound(self) -> int:
    """Steps per block at most: the unmasking steps (each commits >= 1) plus the editing steps
    on the filled block."""
    return (self.max_steps_per_block or self.block_size) + self.max_post_edit_steps


def empty_capture(b_rows, cfg: DecodeConfig, d_model, z_dtype, route_dims=None) -> Capture:
  """route_dims: (prompt length, MoE layers, experts per token) when capturing routes."""
  s, b, k = cfg.capture_states, cfg.block_size, cfg.top_k
  i32 = lambda *shape: jnp.zeros(shape, jnp.int32)
  f32 = lambda *shape: jnp.zeros(shape, jnp.float32)
  routes = None
  if route_dims is not None:
    p, n_layers, top_k = route_dims
    none = lambda *shape: jnp.full(shape + (n_layers, top_k), -1, ROUTE_DTYPE)
    routes = RouteCapture(state=none(b_rows, s, b), prompt=none(b_rows, p),
                          clean=none(b_rows, cfg.max_blocks * b))
  return Capture(block_tokens=i32(b_rows, s, b), block=i32(b_rows, s), step=i32(b_rows, s),
                 z=jnp.zeros((b_rows, s, b, d_model), z_dtype), alpha=f32(b_rows, s, b),
                 entropy=f32(b_rows, s, b), topk_ids=i32(b_rows, s, b, k),
                 topk_logprobs=f32(b_rows, s, b, k), commit=jnp.zeros((b_rows, s, b), bool),
                 valid=jnp.zeros((b_rows, s), bool), n_states=i32(b_rows),
                 overflow=jnp.zeros((b_rows,), bool), routes=routes,
                 block_final=i32(b_rows, cfg.max_blocks * b))


def new_capture(model: Transformer, cfg: DecodeConfig, b_rows: int, p: int) -> Capture | None:
  """The empty capture of a decode of `b_rows` prompts of length `p` (None without
  `capture_states`), with the route buffers of `capture_routes`."""
  if not cfg.capture_states:
    return None
  mcfg = model.cfg
  route_dims = (p, mcfg.n_moe_layers, mcfg.moe.top_k) if cfg.capture_routes else None
  return empty_capture(b_rows, cfg, mcfg.d_model, mcfg.compute_dtype, route_dims)


def record_state(cap: Capture, do: jax.Array, routes=None, rows=None, **fields) -> Capture:
  """Writes one state per row where `do` [B] is true (mode='drop' past the buffer's end).
  routes: the step's [L_moe, B, b, K] expert ids (with `capture_routes`). rows: [B] int32 the
  capture row each batch row writes to (default: its own; `orl_jax.engine` passes each row's
  prompt slot, distinct where `do`, out of bounds where `do` is false)."""
  s = cap.valid.shape[1]
  if rows is None:
    rows = jnp.arange(do.shape[0])
  n_states = cap.n_states.at[rows].get(mode="fill", fill_value=s)
  idx = jnp.where(do, n_states, s)      # s is out of bounds -> dropped
  upd = {name: getattr(cap, name).at[rows, idx].set(val, mode="drop")
         for name, val in fields.items()}
  if routes is not None:
    state = cap.routes.state.at[rows, idx].set(token_major_routes(routes), mode="drop")
    upd["routes"] = cap.routes._replace(state=state)
  upd["valid"] = cap.valid.at[rows, idx].set(True, mode="drop")
  rows = jnp.where(do, rows, cap.valid.shape[0])   # rows that record nothing write nothing
  overflow = cap.overflow.at[rows].get(mode="fill", fill_value=False) | (n_states >= s)
  upd["overflow"] = cap.overflow.at[rows].set(overflow, mode="drop")
  upd["n_states"] = cap.n_states.at[rows].set(jnp.minimum(n_states + 1, s), mode="drop")
  return cap._replace(**upd)


def propose(logits, key, temperature: float, noise=None):
  """Candidate token, its probability and the normalized entropy per position (DESIGN §2.2.2).

  logits: [B, b, V] f32. Greedy when temperature == 0, else a Gumbel-max sample of
  softmax(logits / temperature); probabilities are those of the sampling distribution.
  noise: the Gumbel noise to add (default: drawn from `key` in logits' shape).

  A decode step's cost after its forward: the vocabulary is read twice (the candidate, then one
  fused reduction for the partition function and the entropy); no [B, b, V] log-probabilities
  are written (3.6x faster than log_softmax + normalized_entropy at [64, 8, 32k] on CPU).
  """
  scaled = logits.astype(jnp.float32)
  if temperature != 0:
    scaled = scaled / temperature
  if temperature == 0:
    cand = jnp.argmax(scaled, axis=-1)
    top = jnp.take_along_axis(scaled, cand[..., None], axis=-1)    # the maximum
  else:
    if noise is None:
      noise = jax.random.gumbel(key, scaled.shape, jnp.float32)
    cand = jnp.argmax(scaled + noise, axis=-1)
    top = jnp.max(scaled, axis=-1, keepdims=True)
  shifted = scaled - top                                            # <= 0
  e = jnp.exp(shifted)
  z = jnp.sum(e, axis=-1)                                           # >= 1
  conf = jnp.exp(jnp.take_along_axis(shifted, cand[..., None], axis=-1)[..., 0]) / z
  # H = log Z - E_p[shifted]; both terms are >= 0, so no cancellation below zero.
  entropy = (jnp.log(z) - jnp.sum(e * shifted, axis=-1) / z) / math.log(scaled.shape[-1])
  return cand.astype(jnp.int32), conf, entropy


def prompt_layout(prompt_valid, block_size: int):
  """Positions and metadata of a left-padded prompt [B, P] (P a multiple of b)."""
  b_rows, p = prompt_valid.shape
  positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b_rows, p))
  kind = jnp.where(prompt_valid, KIND_PROMPT, KIND_PAD)
  return positions, make_meta(kind, positions // block_size, segment=0, response=-1)


def block_layout(b_rows, start, block_size: int, kind: int):
  """Positions [B, b] and metadata of the response block starting at canvas index `start`."""
  positions = jnp.broadcast_to(start + jnp.arange(block_size, dtype=jnp.int32), (b_rows, block_size))
  state_id = 0 if kind == KIND_STATE else -1
  return positions, make_meta(jnp.full((b_rows, block_size), kind), positions // block_size,
                              segment=0, response=0, state_id=state_id)


class Placed(NamedTuple):
  """Left-padded prompts placed on the block grid (`place_prompts`, module docstring)."""
  tokens: jax.Array   # [B, P] the prompt's complete blocks, left-padded: what the prefill reads
  valid: jax.Array    # [B, P] bool
  lead: jax.Array     # [B] int32 prompt tokens at the start of the first decoded block
  head: jax.Array     # [B, b] int32 the first decoded block before its first step: the
                      # prompt's last `lead` tokens, then masks


def prompt_lead(prompt_valid, block_size: int, placement: str):
  """[B] int32 prompt tokens each row's first decoded block starts with: n mod b with
  absolute placement (n = the row's prompt tokens), 0 at the prompt's end."""
  n = jnp.sum(prompt_valid, axis=-1, dtype=jnp.int32)
  return n % block_size if placement == "absolute" else jnp.zeros_like(n)


def row_blocks(lead, cfg: DecodeConfig):
  """[B] int32 blocks each row decodes: enough to hold its `lead` prompt tokens and N more."""
  return (lead + cfg.gen_length + cfg.block_size - 1) // cfg.block_size


def place_prompts(prompt_tokens, prompt_valid, block_size: int, mask_id: int,
                  placement: str) -> Placed:
  """Prompts [B, P] (left-padded, P a multiple of b) on the block grid of `placement`
  (PLACEMENTS): each row shifted right by its `lead`, so its complete blocks end at P and its
  last `lead` tokens open the first decoded block. "prompt_end" changes nothing (lead 0)."""
  p, b = prompt_tokens.shape[1], block_size
  lead = prompt_lead(prompt_valid, b, placement)
  if placement != "absolute":
    head = jnp.full((prompt_tokens.shape[0], b), mask_id, jnp.int32)
    return Placed(prompt_tokens.astype(jnp.int32), prompt_valid.astype(bool), lead, head)
  src = jnp.arange(p, dtype=jnp.int32)[None, :] - lead[:, None]          # [B, P]
  take = lambda x, idx: jnp.take_along_axis(x, jnp.clip(idx, 0, p - 1), axis=1)
  tokens = take(prompt_tokens, src).astype(jnp.int32)
  valid = take(prompt_valid, src) & (src >= 0)
  col = jnp.arange(b, dtype=jnp.int32)[None, :]
  tail = take(prompt_tokens, p - lead[:, None] + col)                    # [B, b]
  head = jnp.where(col < lead[:, None], tail, mask_id).astype(jnp.int32)
  return Placed(tokens, valid, lead, head)


def place_for_decoder(prompt_tokens, prompt_valid, cfg: DecodeConfig) -> Placed:
  """`place_prompts` on the block grid of a decoder's config."""
  return place_prompts(prompt_tokens, prompt_valid, cfg.block_size, cfg.mask_id,
                       cfg.block_placement)


def fixed_positions(j, lead, block_size: int):
  """[B, b] bool positions of block j that hold prompt tokens (block 0's first `lead`): they
  are context, never masked, edited or part of the response."""
  return (j == 0) & (jnp.arange(block_size)[None, :] < lead[:, None])


@dataclasses.dataclass(frozen=True)
class Canvas:
  """What every step of one `decode` call shares: the model, the shapes and the whole-canvas
  layout ([prompt | response blocks], used by steps that forward the whole canvas)."""
  model: Transformer
  cfg: DecodeConfig
  b_rows: int
  p: int                     # prompt length (a multiple of b)
  valid: jax.Array           # [B, P + M*b] bool: prompt padding is False (M = max_blocks)
  positions: jax.Array       # [B, P + M*b] int32
  meta: object               # [B, P + M*b] TokenMeta of a bidirectional forward
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


class _Step(NamedTuple):
  """The carry of the denoising steps of one block."""
  tokens: jax.Array     # [B, b] the active block
  res: Residual         # what the next step consumes
  step: jax.Array       # scalar int32 steps taken in this block
  nfe: jax.Array        # [B] int32 forwards so far
  post: jax.Array       # [B] int32 steps taken on the filled block (editing)
  settled: jax.Array    # [B] bool a step on the filled block edited nothing (editing)
  cap: Capture | None


def needs_step(cfg: DecodeConfig, active, tokens, post, settled):
  """[B] bool rows that take another step of the block: a mask remains, or (editing) the
  filled block has neither settled nor used its `max_post_edit_steps`."""
  has_mask = jnp.any(tokens == cfg.mask_id, axis=-1)
  if not cfg.editing:
    return active & has_mask
  return active & (has_mask | ((post < cfg.max_post_edit_steps) & ~settled))


def soft_embedding(cv: Canvas, logits) -> Residual:
  """DESIGN §2.2 step 4 at every position of `logits`: z = softmax(logits / T_res) @ E."""
  mcfg = cv.model.cfg
  return residual_lib.residual_from_logits(logits, cv.embedding, embed_scale=mcfg.embed_scale,
                                           temperature=mcfg.residual_temperature,
                                           dtype=mcfg.compute_dtype)


def next_residual(cv: Canvas, nxt: Residual | None, new_tokens, need, res: Residual) -> Residual:
  """This step's soft embedding `nxt` (`soft_embedding`) at the positions still masked (rows
  that took no step keep theirs). None: the model has no residual pathway and the masked head
  computed none; the residual stays zero."""
  if nxt is None:
    return res
  still = (new_tokens == cv.cfg.mask_id)[..., None]
  nxt = Residual(jnp.where(still, nxt.z, 0), jnp.where(still[..., 0], nxt.alpha, 0))
  return jax.tree.map(lambda new, old: jnp.where(
      need.reshape((-1,) + (1,) * (new.ndim - 1)), new, old), nxt, res)


class Proposal(NamedTuple):
  """A step's proposal for the block ([B, b]; unmasked positions are arbitrary when only the
  masked ones went through the head)."""
  cand: jax.Array
  conf: jax.Array
  entropy: jax.Array
  soft: Residual | None      # the next step's residual source (`soft_embedding`), or None
  logits: jax.Array | None   # [B, b, V] every position's logits (`cfg.full_head`), else None


def head_widths(block_size: int) -> tuple[int, ...]:
  """The widths the masked head runs at: b, ceil(b/2), ..., 1."""
  widths = [block_size]
  while widths[-1] > 1:
    widths.append((widths[-1] + 1) // 2)
  return tuple(widths)


def step_noise(cfg: DecodeConfig, key, shape, per_row: bool = False):
  """The Gumbel noise [B, b, V] a sampled step adds to the logits (None when greedy): drawn
  from one `key` for the whole batch, or with `per_row` from [B] keys, row r's from key[r]
  alone (the noise a decode of that row alone with key[r] draws)."""
  if cfg.temperature == 0:
    return None
  if per_row:
    return jax.vmap(lambda k: jax.random.gumbel(k, shape[1:], jnp.float32))(key)
  return jax.random.gumbel(key, shape, jnp.float32)


def step_key(key, block, step):
  """The key of step `step` of block `block` of a decode sampling with `key`."""
  return jax.random.fold_in(jax.random.fold_in(key, block), step)


def propose_masked(cv: Canvas, hidden, masked, key, per_row: bool = False) -> Proposal:
  """The head and the proposal at the masked positions only (`cfg.masked_head`): each row's
  masked positions are gathered into the smallest width of `head_widths` that holds every
  row's, and the results scattered back. Sampling adds the Gumbel noise `propose` would draw
  for the whole block at the same positions (`step_noise`), so tokens equal the whole-block
  head's."""
  cfg, mcfg = cv.cfg, cv.model.cfg
  b_rows, b = masked.shape
  widths = head_widths(b)
  n_masked = jnp.max(jnp.sum(masked, axis=-1))
  branch = jnp.sum(jnp.asarray(widths) >= n_masked) - 1       # the smallest width >= n_masked
  order = jnp.argsort(~masked, axis=-1, stable=True)           # masked positions first
  rows = jnp.arange(b_rows)[:, None]
  noise = step_noise(cfg, key, (b_rows, b, mcfg.vocab_size), per_row)

  def at_width(w):
    def run(_):
      idx = order[:, :w]
      logits = cv.model.head(hidden[rows, idx])                # [B, w, V]
      cand, conf, ent = propose(logits, None, cfg.temperature,
                                None if noise is None else noise[rows, idx])
      put = lambda part, fill: jnp.full((b_rows, b) + part.shape[2:], fill,
                                        part.dtype).at[rows, idx].set(part)
      soft = None
      if mcfg.residual_mode != "none":
        soft = jax.tree.map(lambda x: put(x, 0), soft_embedding(cv, logits))
      return put(cand, cfg.mask_id), put(conf, 0.0), put(ent, 1.0), soft
    return run

  cand, conf, ent, soft = jax.lax.switch(branch, [at_width(w) for w in widths], None)
  return Proposal(cand, conf, ent, soft, None)


def propose_step(cv: Canvas, hidden, masked, key, per_row: bool = False) -> Proposal:
  """The step's proposal from the block's hidden states [B, b, D]: the head at the `masked`
  [B, b] positions only, or at every position where the step reads them all (`full_head`).
  key: the step's key, or with `per_row` [B] keys, one per row (`step_noise`)."""
  cfg = cv.cfg
  if not cfg.full_head:
    return propose_masked(cv, hidden, masked, key, per_row)
  logits = cv.model.head(hidden)
  cand, conf, ent = propose(logits, None, cfg.temperature,
                            step_noise(cfg, key, logits.shape, per_row))
  return Proposal(cand, conf, ent, soft_embedding(cv, logits), logits)


class StepUpdate(NamedTuple):
  """What one denoising step does to a block ([B, b] / [B]); `denoise_update`."""
  tokens: jax.Array     # [B, b] the block after the step
  write: jax.Array      # [B, b] bool positions the step wrote (committed or edited)
  res: Residual         # the residual the next step consumes
  post: jax.Array       # [B] int32 steps taken on the filled block (editing)
  settled: jax.Array    # [B] bool a step on the filled block edited nothing (editing)


def denoise_update(cv: Canvas, tokens, res: Residual, post, settled, need, prop: Proposal,
                   editable=None) -> StepUpdate:
  """The commit/edit rule and the residual update of one step (DESIGN §2.2 steps 2-4), for the
  rows `need` [B] that take it; the others keep their block, residual and counters.

  The unmasking rule commits masked positions from the proposal; with editing (LLaDA2.1) the
  same forward also rewrites `editable` [B, b] committed tokens whose candidate clears the edit
  threshold, counts a step on a filled block (`post`) and marks the block settled when such a
  step edits nothing. The next residual is this step's soft embedding where masks remain."""
  cfg = cv.cfg
  masked = tokens == cfg.mask_id
  write = select_commits(cfg.rule, masked, prop.conf, prop.entropy,
                         cfg.commit_compare) & need[:, None]
  if cfg.editing:
    edits = select_edits(cfg.edit_threshold, tokens, masked, prop.cand, prop.conf,
                         editable) & need[:, None]
    filled = need & ~jnp.any(masked, axis=-1)          # a step on the filled block
    post = post + filled.astype(jnp.int32)
    settled = settled | (filled & ~jnp.any(edits, axis=-1))
    write = write | edits
  new_tokens = jnp.where(write, prop.cand, tokens)
  return StepUpdate(new_tokens, write, next_residual(cv, prop.soft, new_tokens, need, res),
                    post, settled)


def capture_step(cfg: DecodeConfig, cap: Capture | None, need, logits, tokens, res: Residual,
                 write, block, step, routes=None, rows=None) -> Capture | None:
  """Records the state a step consumed (`tokens` [B, b] and `res` before the step), its
  prediction (`logits` [B, b, V]: normalized entropy, top-K) and what it wrote, for the rows
  `need` (`record_state`; `rows`: their capture rows). Unchanged without `capture_states`."""
  if not cfg.capture_states:
    return cap
  logp = jax.nn.log_softmax(logits, axis=-1)
  top_lp, top_ids = jax.lax.top_k(logp, cfg.top_k)
  return record_state(cap, need, routes, rows=rows, block_tokens=tokens, block=block,
                      step=step, z=res.z, alpha=res.alpha,
                      entropy=residual_lib.normalized_entropy(logits), topk_ids=top_ids,
                      topk_logprobs=top_lp, commit=write)


def take_step(cv: Canvas, hidden, need, key, tokens, res: Residual, post, settled, *, block,
              step, fixed, routes=None, cap: Capture | None = None, cap_rows=None,
              per_row: bool = False) -> tuple[StepUpdate, Capture | None]:
  """One denoising step (DESIGN §2.2 steps 2-4; with editing, the LLaDA2.1 token-to-token
  rewrites of the same forward) of the rows `need` [B], from the active block's final hidden
  states [B, b, D]: the proposal (`propose_step`: the head at the masked positions of the rows
  that step, or everywhere where every position is read), the commit/edit rule and the residual
  update (`denoise_update`; the `fixed` [B, b] prompt positions are never edited), and the
  capture of the state the step consumed (`capture_step`, as block `block` [B], step `step`
  [B], with the forward's `routes`, at capture rows `cap_rows`). key: the step's key, or with
  `per_row` [B] keys (`step_key` of each row's own decode). The one denoising step of both
  block decoders (`decode`; `orl_jax.engine`, each row at its own block and step).
  -> (StepUpdate, cap)."""
  cfg = cv.cfg
  masked = (tokens == cfg.mask_id) & need[:, None]
  prop = propose_step(cv, hidden, masked, key, per_row)
  editable = ~fixed if cfg.editing else None
  up = denoise_update(cv, tokens, res, post, settled, need, prop, editable)
  cap = capture_step(cfg, cap, need, prop.logits, tokens, res, up.write, block=block,
                     step=step, routes=routes, rows=cap_rows)
  return up, cap


def _denoise_step(cv: Canvas, step_hidden, active, j, key, c: _Step) -> _Step:
  """One denoising step of block j (`take_step`) for every row that needs it.
  step_hidden: `_Step -> ([B, b, D] final hidden states, routes or None)`, the step's forward."""
  cfg, b_rows = cv.cfg, cv.b_rows
  need = needs_step(cfg, active, c.tokens, c.post, c.settled)              # [B]
  hidden, routes = step_hidden(c)                                          # [B, b, D]
  at = lambda x: jnp.full((b_rows,), x, jnp.int32)
  up, cap = take_step(cv, hidden, need, step_key(key, j, c.step), c.tokens, c.res, c.post,
                      c.settled, block=at(j), step=at(c.step),
                      fixed=fixed_positions(j, cv.lead, cfg.block_size), routes=routes,
                      cap=c.cap)
  return _Step(up.tokens, up.res, c.step + 1, c.nfe + need.astype(jnp.int32), up.post,
               up.settled, cap)


def _commit_forward(cv: Canvas, tokens, start, cache, needs_commit, cap):
  """Writes the finished block into the KV cache (one forward, run when any row needs it);
  with `capture_routes`, records its routes for the rows that needed it. -> (cache, cap)."""
  b_rows, b = cv.b_rows, cv.cfg.block_size
  pos, meta = block_layout(b_rows, start, b, KIND_CLEAN)
  routes = cv.cfg.capture_routes
  n_moe = cv.model.cfg.n_moe_layers if routes else 0
  top_k = cv.model.cfg.moe.top_k if routes else 0

  def run(c):
    out = cv.model(tokens, pos, meta, cache=c, cache_mode="write", cache_offset=start)
    return out.cache, (out.routing.expert_ids if routes else None)

  def skip(c):
    return c, (jnp.full((n_moe, b_rows, b, top_k), -1, jnp.int32) if routes else None)

  cache, ids = jax.lax.cond(jnp.any(needs_commit), run, skip, cache)
  if routes:
    ids = jnp.where(needs_commit[:, None, None, None], token_major_routes(ids), -1)
    clean = jax.lax.dynamic_update_slice_in_dim(cap.routes.clean, ids.astype(ROUTE_DTYPE),
                                                start - cv.p, axis=1)
    cap = cap._replace(routes=cap.routes._replace(clean=clean))
  return cache, cap


def _denoise_block(cv: Canvas, canvas, cache, active, j, key, init: _Step) -> _Step:
  """The denoising steps of block j, from `init` (the block all [MASK], zero residual).

  With `decode.cache` (bidirectional families, Fast-dLLM) the first step is one forward of
  the whole canvas that also stores every position's K/V (exactly `none`'s first step); the
  later steps forward only what `cached_step_logits` says against that store."""
  cfg = cv.cfg
  start = cv.p + j * cfg.block_size

  def step_cond(c: _Step):
    need = needs_step(cfg, active, c.tokens, c.post, c.settled)
    return jnp.any(need) & (c.step < cfg.steps_bound)

  def loop(step_logits, c: _Step) -> _Step:
    return jax.lax.while_loop(
        step_cond, lambda c: _denoise_step(cv, step_logits, active, j, key, c), c)

  if cfg.cache == "none" or not cv.bidirectional:
    return loop(lambda c: cv.step_hidden(canvas, c.tokens, start, c.res, cache), init)
  hidden0, stored = cv.canvas_hidden(canvas, init.tokens, start, init.res, write_cache=True)
  first = _denoise_step(cv, lambda c: (hidden0, None), active, j, key, init)
  return loop(lambda c: (cv.cached_step_hidden(canvas, c.tokens, start, c.res, stored), None),
              first)


def _block_start(cv: Canvas, tokens0, nfe, cap) -> _Step:
  """The carry of a block's first step: its tokens, the zero residual (cold start, DESIGN
  §2.1), no step taken; `nfe` [B] the forwards so far."""
  mcfg, b_rows = cv.model.cfg, cv.b_rows
  res0 = residual_lib.zero_residual(b_rows, cv.cfg.block_size, mcfg.d_model, mcfg.compute_dtype)
  zeros = jnp.zeros((b_rows,), jnp.int32)
  return _Step(tokens0, res0, jnp.int32(0), nfe, zeros, zeros > 0, cap)


class _Blocks(NamedTuple):
  """The carry of the block loop."""
  j: jax.Array          # scalar int32 the block to decode next
  canvas: jax.Array     # [B, P + M*b] int32
  cache: object         # KVCache or None
  stopped: jax.Array    # [B] bool the row decodes no more blocks (EOS, with eos_early_stop)
  denoise: jax.Array    # [B] int32 denoising forwards
  commits: jax.Array    # [B] int32 commit forwards run
  skipped: jax.Array    # [B] int32 commit forwards counted (the paper's count), not run
  cap: Capture | None
  key: jax.Array


def _active(cv: Canvas, c: _Blocks):
  """[B] bool rows that decode block c.j: not stopped, and within their own blocks."""
  return ~c.stopped & (c.j < row_blocks(cv.lead, cv.cfg))


def _decode_block(cv: Canvas, c: _Blocks) -> _Blocks:
  """Block j: denoise until no mask remains (or the step bound; with editing, until a step on
  the filled block edits nothing or its editing steps are spent), write it into the canvas,
  then the commit forward that writes it into the KV cache where a later block needs it."""
  cfg, b = cv.cfg, cv.cfg.block_size
  j = c.j
  start = cv.p + j * b
  active = _active(cv, c)                                              # [B]
  fresh = jax.lax.dynamic_slice_in_dim(c.canvas, start, b, axis=1)    # masks (block 0: the
  tokens0 = jnp.where(active[:, None], fresh, cfg.eos_id).astype(jnp.int32)  # prompt's tail)
  init = _block_start(cv, tokens0, c.denoise, c.cap)
  out = _denoise_block(cv, c.canvas, c.cache, active, j, c.key, init)
  cache, cap = c.cache, out.cap
  # A row that hit the step bound keeps masks; they become EOS so output stays well-formed.
  tokens = jnp.where(out.tokens == cfg.mask_id, cfg.eos_id, out.tokens)
  canvas = jax.lax.dynamic_update_slice_in_dim(c.canvas, tokens, start, axis=1)
  response_eos = (tokens == cfg.eos_id) & ~fixed_positions(j, cv.lead, b)
  stop = active & jnp.any(response_eos, axis=-1) & cfg.eos_early_stop
  commits, skipped = c.commits, c.skipped
  if not cv.bidirectional:
    needs_commit = active & ~stop & (j < row_blocks(cv.lead, cfg) - 1)
    if cache is not None:
      cache, cap = _commit_forward(cv, tokens, start, cache, needs_commit, cap)
    commits = commits + needs_commit.astype(jnp.int32)
    skipped = skipped + (active & ~needs_commit).astype(jnp.int32)  # counted, not run
  return _Blocks(j + 1, canvas, cache, c.stopped | stop, out.nfe, commits, skipped, cap, c.key)


def finished_response(blocks, lead, cfg: DecodeConfig):
  """Each row's response from its decoded blocks [B, M*b] (block j at [j*b, (j+1)*b); the
  response starts `lead` [B] tokens into block 0): (response [B, N] EOS-filled after the
  first EOS, tokens through the first EOS [B], an EOS was generated [B])."""
  n = cfg.gen_length
  response = jnp.take_along_axis(blocks, lead[:, None] + jnp.arange(n)[None, :], axis=1)
  response = jnp.where(response == cfg.mask_id, cfg.eos_id, response)  # never-decoded blocks
  is_eos = response == cfg.eos_id
  finished = jnp.any(is_eos, axis=-1)
  first_eos = jnp.where(finished, jnp.argmax(is_eos, axis=-1), n - 1)
  after = jnp.arange(n)[None, :] > first_eos[:, None]
  return jnp.where(after, cfg.eos_id, response), (first_eos + 1).astype(jnp.int32), finished


def final_blocks(blocks, lead, n_generated, finished, cfg: DecodeConfig):
  """`Capture.block_final` [B, M*b] from the decoded blocks: masks (blocks never decoded)
  and everything after the response's first EOS become EOS, as in the response."""
  pos = jnp.arange(blocks.shape[1])[None, :]
  cut = jnp.where(finished, lead + n_generated, blocks.shape[1])[:, None]
  return jnp.where((pos >= cut) | (blocks == cfg.mask_id), cfg.eos_id, blocks).astype(jnp.int32)


def check_route_capture(model: Transformer, cfg: DecodeConfig):
  """Route capture needs an MoE model decoded block-causally through the KV cache (the only
  decoding whose forwards match the packed replay rows token for token; the lock-step decoder
  and the per-row engine both check here)."""
  if not cfg.capture_routes:
    return
  mcfg = model.cfg
  if mcfg.moe is None or not mcfg.n_moe_layers:
    raise ValueError("orl.capture_routes records MoE routes, but the model has no MoE layer: "
                     "set orl.capture_routes=False")
  if mcfg.attention == "bidirectional" or not cfg.kv_cache:
    raise ValueError("orl.capture_routes needs a block-causal model decoded through the KV "
                     f"cache (model.attention={mcfg.attention!r}, kv_cache={cfg.kv_cache})")
  if mcfg.moe.n_experts > jnp.iinfo(ROUTE_DTYPE).max:
    raise ValueError(f"orl.capture_routes stores expert ids as {jnp.dtype(ROUTE_DTYPE).name}: "
                     f"model.moe.n_experts={mcfg.moe.n_experts} does not fit")


def _check_decode(model: Transformer, cfg: DecodeConfig, p: int):
  b, mcfg = cfg.block_size, model.cfg
  if p % b:
    raise ValueError(f"prompt length {p} must be a multiple of the block size {b} "
                     "(left-pad prompts to a block boundary)")
  check_route_capture(model, cfg)
  if cfg.cache != "none" and mcfg.attention != "bidirectional":
    raise ValueError(f"decode.cache={cfg.cache!r} caches a bidirectional canvas; "
                     f"model.attention={mcfg.attention!r} decodes through its exact KV cache: "
                     "set decode.cache='none'")
  if cfg.block_placement == "absolute" and mcfg.attention == "bidirectional":
    raise ValueError("decode.block_placement='absolute' places blocks of a block-causal model; "
                     "a bidirectional canvas (model.attention='bidirectional', LLaDA-8B) starts "
                     "its blocks at the prompt's end: set decode.block_placement='prompt_end'")


def _prefill(model: Transformer, placed: Placed, cfg: DecodeConfig, width: int, cap):
  """The KV cache [.., width] holding the prompt's complete blocks (one forward); with
  `capture_routes`, their routes in `cap`. -> (cache, cap)."""
  b_rows = placed.tokens.shape[0]
  pos, meta = prompt_layout(placed.valid, cfg.block_size)
  out = model(placed.tokens, pos, meta, cache=init_cache(model.cfg, b_rows, width),
              cache_mode="write", cache_offset=0)
  if cfg.capture_routes:
    routes = jnp.where(placed.valid[:, :, None, None],
                       token_major_routes(out.routing.expert_ids), -1).astype(ROUTE_DTYPE)
    cap = cap._replace(routes=cap.routes._replace(prompt=routes))
  return out.cache, cap


def _start(model: Transformer, prompt_tokens, prompt_valid, cfg: DecodeConfig):
  """(Canvas, the placed prompts, the canvas [B, P + M*b] with the first block in place, an
  empty capture or None) of a decode of left-padded prompts [B, P]."""
  b_rows, p = prompt_tokens.shape
  width = p + cfg.max_blocks * cfg.block_size
  _check_decode(model, cfg, p)
  grid = place_for_decoder(prompt_tokens, prompt_valid, cfg)
  canvas = jnp.concatenate([grid.tokens, grid.head,
                            jnp.full((b_rows, width - p - cfg.block_size), cfg.mask_id,
                                     jnp.int32)], axis=1)                    # [B, P + M*b]
  canvas_valid = jnp.concatenate([grid.valid, jnp.ones((b_rows, width - p), bool)], axis=1)
  canvas_pos = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (b_rows, width))
  canvas_meta = make_meta(jnp.where(canvas_valid, KIND_PROMPT, KIND_PAD), 0, segment=0)
  cv = Canvas(model, cfg, b_rows, p, canvas_valid, canvas_pos, canvas_meta,
               model.embedding_table, grid.lead)
  return cv, grid, canvas, new_capture(model, cfg, b_rows, p)


def _has_cache(cv: Canvas) -> bool:
  """The decode keeps K/V between forwards: the exact cache of a block-causal model, or the
  stored canvas of a bidirectional one with `decode.cache` (Fast-dLLM)."""
  cfg = cv.cfg
  return cfg.cache != "none" if cv.bidirectional else cfg.kv_cache


def decode(model: Transformer, prompt_tokens, prompt_valid, key, cfg: DecodeConfig) -> DecodeOutput:
  """Decodes a batch of left-padded prompts [B, P]. Call under `jax.jit` (see `make_decoder`)."""
  cv, grid, canvas, cap = _start(model, prompt_tokens, prompt_valid, cfg)
  b_rows, p, width = cv.b_rows, cv.p, canvas.shape[1]
  cache = None
  if not cv.bidirectional and cfg.kv_cache:
    cache, cap = _prefill(model, grid, cfg, width, cap)

  def block_cond(c: _Blocks):
    return (c.j < cfg.max_blocks) & jnp.any(_active(cv, c))

  zeros = jnp.zeros((b_rows,), jnp.int32)
  init = _Blocks(jnp.int32(0), canvas, cache, zeros > 0, zeros, zeros, zeros, cap, key)
  out = jax.lax.while_loop(block_cond, lambda c: _decode_block(cv, c), init)
  blocks = out.canvas[:, p:]
  response, n_generated, finished = finished_response(blocks, grid.lead, cfg)
  cap = out.cap
  if cap is not None:
    cap = cap._replace(block_final=final_blocks(blocks, grid.lead, n_generated, finished, cfg))
  ran = out.denoise + out.commits
  return DecodeOutput(response, ran + out.skipped, ran, out.denoise, n_generated, finished, cap)


def prefill(model: Transformer, prompt_tokens, prompt_valid, cfg: DecodeConfig):
  """The prompt's KV cache, as `decode` starts (one forward; None where the decode keeps no
  cache): alone, so that the compile command can price it."""
  cv, grid, canvas, cap = _start(model, prompt_tokens, prompt_valid, cfg)
  if cv.bidirectional or not cfg.kv_cache:
    return None
  return _prefill(model, grid, cfg, canvas.shape[1], cap)[0]


def denoising_step(model: Transformer, prompt_tokens, prompt_valid, key, cfg: DecodeConfig,
                   cache, carry: _Step) -> _Step:
  """One denoising step of the first response block from `carry`, against `cache` (the
  prompt's KV cache; a bidirectional canvas's stored K/V with `decode.cache`; or None): what
  each forward of `decode`'s step loop runs, alone, so that the compile command can price a
  forward (a compiler cannot know how many times the loop runs)."""
  cv, _, canvas, _ = _start(model, prompt_tokens, prompt_valid, cfg)
  start = cv.p
  if cv.bidirectional and cfg.cache != "none":
    hidden = lambda c: (cv.cached_step_hidden(canvas, c.tokens, start, c.res, cache), None)
  else:
    hidden = lambda c: cv.step_hidden(canvas, c.tokens, start, c.res, cache)
  return _denoise_step(cv, hidden, jnp.ones((cv.b_rows,), bool), 0, key, carry)


def denoising_step_inputs(model: Transformer, prompt_tokens, prompt_valid, cfg: DecodeConfig):
  """(cache or None, carry) that `denoising_step` takes: the block's first step."""
  cv, _, canvas, cap = _start(model, prompt_tokens, prompt_valid, cfg)
  cache = init_cache(model.cfg, cv.b_rows, canvas.shape[1]) if _has_cache(cv) else None
  tokens0 = jax.lax.dynamic_slice_in_dim(canvas, cv.p, cfg.block_size, axis=1)
  return cache, _block_start(cv, tokens0, jnp.zeros((cv.b_rows,), jnp.int32), cap)


# XLA:CPU's YNNPACK dot fusions pack the weights on every call, which decode steps of few tokens
# do not amortise; XLA's own dot emitter is then faster. Measured on 2 cores, 60M LLaDA,
# decode.cache=dual, whole decodes: 1.33x faster without them at batch 1 (8 tokens a step),
# 1.16x at batch 4, equal at batch 8 (64 tokens), 0.86x at batch 16, 0.94x at batch 64.
SMALL_STEP_TOKENS = 64
_SMALL_STEP_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def _cpu_accepts(option: str) -> bool:
  """This jaxlib's XLA:CPU knows the debug option (an experimental one may go away)."""
  try:
    jax.jit(lambda x: x + 1, compiler_options={option: ""}).lower(1.0).compile()
    return True
  except Exception:  # noqa: BLE001 - any refusal means: compile without it
    return False


def step_compiler_options(step_tokens: int) -> dict | None:
  """Compiler options for a decoder whose steps forward `step_tokens` tokens (rows x block):
  on CPU, no YNNPACK fusions up to SMALL_STEP_TOKENS; elsewhere (also when compiling for an
  accelerator on a CPU host), and above, XLA's defaults."""
  if current_platform() != "cpu" or step_tokens > SMALL_STEP_TOKENS:
    return None
  if not all(_cpu_accepts(k) for k in _SMALL_STEP_CPU_OPTIONS):
    return None
  return dict(_SMALL_STEP_CPU_OPTIONS)


class StepSizedJit:
  """`jax.jit(fn)` compiled with `step_compiler_options` for the step size a call implies:
  `fn(state, tokens [R, ...], *rest)`, steps of `rows(R) x block_size` tokens. Called, or
  `.lower(...)` for ahead-of-time compilation, like the jitted function itself."""

  def __init__(self, fn, block_size: int, rows=lambda n: n):
    self._fn, self._block, self._rows, self._jits = fn, block_size, rows, {}

  def jitted(self, n: int, nested: bool = False):
    """The jitted function for calls whose tokens have `n` rows (`nested`: inside another
    trace, where XLA takes no per-call options)."""
    opts = None if nested else step_compiler_options(self._rows(n) * self._block)
    key = tuple(sorted(opts.items())) if opts else ()
    if key not in self._jits:
      self._jits[key] = jax.jit(self._fn, compiler_options=opts)
    return self._jits[key]

  def __call__(self, state, tokens, *rest):
    nested = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((state, tokens, rest)))
    return self.jitted(tokens.shape[0], nested)(state, tokens, *rest)

  def lower(self, state, tokens, *rest):
    return self.jitted(tokens.shape[0]).lower(state, tokens, *rest)


def make_decoder(graphdef, cfg: DecodeConfig):
  """Jitted `(params_state, prompt_tokens, prompt_valid, key) -> DecodeOutput` (a
  `StepSizedJit`: small batches compile for few-token steps)."""

  def run(state, prompt_tokens, prompt_valid, key):
    model = nnx.merge(graphdef, state)
    return decode(model, prompt_tokens, prompt_valid, key, cfg)

  return StepSizedJit(run, cfg.block_size)
