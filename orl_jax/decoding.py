"""Block-diffusion decoding inside `jit` (DESIGN §2.2) with optional exact state capture (§2.3).

For each block: fill with [MASK]; repeat denoising steps until no mask remains (each step:
forward the block against the KV cache, propose a token per position, commit by the unmasking
rule, carry the residual); then one commit forward writes the block into the KV cache.
Bidirectional families (LLaDA) forward the whole canvas each step and need no commit forward.

Everything runs in `lax.while_loop`s with static shapes: a batch of prompts decodes together,
rows finish independently (EOS), and there is no host synchronisation per step.

Forwards are counted two ways (DESIGN §2.2, §6). `nfe` is the paper's count, which TPF uses:
denoising steps plus one commit forward per decoded block, the last block included. The engine
spends commit forwards only where a later block needs the cache (not after the last block, not
for a row whose EOS was committed in this block); `nfe_engine` counts the forwards it actually
ran. Bidirectional families have no KV cache and so no commit forward: both counts are the
denoising steps.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax import residual as residual_lib
from orl_jax.models.transformer import Transformer, init_cache
from orl_jax.residual import Residual
from orl_jax.unmasking import UnmaskRule, select_commits
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                make_meta)


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

  def __post_init__(self):
    if self.gen_length % self.block_size:
      raise ValueError(f"decode.gen_length ({self.gen_length}) must be a multiple of "
                       f"decode.block_size ({self.block_size})")

  @property
  def n_blocks(self) -> int:
    return self.gen_length // self.block_size

  @property
  def steps_bound(self) -> int:
    return self.max_steps_per_block or self.block_size


class Capture(NamedTuple):
  """Every forward step of a rollout, exactly as consumed. Shapes [B, S, ...], S = max states."""
  block_tokens: jax.Array   # [B, S, b] int32 tokens of the active block before the step
  block: jax.Array          # [B, S] int32 block index within the response
  step: jax.Array           # [B, S] int32 step index within the block
  z: jax.Array              # [B, S, b, D] residual soft embedding consumed by the step
  alpha: jax.Array          # [B, S, b] residual entropy weight consumed (rcd)
  entropy: jax.Array        # [B, S, b] normalized entropy of the step's prediction (T = 1)
  topk_ids: jax.Array       # [B, S, b, K] int32
  topk_logprobs: jax.Array  # [B, S, b, K] f32
  commit: jax.Array         # [B, S, b] bool positions the step committed
  valid: jax.Array          # [B, S] bool
  n_states: jax.Array       # [B] int32 states recorded (capped at S)
  overflow: jax.Array       # [B] bool more steps happened than S could hold


class DecodeOutput(NamedTuple):
  tokens: jax.Array         # [B, N] response, EOS-filled after the first EOS
  nfe: jax.Array            # [B] int32 forwards, the paper's count: steps + 1 commit per block
  nfe_engine: jax.Array     # [B] int32 forwards the engine ran (commits nobody needs skipped)
  n_generated: jax.Array    # [B] int32 tokens through the first EOS
  finished: jax.Array       # [B] bool an EOS was generated
  capture: Capture | None


def _empty_capture(b_rows, cfg: DecodeConfig, d_model, z_dtype) -> Capture:
  s, b, k = cfg.capture_states, cfg.block_size, cfg.top_k
  i32 = lambda *shape: jnp.zeros(shape, jnp.int32)
  f32 = lambda *shape: jnp.zeros(shape, jnp.float32)
  return Capture(block_tokens=i32(b_rows, s, b), block=i32(b_rows, s), step=i32(b_rows, s),
                 z=jnp.zeros((b_rows, s, b, d_model), z_dtype), alpha=f32(b_rows, s, b),
                 entropy=f32(b_rows, s, b), topk_ids=i32(b_rows, s, b, k),
                 topk_logprobs=f32(b_rows, s, b, k), commit=jnp.zeros((b_rows, s, b), bool),
                 valid=jnp.zeros((b_rows, s), bool), n_states=i32(b_rows),
                 overflow=jnp.zeros((b_rows,), bool))


def _record(cap: Capture, do: jax.Array, **fields) -> Capture:
  """Writes one state per row where `do` [B] is true (mode='drop' past the buffer's end)."""
  s = cap.valid.shape[1]
  rows = jnp.arange(do.shape[0])
  idx = jnp.where(do, cap.n_states, s)  # s is out of bounds -> dropped
  upd = {name: getattr(cap, name).at[rows, idx].set(val, mode="drop")
         for name, val in fields.items()}
  upd["valid"] = cap.valid.at[rows, idx].set(True, mode="drop")
  upd["overflow"] = cap.overflow | (do & (cap.n_states >= s))
  upd["n_states"] = jnp.minimum(cap.n_states + do.astype(jnp.int32), s)
  return cap._replace(**upd)


def propose(logits, key, temperature: float):
  """Candidate token, its probability and the normalized entropy per position (DESIGN §2.2.2).

  logits: [B, b, V] f32. Greedy when temperature == 0, else a Gumbel-max sample of
  softmax(logits / temperature); probabilities are those of the sampling distribution.
  """
  t = 1.0 if temperature == 0 else temperature
  scaled = logits / t
  logp = jax.nn.log_softmax(scaled, axis=-1)
  if temperature == 0:
    cand = jnp.argmax(scaled, axis=-1)
  else:
    cand = jnp.argmax(scaled + jax.random.gumbel(key, scaled.shape, jnp.float32), axis=-1)
  conf = jnp.exp(jnp.take_along_axis(logp, cand[..., None], axis=-1)[..., 0])
  entropy = residual_lib.normalized_entropy(scaled)
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


@dataclasses.dataclass(frozen=True)
class _Canvas:
  """What every step of one `decode` call shares: the model, the shapes and the whole-canvas
  layout ([prompt | response], used by steps that forward the whole canvas)."""
  model: Transformer
  cfg: DecodeConfig
  b_rows: int
  p: int                     # prompt length (a multiple of b)
  valid: jax.Array           # [B, P + N] bool: prompt padding is False
  positions: jax.Array       # [B, P + N] int32
  meta: object               # [B, P + N] TokenMeta of a bidirectional forward
  embedding: jax.Array       # [V, D] the input embedding table the residual is built from

  @property
  def bidirectional(self) -> bool:
    return self.model.cfg.family == "bidirectional"

  def step_meta(self, start):
    """Whole-canvas metadata of a block-causal step without cache: prompt, committed (clean)
    blocks, the active block as one state, nothing after it."""
    idx, p, b = self.positions, self.p, self.cfg.block_size
    kind = jnp.where(idx < p, jnp.where(self.valid, KIND_PROMPT, KIND_PAD),
                     jnp.where(idx < start, KIND_CLEAN,
                               jnp.where(idx < start + b, KIND_STATE, KIND_PAD)))
    return make_meta(kind, idx // b, segment=0, response=jnp.where(idx < p, -1, 0),
                     state_id=jnp.where(kind == KIND_STATE, 0, -1))

  def step_logits(self, canvas, block_tokens, start, res: Residual, cache):
    """[B, b, V] logits of the active block: through the KV cache, or by forwarding the whole
    canvas (bidirectional families; block-causal ones with `kv_cache=False`)."""
    model, cfg, b_rows, b = self.model, self.cfg, self.b_rows, self.cfg.block_size
    if self.bidirectional or not cfg.kv_cache:
      width = canvas.shape[1]
      full = jax.lax.dynamic_update_slice_in_dim(canvas, block_tokens, start, axis=1)
      z = jnp.zeros((b_rows, width, model.cfg.d_model), model.cfg.compute_dtype)
      z = jax.lax.dynamic_update_slice_in_dim(z, res.z, start, axis=1)
      alpha = jax.lax.dynamic_update_slice_in_dim(jnp.zeros((b_rows, width)), res.alpha, start, 1)
      meta = self.meta if self.bidirectional else self.step_meta(start)
      logits = model(full, self.positions, meta, residual=Residual(z, alpha)).logits
      return jax.lax.dynamic_slice_in_dim(logits, start, b, axis=1)
    pos, meta = block_layout(b_rows, start, b, KIND_STATE)
    return model(block_tokens, pos, meta, residual=res, cache=cache, cache_mode="read").logits


def _denoise_step(cv: _Canvas, canvas, cache, active, j, key, c):
  """One denoising step of block j (DESIGN §2.2 steps 1-4), capturing the state it consumed."""
  cfg, mcfg, b_rows = cv.cfg, cv.model.cfg, cv.b_rows
  start = cv.p + j * cfg.block_size
  tokens, res, step, nfe, cap = c
  masked = tokens == cfg.mask_id
  need = active & jnp.any(masked, axis=-1)                           # [B]
  logits = cv.step_logits(canvas, tokens, start, res, cache)         # [B, b, V]
  step_key = jax.random.fold_in(jax.random.fold_in(key, j), step)
  cand, conf, ent = propose(logits, step_key, cfg.temperature)
  commit = select_commits(cfg.rule, masked, conf, ent) & need[:, None]
  new_tokens = jnp.where(commit, cand, tokens)
  nxt = residual_lib.residual_from_logits(logits, cv.embedding,
                                          embed_scale=mcfg.embed_scale,
                                          temperature=mcfg.residual_temperature,
                                          dtype=mcfg.compute_dtype)
  still = (new_tokens == cfg.mask_id)[..., None]
  nxt = Residual(jnp.where(still, nxt.z, 0), jnp.where(still[..., 0], nxt.alpha, 0))
  nxt = jax.tree.map(lambda new, old: jnp.where(
      need.reshape((-1,) + (1,) * (new.ndim - 1)), new, old), nxt, res)
  if cfg.capture_states:
    logp = jax.nn.log_softmax(logits, axis=-1)
    top_lp, top_ids = jax.lax.top_k(logp, cfg.top_k)
    cap = _record(cap, need, block_tokens=tokens, block=jnp.full((b_rows,), j, jnp.int32),
                  step=jnp.full((b_rows,), step, jnp.int32), z=res.z, alpha=res.alpha,
                  entropy=residual_lib.normalized_entropy(logits), topk_ids=top_ids,
                  topk_logprobs=top_lp, commit=commit)
  return new_tokens, nxt, step + 1, nfe + need.astype(jnp.int32), cap


def _decode_block(cv: _Canvas, carry):
  """Block j: denoise until no mask remains (or the step bound), write it into the canvas,
  then the commit forward that writes it into the KV cache where a later block needs it."""
  cfg, mcfg, b_rows, b = cv.cfg, cv.model.cfg, cv.b_rows, cv.cfg.block_size
  j, canvas, cache, finished, nfe, skipped, cap, key = carry
  start = cv.p + j * b
  active = ~finished                                                   # [B]

  def step_cond(c):
    tokens, _, step, *_ = c
    return jnp.any(active & jnp.any(tokens == cfg.mask_id, axis=-1)) & (step < cfg.steps_bound)

  tokens0 = jnp.where(active[:, None], cfg.mask_id, cfg.eos_id).astype(jnp.int32)
  tokens0 = jnp.broadcast_to(tokens0, (b_rows, b))
  res0 = residual_lib.zero_residual(b_rows, b, mcfg.d_model, mcfg.compute_dtype)
  tokens, _, _, nfe, cap = jax.lax.while_loop(
      step_cond, lambda c: _denoise_step(cv, canvas, cache, active, j, key, c),
      (tokens0, res0, jnp.int32(0), nfe, cap))
  # A row that hit the step bound keeps masks; they become EOS so output stays well-formed.
  tokens = jnp.where(tokens == cfg.mask_id, cfg.eos_id, tokens)
  canvas = jax.lax.dynamic_update_slice_in_dim(canvas, tokens, start, axis=1)
  eos_here = active & jnp.any(tokens == cfg.eos_id, axis=-1)
  if not cv.bidirectional:
    needs_commit = active & ~eos_here & (j < cfg.n_blocks - 1)
    pos, meta = block_layout(b_rows, start, b, KIND_CLEAN)
    cache = cache if cache is None else jax.lax.cond(
        jnp.any(needs_commit),
        lambda c: cv.model(tokens, pos, meta, cache=c, cache_mode="write",
                           cache_offset=start).cache,
        lambda c: c, cache)
    nfe = nfe + needs_commit.astype(jnp.int32)
    skipped = skipped + (active & ~needs_commit).astype(jnp.int32)  # counted, not run
  return j + 1, canvas, cache, finished | eos_here, nfe, skipped, cap, key


def _finished_response(canvas, p: int, cfg: DecodeConfig):
  """(response [B, N] EOS-filled after the first EOS, tokens through the first EOS [B])."""
  n = cfg.gen_length
  response = canvas[:, p:]
  response = jnp.where(response == cfg.mask_id, cfg.eos_id, response)  # never-decoded blocks
  is_eos = response == cfg.eos_id
  first_eos = jnp.where(jnp.any(is_eos, axis=-1), jnp.argmax(is_eos, axis=-1), n - 1)
  after = jnp.arange(n)[None, :] > first_eos[:, None]
  return jnp.where(after, cfg.eos_id, response), (first_eos + 1).astype(jnp.int32)


def decode(model: Transformer, prompt_tokens, prompt_valid, key, cfg: DecodeConfig) -> DecodeOutput:
  """Decodes a batch of left-padded prompts [B, P]. Call under `jax.jit` (see `make_decoder`)."""
  mcfg = model.cfg
  b_rows, p = prompt_tokens.shape
  b, n = cfg.block_size, cfg.gen_length
  if p % b:
    raise ValueError(f"prompt length {p} must be a multiple of the block size {b} "
                     "(left-pad prompts to a block boundary)")
  embedding = model.embedding_table
  prompt_pos, prompt_meta = prompt_layout(prompt_valid, b)
  canvas = jnp.concatenate([prompt_tokens, jnp.full((b_rows, n), cfg.mask_id, jnp.int32)], axis=1)
  canvas_valid = jnp.concatenate([prompt_valid, jnp.ones((b_rows, n), bool)], axis=1)
  canvas_pos = jnp.broadcast_to(jnp.arange(p + n, dtype=jnp.int32), (b_rows, p + n))
  canvas_meta = make_meta(jnp.where(canvas_valid, KIND_PROMPT, KIND_PAD), 0, segment=0)
  cv = _Canvas(model, cfg, b_rows, p, canvas_valid, canvas_pos, canvas_meta, embedding)

  cache = None
  if not cv.bidirectional and cfg.kv_cache:
    cache = init_cache(mcfg, b_rows, p + n)
    cache = model(prompt_tokens, prompt_pos, prompt_meta, cache=cache, cache_mode="write",
                  cache_offset=0).cache

  def block_cond(carry):
    j, _, _, finished, *_ = carry
    return (j < cfg.n_blocks) & jnp.any(~finished)

  cap = _empty_capture(b_rows, cfg, mcfg.d_model, mcfg.compute_dtype) if cfg.capture_states else None
  zeros = jnp.zeros((b_rows,), jnp.int32)
  init = (jnp.int32(0), canvas, cache, jnp.zeros((b_rows,), bool), zeros, zeros, cap, key)
  _, canvas, _, finished, nfe_engine, skipped, cap, _ = jax.lax.while_loop(
      block_cond, lambda carry: _decode_block(cv, carry), init)
  response, n_generated = _finished_response(canvas, p, cfg)
  return DecodeOutput(response, nfe_engine + skipped, nfe_engine, n_generated, finished, cap)


def make_decoder(graphdef, cfg: DecodeConfig):
  """Jitted `(params_state, prompt_tokens, prompt_valid, key) -> DecodeOutput`."""

  @jax.jit
  def run(state, prompt_tokens, prompt_valid, key):
    model = nnx.merge(graphdef, state)
    return decode(model, prompt_tokens, prompt_valid, key, cfg)

  return run
