"""The lock-step block decoder (`decode.schedule = "lockstep"`): block-diffusion decoding
inside `jit` (docs/decoding.md#one-denoising-step) with optional exact state capture
(docs/method.md#rollout-with-exact-state-capture).

For each block: fill with [MASK]; repeat denoising steps until no mask remains (each step:
forward the block against the KV cache, propose a token per position, commit by the unmasking
rule, carry the residual); then one commit forward writes the block into the KV cache.
Bidirectional families (LLaDA) forward the whole canvas each step and need no commit forward,
or, with `cache` (Fast-dLLM, approximate), forward the whole canvas once at each block start
and then only the block (`dual`) or the block and what follows it (`prefix`) against the K/V
that forward stored (see `Canvas.cached_step_logits`).

Where blocks sit (`block_placement`): `orl_jax.decode.placement`.

Everything runs in `lax.while_loop`s with static shapes: a batch of prompts decodes together,
rows finish independently (EOS, `eos_early_stop`), and there is no host synchronisation per
step.

Forwards are counted three ways (docs/decoding.md#two-forward-counts, docs/method.md#metrics).
`nfe_denoise` is the authors' count: the denoising forwards. `nfe` is the paper's count, which TPF
uses: denoising steps plus one commit forward per decoded block, the last block included. The engine
spends commit forwards only where a later block needs the cache (not after a row's last block, not
for a row that stops after this block); `nfe_engine` counts the forwards it actually ran.
Bidirectional families have no KV cache and so no commit forward: all three are the denoising steps
(with `cache`, the block-start forward is the block's first step, as in Fast-dLLM).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax import residual as residual_lib
from orl_jax.decode.canvas import Canvas, block_layout, prompt_layout
from orl_jax.decode.capture import captured_top_k, check_route_capture, new_capture
from orl_jax.decode.compile_options import StepSizedJit
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.placement import (Placed, final_blocks, finished_response, fixed_positions,
                                      place_for_decoder, row_blocks)
from orl_jax.decode.step import needs_step, step_key, take_step
from orl_jax.models.decoded import ROUTE_DTYPE, Capture, DecodeOutput, token_major_routes
from orl_jax.models.transformer import KVCache, Transformer, init_cache
from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import KIND_CLEAN, KIND_PAD, KIND_PROMPT, make_meta


class _Step(NamedTuple):
  """The carry of the denoising steps of one block."""
  tokens: jax.Array     # [B, b] the active block
  res: Residual         # what the next step consumes
  step: jax.Array       # scalar int32 steps taken in this block
  nfe: jax.Array        # [B] int32 forwards so far
  post: jax.Array       # [B] int32 steps taken on the filled block (editing)
  settled: jax.Array    # [B] bool a step on the filled block edited nothing (editing)
  cap: Capture | None


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
  top_k = captured_top_k(cv.model.cfg) if routes else 0

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
  """The carry of a block's first step: its tokens, the zero residual (cold start,
  docs/method.md#the-residual-pathway), no step taken; `nfe` [B] the forwards so far."""
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


def _repeat_rows(cache: KVCache, group_size: int) -> KVCache:
  """`cache` with each row repeated `group_size` times, the copies adjacent (a group's rows)."""
  rep = lambda x, axis: jnp.repeat(x, group_size, axis=axis)
  return KVCache(rep(cache.k, 1), rep(cache.v, 1),                 # [L, B*G, Tc, Hkv, Dh]
                 jax.tree.map(lambda m: rep(m, 0), cache.meta))    # [B*G, Tc]


def _prefill(model: Transformer, placed: Placed, cfg: DecodeConfig, width: int, cap,
             group_size: int = 1):
  """The KV cache [.., width] holding the prompt's complete blocks (one forward); with
  `capture_routes`, their routes in `cap`. -> (cache, cap).

  `placed` holds each distinct prompt once; the forward runs on those rows, and its cache and
  routes then serve each prompt's `group_size` adjacent decode rows: a block-causal prompt's
  keys and values do not depend on what is decoded after it
  (docs/method.md#the-prompt-is-prefilled-once)."""
  b_rows = placed.tokens.shape[0]
  pos, meta = prompt_layout(placed.valid, cfg.block_size)
  out = model(placed.tokens, pos, meta, cache=init_cache(model.cfg, b_rows, width),
              cache_mode="write", cache_offset=0)
  if cfg.capture_routes:
    assert out.routing is not None, "an MoE model's forward returns its routing"
    routes = jnp.where(placed.valid[:, :, None, None],
                       token_major_routes(out.routing.expert_ids), -1).astype(ROUTE_DTYPE)
    if group_size > 1:
      routes = jnp.repeat(routes, group_size, axis=0)              # [B*G, P, n_moe, K]
    cap = cap._replace(routes=cap.routes._replace(prompt=routes))
  assert out.cache is not None, "a forward with cache_mode='write' returns its cache"
  cache = out.cache if group_size == 1 else _repeat_rows(out.cache, group_size)
  return cache, cap


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


def decode(model: Transformer, prompt_tokens, prompt_valid, key, cfg: DecodeConfig,
           group_size: int = 1) -> DecodeOutput:
  """Decodes a batch of left-padded prompts [B, P], `group_size` responses each (rows of a
  group adjacent: the decode of the prompts repeated `group_size` times, whose prompt forward
  runs once per distinct prompt). Call under `jax.jit` (see `lockstep_decoder`)."""
  if group_size > 1:
    reps = lambda x: jnp.repeat(x, group_size, axis=0)
    cv, grid, canvas, cap = _start(model, reps(prompt_tokens), reps(prompt_valid), cfg)
  else:
    cv, grid, canvas, cap = _start(model, prompt_tokens, prompt_valid, cfg)
  b_rows, p, width = cv.b_rows, cv.p, canvas.shape[1]
  cache = None
  if not cv.bidirectional and cfg.kv_cache:
    distinct = place_for_decoder(prompt_tokens, prompt_valid, cfg) if group_size > 1 else grid
    cache, cap = _prefill(model, distinct, cfg, width, cap, group_size)

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


def lockstep_decoder(graphdef, cfg: DecodeConfig):
  """Jitted `(params_state, prompt_tokens, prompt_valid, key) -> DecodeOutput` (a
  `StepSizedJit`: small batches compile for few-token steps)."""

  def run(state, prompt_tokens, prompt_valid, key):
    model = nnx.merge(graphdef, state)
    return decode(model, prompt_tokens, prompt_valid, key, cfg)

  return StepSizedJit(run, cfg.block_size)
