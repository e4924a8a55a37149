"""Continuous batching with static shapes: rows that never wait (`decode.schedule = "per_row"`).

`decode.lockstep.decode` moves a batch in lock-step: every block waits for its slowest row, and
a row whose response ended waits for the whole batch. Here each of `B` rows runs its own prompt
through its own blocks, and a row whose response ended takes the next prompt of a device-side
queue ([Q, P] prompts and a cursor); its outputs land at the prompt's queue index. One
`lax.while_loop`; every iteration runs ONE forward in which each row does what it needs:

* block-causal families (KV cache): a `[B, b]` slab in `cache_mode="write"` with one cache
  offset per row. A row either writes a block of its prompt (the prefill, block by block: the
  prompt is block-causal, so this equals a one-shot prefill), takes a denoising step of its
  active block (written at its block as a state, which only that state sees), or runs the
  commit forward of its just-finished block (the same positions, rewritten as clean);
* bidirectional families: the whole `[B, P + N]` canvas, each row's active block at its own
  offset.

Per row, tokens, `nfe`, `nfe_engine`, `n_generated` and the captured states are those of
decoding that prompt alone with `decode.lockstep.decode` (same counting rules, same block
placement: the queue's prompts are placed on the block grid once,
`decode.placement.place_prompts`), provided the row's randomness is its own: prompt q samples
with key `fold_in(key, q)`, whichever row decodes it. A denoising step is the lock-step
decoder's own (`decode.step.take_step`: the masked head, the commit/edit rule, capture), each
row at its own block and step with its own key. With
`capture_routes` (MoE) the slab's routes are recorded per prompt as the lock-step decoder
records them: each step's with its state, the prefill blocks' and the commit forwards' in
`RouteCapture.prompt` / `.clean`, so replay routes every token as the rollout did.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.typing import ArrayLike

from orl_jax import residual as residual_lib
from orl_jax.models.decoded import ROUTE_DTYPE, Capture, DecodeOutput, token_major_routes
from orl_jax.decode.canvas import Canvas
from orl_jax.decode.capture import captured_top_k, check_route_capture, new_capture
from orl_jax.decode.compile_options import StepSizedJit, step_compiler_options
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.placement import (final_blocks, finished_response, fixed_positions,
                                      place_for_decoder, row_blocks)
from orl_jax.decode.step import RowSettings, needs_step, step_key, take_step
from orl_jax.models.transformer import KVCache, Transformer, init_cache, write_at
from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                TokenMeta, make_meta)

PREFILL, DENOISE, COMMIT, IDLE = 0, 1, 2, 3   # what a row's next forward does


class _Rows(NamedTuple):
  """Per-row decoding state ([B, ...])."""
  slot: jax.Array       # [B] int32 queue index of the row's prompt (Q: idle)
  phase: jax.Array      # [B] int32 PREFILL | DENOISE | COMMIT | IDLE
  block: jax.Array      # [B] int32 PREFILL: the prompt block to write; else the response block
  step: jax.Array       # [B] int32 steps taken in the active block
  tokens: jax.Array     # [B, b] the active block (COMMIT: its final tokens)
  res: Residual         # [B, b, D] what the next step consumes
  post: jax.Array       # [B] int32 steps taken on the filled block (editing)
  settled: jax.Array    # [B] bool a step on the filled block edited nothing (editing)
  response: jax.Array   # [B, M*b] int32 the row's finished blocks (mask elsewhere)
  nfe: jax.Array        # [B] int32 forwards run for the row's prompt
  denoise: jax.Array    # [B] int32 of which denoising forwards
  skipped: jax.Array    # [B] int32 commit forwards counted (paper's count) but not run


class _Results(NamedTuple):
  """What each queued prompt's decode produced ([Q, ...]), written when its row retires."""
  blocks: jax.Array     # [Q, M*b] int32 its decoded blocks
  nfe: jax.Array        # [Q] int32
  nfe_engine: jax.Array  # [Q] int32
  nfe_denoise: jax.Array  # [Q] int32
  done: jax.Array       # [Q] bool its row retired (the serving engine clears it on admission)


class PromptPool(NamedTuple):
  """Prompt caches that rows copy instead of prefilling (docs/decoding.md#the-prompt-pool):
  each distinct prompt's keys, values and metadata over its P positions, written once."""
  k: jax.Array          # [L, D, P, Hkv, Dh] D distinct prompts
  v: jax.Array          # [L, D, P, Hkv, Dh]
  meta: TokenMeta       # [D, P]
  entry: jax.Array      # [Q] int32 the pool entry holding each queue index's prompt (D: none,
                        # the row prefills it)


class _Carry(NamedTuple):
  rows: _Rows
  cache: object         # KVCache [L, B, P + M*b + b, ...] (block-causal) or None
  cursor: jax.Array     # scalar int32 next queue index to hand out
  results: _Results
  cap: Capture | None
  iterations: jax.Array  # scalar int32
  pool: PromptPool | None = None   # None: every row prefills its own prompt


class Queue(NamedTuple):
  """The prompts rows take ([Q, ...] by queue index, the serving engine's slots), placed on the
  block grid (`decode.placement.Placed`), each with its own key, length and setting."""
  tokens: jax.Array     # [Q, P] int32 the prompts' complete blocks
  valid: jax.Array      # [Q, P] bool
  lead: jax.Array       # [Q] int32 prompt tokens opening each prompt's first block
  head: jax.Array       # [Q, b] int32 each prompt's first block before its first step
  keys: jax.Array       # [Q] keys: prompt q samples with keys[q]
  blocks: jax.Array     # [Q] int32 blocks prompt q decodes at most (`placement.row_blocks`)
  settings: RowSettings | None   # [Q] each prompt's rule and temperature; None: the config's


def new_queue(tokens, valid, keys, cfg: DecodeConfig, gen_length=None,
              settings: RowSettings | None = None) -> Queue:
  """The queue of left-padded prompts [Q, P] with keys [Q]; `gen_length` [Q] (default
  `cfg.gen_length`): the tokens each response may hold."""
  placed = place_for_decoder(tokens.astype(jnp.int32), valid.astype(bool), cfg)
  blocks = row_blocks(placed.lead, cfg, gen_length)
  return Queue(placed.tokens, placed.valid, placed.lead, placed.head, keys, blocks, settings)


@dataclasses.dataclass(frozen=True)
class _Engine:
  """What every iteration shares: the model, the queue and the shapes."""
  cv: Canvas                 # the model, the decode config and the embedding table
  queue: Queue
  order: jax.Array           # [W] int32 queue indices in the order rows take them
  n_order: jax.Array         # scalar int32 entries of `order` in use

  @property
  def cfg(self) -> DecodeConfig:
    return self.cv.cfg

  @property
  def n_queue(self) -> int:
    return self.queue.tokens.shape[0]

  @property
  def p(self) -> int:
    return self.queue.tokens.shape[1]

  def of(self, slot, table):
    """The rows' entries [B, ...] of a queue table (idle rows: prompt 0's)."""
    return table[jnp.minimum(slot, self.n_queue - 1)]

  def prompts(self, slot):
    """([B, P] tokens, [B, P] validity) of the rows' prompts (idle rows: prompt 0)."""
    return self.of(slot, self.queue.tokens), self.of(slot, self.queue.valid)

  def lead(self, slot):
    """[B] int32 prompt tokens opening the rows' first blocks (idle rows: prompt 0's)."""
    return self.of(slot, self.queue.lead)

  def fixed(self, rows: "_Rows"):
    """[B, b] bool positions of the rows' active blocks that hold prompt tokens."""
    return fixed_positions(rows.block[:, None], self.lead(rows.slot), self.cfg.block_size)


def _fresh_block(eng: _Engine, rows: _Rows, start, block) -> _Rows:
  """Rows `start` [B] begin denoising response block `block` [B]: all mask (block 0: the
  prompt's last tokens first), cold residual."""
  cfg = eng.cfg
  at = lambda new, old: jnp.where(start.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
  res = jax.tree.map(lambda x: at(jnp.zeros_like(x), x), rows.res)
  head = eng.of(rows.slot, eng.queue.head)
  tokens = jnp.where((block == 0)[:, None], head, cfg.mask_id)
  return rows._replace(phase=at(DENOISE, rows.phase), block=at(block, rows.block),
                       step=at(0, rows.step), tokens=at(tokens, rows.tokens),
                       res=res, post=at(0, rows.post), settled=at(False, rows.settled))


def _refill(eng: _Engine, rows: _Rows, cache, cursor, free, pool: PromptPool | None = None):
  """Rows `free` [B] take the next prompts of the queue, in `eng.order` from `cursor` (or go
  idle once it is drained). Block-causal rows start with the prefill at their prompt's first
  non-padding block, with the row's cache emptied (its metadata marks every position padding),
  or, where the `pool` holds their prompt (`PromptPool.entry`), copy its cache from there and
  start denoising block 0;
  bidirectional rows start denoising block 0. -> (rows, cache, cursor)."""
  cfg, p, b = eng.cfg, eng.p, eng.cfg.block_size
  at_order = cursor + jnp.cumsum(free.astype(jnp.int32)) - 1
  take = free & (at_order < eng.n_order)
  taken = eng.order[jnp.clip(at_order, 0, eng.order.shape[0] - 1)]
  slot = jnp.where(take, taken, jnp.where(free, eng.n_queue, rows.slot))
  at = lambda new, old: jnp.where(take.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
  rows = rows._replace(slot=slot, phase=jnp.where(free & ~take, IDLE, rows.phase),
                       response=at(cfg.mask_id, rows.response), nfe=at(0, rows.nfe),
                       denoise=at(0, rows.denoise), skipped=at(0, rows.skipped))
  if eng.cv.bidirectional:
    rows = _fresh_block(eng, rows, take, jnp.zeros_like(slot))
    return rows, cache, cursor + jnp.sum(take, dtype=jnp.int32)
  kind = jnp.where(take[:, None], KIND_PAD, cache.meta.kind)
  cache = cache._replace(meta=cache.meta._replace(kind=kind))
  pooled = jnp.zeros_like(take)
  if pool is not None:
    pooled = take & (eng.of(slot, pool.entry) < pool.k.shape[1])
    cache = _copy_from_pool(cache, pool, pooled, slot)
  _, valid = eng.prompts(slot)
  first = jnp.where(jnp.any(valid, axis=1), jnp.argmax(valid, axis=1) // b, p // b)
  rows = _fresh_block(eng, rows, pooled | (take & (first == p // b)), jnp.zeros_like(slot))
  prefill = take & ~pooled & (first < p // b)
  rows = rows._replace(phase=jnp.where(prefill, PREFILL, rows.phase),
                       block=jnp.where(prefill, first, rows.block))
  return rows, cache, cursor + jnp.sum(take, dtype=jnp.int32)


def _copy_from_pool(cache: KVCache, pool: PromptPool, take, slot) -> KVCache:
  """`cache` with the rows `take` [B] holding their prompts' pool entries at [0, P). A copy,
  not a read by index: the attention reads one [Tc] cache per row, prompt and response
  together, so the pool's P x prompt is shared by the queue and each row holds its own copy
  while it decodes. Skipped (a `cond`) in the iterations where no row takes a prompt."""
  p, n_rows = pool.k.shape[2], take.shape[0]
  entry = pool.entry[jnp.minimum(slot, pool.entry.shape[0] - 1)]    # [B]
  row = jnp.where(take, jnp.arange(n_rows), n_rows)                  # out of bounds -> dropped

  def copy(cache: KVCache) -> KVCache:
    kv = lambda c, x: c.at[:, row, :p].set(x[:, entry], mode="drop")
    meta = jax.tree.map(lambda c, x: c.at[row, :p].set(x[entry], mode="drop"), cache.meta,
                        pool.meta)
    return KVCache(kv(cache.k, pool.k), kv(cache.v, pool.v), meta)

  return jax.lax.cond(jnp.any(take), copy, lambda c: c, cache)


def _slab_inputs(eng: _Engine, rows: _Rows):
  """Block-causal: (tokens, positions, metadata [B, b], cache offsets [B]) of each row's forward:
  a prompt block (PREFILL), its active block as a state (DENOISE) or as clean tokens (COMMIT),
  or padding written past the canvas (IDLE)."""
  cfg, p, b = eng.cfg, eng.p, eng.cfg.block_size
  phase = rows.phase
  offset = jnp.select([phase == PREFILL, phase == IDLE],
                      [rows.block * b, jnp.full_like(phase, p + cfg.max_blocks * b)],
                      p + rows.block * b)
  positions = offset[:, None] + jnp.arange(b, dtype=jnp.int32)[None]
  prompt_tokens, prompt_valid = eng.prompts(rows.slot)
  in_prompt = jnp.minimum(positions, p - 1)
  prompt_block = jnp.take_along_axis(prompt_tokens, in_prompt, axis=1)
  prompt_block_valid = jnp.take_along_axis(prompt_valid, in_prompt, axis=1)
  col = lambda x: x[:, None]
  tokens = jnp.where(col(phase == PREFILL), prompt_block, rows.tokens)
  kind = jnp.select([col(phase == PREFILL), col(phase == DENOISE), col(phase == COMMIT)],
                    [jnp.where(prompt_block_valid, KIND_PROMPT, KIND_PAD),
                     jnp.full((1, b), KIND_STATE), jnp.full((1, b), KIND_CLEAN)], KIND_PAD)
  meta = make_meta(kind, positions // b, segment=0,
                   response=jnp.where(col(phase == PREFILL), -1, 0),
                   state_id=jnp.where(kind == KIND_STATE, 0, -1))
  return tokens, positions, meta, offset


def _forward(eng: _Engine, rows: _Rows, cache):
  """The iteration's one forward. -> (final hidden states [B, b, D] of each row's slab or
  active block, the MoE routes of the slab [L_moe, B, b, K] with `capture_routes` (else None),
  cache)."""
  model, b = eng.cv.model, eng.cfg.block_size
  denoise = rows.phase == DENOISE
  res = jax.tree.map(lambda x: jnp.where(denoise.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0),
                     rows.res)
  if not eng.cv.bidirectional:
    tokens, positions, meta, offset = _slab_inputs(eng, rows)
    hidden, cache, _, routing = model.hidden_states_and_routing(
        tokens, positions, meta, residual=res, cache=cache, cache_mode="write",
        cache_offset=offset)
    return hidden, (routing.expert_ids if eng.cfg.capture_routes else None), cache
  start = eng.p + rows.block * b
  prompt_tokens, prompt_valid = eng.prompts(rows.slot)
  canvas = write_at(jnp.concatenate([prompt_tokens, rows.response], axis=1), rows.tokens, start)
  width, mcfg = canvas.shape[1], model.cfg
  z = write_at(jnp.zeros((canvas.shape[0], width, mcfg.d_model), mcfg.compute_dtype), res.z,
               start)
  alpha = write_at(jnp.zeros(canvas.shape, jnp.float32), res.alpha, start)
  valid = jnp.concatenate([prompt_valid, jnp.ones_like(rows.response, bool)], axis=1)
  positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), canvas.shape)
  meta = make_meta(jnp.where(valid, KIND_PROMPT, KIND_PAD), 0, segment=0)
  hidden = model.hidden_states(canvas, positions, meta, residual=Residual(z, alpha),
                               keep=(start, b))[0]     # each row's active block only
  return hidden, None, cache


def _denoise(eng: _Engine, rows: _Rows, hidden, routes, cap):
  """The denoising step of the DENOISE rows: `decode.step.take_step`, the lock-step decoder's
  step, each row at its own block and step with its own key (`decode.step.step_key` of its
  prompt's decode alone, with fold_in(key, prompt)), recording each state (with the routes of
  the forward) at the row's prompt slot. -> (rows, cap)."""
  need = rows.phase == DENOISE
  keys = jax.vmap(step_key)(eng.of(rows.slot, eng.queue.keys), rows.block, rows.step)
  settings = (None if eng.queue.settings is None
              else jax.tree.map(lambda t: eng.of(rows.slot, t), eng.queue.settings))
  up, cap = take_step(eng.cv, hidden, need, keys, rows.tokens, rows.res, rows.post,
                      rows.settled, block=rows.block, step=rows.step, fixed=eng.fixed(rows),
                      routes=routes, cap=cap, cap_rows=rows.slot, per_row=True,
                      settings=settings)
  rows = rows._replace(tokens=up.tokens, res=up.res, step=rows.step + need, post=up.post,
                       settled=up.settled, nfe=rows.nfe + need, denoise=rows.denoise + need)
  return rows, cap


def _record_routes(eng: _Engine, rows: _Rows, routes, cap):
  """With `capture_routes`: the slab's routes of the rows that wrote a prompt block (its valid
  tokens; padding keeps -1) or committed a block, at their prompts' capture rows
  (`RouteCapture.prompt`, `.clean`); a denoising step's routes go with its state (`_denoise`).
  The lock-step decoder records the same forwards (its prefill in one piece)."""
  if routes is None:
    return cap
  r = cap.routes
  prompt = _prompt_routes(eng, rows, routes, r.prompt)
  clean = _put_routes(eng, rows, r.clean, rows.phase == COMMIT,
                      _slab_inputs(eng, rows)[1] - eng.p, token_major_routes(routes))
  return cap._replace(routes=r._replace(prompt=prompt, clean=clean))


def _put_routes(eng: _Engine, rows: _Rows, buf, do, cols, val):
  """`buf` [Q, T, L_moe, K] with the rows `do` [B] writing `val` [B, b, ...] at their prompts'
  rows, columns `cols` [B, b]."""
  slot = jnp.where(do, rows.slot, eng.n_queue)[:, None]          # out of bounds -> dropped
  return buf.at[slot, cols].set(val, mode="drop")


def _prompt_routes(eng: _Engine, rows: _Rows, routes, buf):
  """`buf` [Q, P, L_moe, K] with the routes of the prompt blocks the PREFILL rows wrote (valid
  tokens; padding keeps -1)."""
  _, positions, meta, _ = _slab_inputs(eng, rows)
  ids = jnp.where((meta.kind == KIND_PROMPT)[..., None, None], token_major_routes(routes), -1)
  return _put_routes(eng, rows, buf, rows.phase == PREFILL, positions, ids)


def _advance(eng: _Engine, rows: _Rows):
  """Each row's next phase after the forward. -> (rows, retire [B]): rows whose decode ended
  (EOS committed in a finished block, with `eos_early_stop`, or the row's last block
  finished)."""
  cfg, n_prompt_blocks = eng.cfg, eng.p // eng.cfg.block_size
  phase, b = rows.phase, cfg.block_size
  # PREFILL: the next prompt block, or denoise response block 0 after the last one
  prefilled = (phase == PREFILL) & (rows.block + 1 == n_prompt_blocks)
  rows = rows._replace(block=jnp.where(phase == PREFILL, rows.block + 1, rows.block))
  # DENOISE: the block is done when no row of a lock-step decode would step it again
  more = needs_step(cfg, phase == DENOISE, rows.tokens, rows.post, rows.settled)
  done = (phase == DENOISE) & ~(more & (rows.step < cfg.steps_bound))
  final = jnp.where(rows.tokens == cfg.mask_id, cfg.eos_id, rows.tokens)
  written = write_at(rows.response, final, rows.block * b)
  response = jnp.where(done[:, None], written, rows.response)
  eos = done & jnp.any((final == cfg.eos_id) & ~eng.fixed(rows), axis=-1)
  last = rows.block == eng.of(rows.slot, eng.queue.blocks) - 1
  retire = done & ((eos & cfg.eos_early_stop) | last)
  # block-causal: a finished block that a later block reads is committed into the KV cache;
  # the commit of the response's last block is counted (the paper's NFE) but not run
  cached = not eng.cv.bidirectional
  to_commit = done & ~retire & cached
  committed = phase == COMMIT
  rows = rows._replace(
      response=response, tokens=jnp.where(to_commit[:, None], final, rows.tokens),
      phase=jnp.where(to_commit, COMMIT, phase),
      nfe=rows.nfe + committed,
      skipped=rows.skipped + (retire & cached))
  next_block = (done & ~retire & (not cached)) | committed
  rows = _fresh_block(eng, rows, next_block, rows.block + 1)
  rows = _fresh_block(eng, rows, prefilled, jnp.zeros_like(rows.block))
  return rows, retire


def _retire(results: _Results, rows: _Rows, retire, n_queue: int) -> _Results:
  """Writes the retiring rows' outputs at their prompts' queue indices."""
  slot = jnp.where(retire, rows.slot, n_queue)   # out of bounds -> dropped
  put = lambda buf, val: buf.at[slot].set(val, mode="drop")
  return _Results(put(results.blocks, rows.response), put(results.nfe, rows.nfe + rows.skipped),
                  put(results.nfe_engine, rows.nfe), put(results.nfe_denoise, rows.denoise),
                  put(results.done, True))


def _iteration(eng: _Engine, c: _Carry) -> _Carry:
  hidden, routes, cache = _forward(eng, c.rows, c.cache)
  cap = _record_routes(eng, c.rows, routes, c.cap)
  rows, cap = _denoise(eng, c.rows, hidden, routes, cap)
  rows, retire = _advance(eng, rows)
  results = _retire(c.results, rows, retire, eng.n_queue)
  rows, cache, cursor = _refill(eng, rows, cache, c.cursor, retire, c.pool)
  return _Carry(rows, cache, cursor, results, cap, c.iterations + 1, c.pool)


def _initial_rows(cfg: DecodeConfig, mcfg, n_rows: int, n_queue: int) -> _Rows:
  """Idle rows (slot `n_queue`: none)."""
  zeros = jnp.zeros((n_rows,), jnp.int32)
  return _Rows(slot=zeros + n_queue, phase=zeros + IDLE, block=zeros, step=zeros,
               tokens=jnp.full((n_rows, cfg.block_size), cfg.mask_id, jnp.int32),
               res=residual_lib.zero_residual(n_rows, cfg.block_size, mcfg.d_model,
                                              mcfg.compute_dtype),
               post=zeros, settled=zeros > 0,
               response=jnp.full((n_rows, cfg.max_blocks * cfg.block_size), cfg.mask_id,
                                 jnp.int32),
               nfe=zeros, denoise=zeros, skipped=zeros)


def _check(mcfg, cfg: DecodeConfig, p: int, n_rows: int):
  b = cfg.block_size
  if p % b:
    raise ValueError(f"prompt length {p} must be a multiple of the block size {b} "
                     "(left-pad prompts to a block boundary)")
  if n_rows < 1:
    raise ValueError(f"decode.schedule='per_row' needs at least one row, got {n_rows}")
  if not cfg.kv_cache and mcfg.attention != "bidirectional":
    raise ValueError("decode.schedule='per_row' decodes block-causal models through the KV "
                     "cache: kv_cache=False is the lock-step reference only")
  if cfg.block_placement == "absolute" and mcfg.attention == "bidirectional":
    raise ValueError("decode.block_placement='absolute' places blocks of a block-causal model; "
                     "a bidirectional canvas (LLaDA-8B) starts its blocks at the prompt's end: "
                     "set decode.block_placement='prompt_end'")


def _empty_results(cfg: DecodeConfig, n_queue: int) -> _Results:
  zeros = jnp.zeros((n_queue,), jnp.int32)
  return _Results(jnp.full((n_queue, cfg.max_blocks * cfg.block_size), cfg.mask_id, jnp.int32),
                  zeros, zeros, zeros, zeros > 0)


def _new_cache(mcfg, cfg: DecodeConfig, n_rows: int, p: int):
  """The rows' KV cache (block-causal), None for a bidirectional canvas; + b: idle rows' writes
  land past the canvas."""
  if mcfg.attention == "bidirectional":
    return None
  return init_cache(mcfg, n_rows, p + cfg.max_blocks * cfg.block_size + cfg.block_size)


def prompt_keys(key, n_queue: int):
  """[Q] keys: prompt q of a queue decoded with `key` samples with fold_in(key, q)."""
  return jax.vmap(lambda q: jax.random.fold_in(key, q))(jnp.arange(n_queue))


def _queue_engine(model: Transformer, queue_tokens, queue_valid, key, cfg: DecodeConfig,
                  n_rows: int) -> _Engine:
  """The engine of a queue of Q left-padded prompts [Q, P] on `n_rows` rows (a pure function
  of its inputs: the segments of a segmented decode rebuild it)."""
  n_queue, p = queue_tokens.shape
  _check(model.cfg, cfg, p, n_rows)
  check_route_capture(model, cfg)
  cv = Canvas(model, cfg, n_rows, p, None, None, None, model.embedding_table)
  keys = key if key.shape == (n_queue,) else prompt_keys(key, n_queue)
  queue = new_queue(queue_tokens, queue_valid, keys, cfg)
  return _Engine(cv, queue, jnp.arange(n_queue, dtype=jnp.int32), jnp.int32(n_queue))


def _prefill_slabs(model: Transformer, cfg: DecodeConfig, queue: Queue, fill):
  """The prefill of the queue's prompts `fill` [n] on n rows by the loop's own forward
  (`_forward`: `[n, b]` slabs of the prompt blocks in turn, a cache of the engine rows' width),
  so that its keys and values are those a row's own prefill writes. -> (KVCache [L, n, ...],
  the prefill's routes [n, P, L_moe, K] with `capture_routes`, else None)."""
  n, p = queue.tokens.shape
  cv = Canvas(model, cfg, n, p, None, None, None, model.embedding_table)
  eng = _Engine(cv, queue, jnp.arange(n, dtype=jnp.int32), jnp.int32(n))
  rows, cache, _ = _refill(eng, _initial_rows(cfg, model.cfg, n, n),
                           _new_cache(model.cfg, cfg, n, p), jnp.int32(0), jnp.ones((n,), bool))
  rows = rows._replace(phase=jnp.where((rows.phase == PREFILL) & fill, PREFILL, IDLE))
  routes = None
  if cfg.capture_routes:
    mcfg = model.cfg
    routes = jnp.full((n, p, mcfg.n_moe_layers, captured_top_k(mcfg)), -1,
                      ROUTE_DTYPE)                                   # [n, P, L_moe, K]

  def prefill_block(c):
    rows, cache, routes = c
    _, slab_routes, cache = _forward(eng, rows, cache)
    if routes is not None:
      routes = _prompt_routes(eng, rows, slab_routes, routes)
    last = rows.block + 1 == p // cfg.block_size
    return rows._replace(block=rows.block + 1, phase=jnp.where(last, IDLE, rows.phase)), cache, \
        routes

  _, cache, routes = jax.lax.while_loop(lambda c: jnp.any(c[0].phase == PREFILL), prefill_block,
                                        (rows, cache, routes))
  return cache, routes


def _fill_pool(eng: _Engine, group_size: int):
  """The prompt pool of a queue whose entries come in groups of `group_size` adjacent copies of
  one prompt: each group's prompt prefilled once, before the loop (`_prefill_slabs`). ->
  (PromptPool, the prefill's routes [D, P, L_moe, K] with `capture_routes`, else None)."""
  if eng.n_queue % group_size:
    raise ValueError(f"a queue of {eng.n_queue} entries is not made of groups of {group_size}")
  queue = jax.tree.map(lambda t: t[::group_size], eng.queue)       # [D, ...] one per group
  n, p = queue.tokens.shape
  cache, routes = _prefill_slabs(eng.cv.model, eng.cfg, queue, jnp.ones((n,), bool))
  entry = jnp.arange(eng.n_queue, dtype=jnp.int32) // group_size
  pool = PromptPool(cache.k[:, :, :p], cache.v[:, :, :p],
                    jax.tree.map(lambda m: m[:, :p], cache.meta), entry)
  return pool, routes


def _start(model: Transformer, eng: _Engine, n_rows: int, group_size: int = 1) -> _Carry:
  """The loop's first carry: the rows take the queue's first prompts; with `group_size` > 1
  (block-causal), from a prompt pool filled first (`_fill_pool`), its prefill's routes those
  of every entry of the group."""
  cfg, n_queue = eng.cfg, eng.n_queue
  cap = new_capture(model, cfg, n_queue, eng.p)
  pool = None
  if group_size > 1 and not eng.cv.bidirectional:
    pool, routes = _fill_pool(eng, group_size)
    if routes is not None:
      assert cap is not None and cap.routes is not None, "rollouts capture routes"
      cap = cap._replace(routes=cap.routes._replace(prompt=routes[pool.entry]))
  rows = _initial_rows(cfg, model.cfg, n_rows, n_queue)
  rows, cache, cursor = _refill(eng, rows, _new_cache(model.cfg, cfg, n_rows, eng.p),
                                jnp.int32(0), jnp.ones((n_rows,), bool), pool)
  return _Carry(rows, cache, cursor, _empty_results(cfg, n_queue), cap, jnp.int32(0), pool)


def _run(eng: _Engine, carry: _Carry, iterations: int | None = None) -> _Carry:
  """Iterates until every row is idle, or at most `iterations` more times (a segment)."""
  if iterations is None:
    cond = lambda c: jnp.any(c.rows.phase != IDLE)
  else:
    stop = carry.iterations + iterations
    cond = lambda c: jnp.any(c.rows.phase != IDLE) & (c.iterations < stop)
  return jax.lax.while_loop(cond, lambda c: _iteration(eng, c), carry)


def _output(eng: _Engine, out: _Carry) -> DecodeOutput:
  r, cap, cfg = out.results, out.cap, eng.cfg
  tokens, n_generated, finished = finished_response(r.blocks, eng.queue.lead, cfg)
  if cap is not None:
    cap = cap._replace(block_final=final_blocks(r.blocks, eng.queue.lead, n_generated, finished,
                                                cfg))
  return DecodeOutput(tokens, r.nfe, r.nfe_engine, r.nfe_denoise, n_generated, finished, cap,
                      out.iterations)


def decode_queue(model: Transformer, queue_tokens, queue_valid, key, cfg: DecodeConfig,
                 n_rows: int, group_size: int = 1) -> DecodeOutput:
  """Decodes Q left-padded prompts [Q, P] on `n_rows` rows, each row refilled from the queue
  as soon as its response ends. key: one key (prompt q samples with `fold_in(key, q)`,
  `prompt_keys`) or [Q] keys, one per prompt. `group_size` > 1: the queue is made of groups of
  that many adjacent copies of one prompt, and each group's prompt is prefilled once (a prompt
  pool, `_fill_pool`) instead of once per entry. Call under `jax.jit` (see `make_engine`)."""
  eng = _queue_engine(model, queue_tokens, queue_valid, key, cfg, n_rows)
  return _output(eng, _run(eng, _start(model, eng, n_rows, group_size)))


class Retired(NamedTuple):
  """What a segment of a segmented decode tells the host: the responses whose rows retired."""
  done: jax.Array       # [Q] bool the prompt's row retired (its response is final)
  responses: jax.Array  # [Q, N] int32 the responses as `DecodeOutput.tokens` (final where done)
  active: jax.Array     # scalar bool some row is still decoding


def start_queue(model: Transformer, queue_tokens, queue_valid, key, cfg: DecodeConfig,
                n_rows: int, group_size: int = 1) -> _Carry:
  """A segmented `decode_queue`: its first carry (then `advance_queue`, then `finish_queue`,
  each called with the same queue, key, config and rows; the result is `decode_queue`'s; the
  prompt pool of `group_size` travels in the carry)."""
  eng = _queue_engine(model, queue_tokens, queue_valid, key, cfg, n_rows)
  return _start(model, eng, n_rows, group_size)


def advance_queue(model: Transformer, queue_tokens, queue_valid, key, cfg: DecodeConfig,
                  n_rows: int, carry: _Carry, iterations: int) -> tuple[_Carry, Retired]:
  """At most `iterations` more iterations of the loop, and the responses retired so far."""
  eng = _queue_engine(model, queue_tokens, queue_valid, key, cfg, n_rows)
  carry = _run(eng, carry, iterations)
  responses, _, _ = finished_response(carry.results.blocks, eng.queue.lead, cfg)
  return carry, Retired(carry.results.done, responses, jnp.any(carry.rows.phase != IDLE))


def finish_queue(model: Transformer, queue_tokens, queue_valid, key, cfg: DecodeConfig,
                 n_rows: int, carry: _Carry) -> DecodeOutput:
  """`decode_queue`'s output from the carry of a segmented decode whose rows are all idle."""
  eng = _queue_engine(model, queue_tokens, queue_valid, key, cfg, n_rows)
  return _output(eng, _run(eng, carry))


def make_engine(graphdef, cfg: DecodeConfig, n_rows: int):
  """Jitted `(params_state, queue_tokens [Q, P], queue_valid [Q, P], key) -> DecodeOutput`
  decoding the queue on `n_rows` rows (`key`: one key, or [Q] keys, as `decode_queue`)."""

  def run(state, queue_tokens, queue_valid, key):
    return decode_queue(nnx.merge(graphdef, state), queue_tokens, queue_valid, key, cfg, n_rows)

  return StepSizedJit(run, cfg.block_size, rows=lambda _: n_rows)   # steps of n_rows x b tokens


# ---------------------------------------------------------------------------------- serving
# The same rows, kept on the device between calls: a server (`orl_jax.serve`) admits requests
# into slots of the queue between calls, and each call runs up to a set number of iterations
# (rows retiring and refilling inside it, as in `decode_queue`). A request (one choice of it)
# decodes exactly as `decode_queue` decodes its prompt alone with its key, whatever the other
# rows hold (each row's computation reads only its own slot).


def request_keys(seed_lo, seed_hi, choice):
  """[W] keys of requests' choices: fold_in(fold_in(key(seed mod 2^32), seed // 2^32), choice)
  (uint32 seed halves, int32 choice index)."""
  one = lambda lo, hi, c: jax.random.fold_in(jax.random.fold_in(jax.random.key(lo), hi), c)
  return jax.vmap(one)(seed_lo, seed_hi, choice)


class Admission(NamedTuple):
  """Requests entering the engine at one call ([W]; slot Q marks an unused entry); host
  arrays (numpy) or device arrays."""
  slot: ArrayLike         # [W] int32 the queue slot each takes
  tokens: ArrayLike       # [W, P] int32 left-padded prompts
  valid: ArrayLike        # [W, P] bool
  seed_lo: ArrayLike      # [W] uint32 `request_keys`
  seed_hi: ArrayLike      # [W] uint32
  choice: ArrayLike       # [W] int32
  gen_length: ArrayLike   # [W] int32 response tokens at most (<= cfg.gen_length)
  settings: RowSettings   # [W] each request's rule and temperature
  pool_entry: ArrayLike   # [W] int32 the prompt-pool entry its row copies (E: none, it prefills)
  pool_fill: ArrayLike    # [W] bool its prompt is prefilled into that entry in this call


class ServeState(NamedTuple):
  """The serving engine between calls."""
  queue: Queue            # [Q, ...] one request per slot
  order: jax.Array        # [W] int32 slots waiting for a row, in arrival order (from carry.cursor)
  n_order: jax.Array      # scalar int32 entries of `order` in use
  carry: _Carry           # rows, their cache, the cursor into `order`, results [Q], iterations


class ServeView(NamedTuple):
  """What the host reads after a call: each row's request and finished blocks, each slot's
  result once its row retired."""
  row_slot: jax.Array     # [B] int32 (Q: idle)
  row_blocks: jax.Array   # [B, M*b] int32 the row's finished blocks (mask elsewhere)
  row_nfe: jax.Array      # [B] int32 forwards the row ran for its request so far
  row_denoise: jax.Array  # [B] int32 of which denoising forwards
  results: _Results       # [Q] (`done`: retired since its admission)
  waiting: jax.Array      # scalar int32 admitted slots still waiting for a row
  iterations: jax.Array   # scalar int32 engine iterations so far
  # the block each row is denoising, as committed so far (what a live view of the decoder
  # shows between finished blocks: docs/serving.md#the-playground)
  row_active: jax.Array   # [B] int32 its response block index (-1: none, e.g. prefilling)
  row_tokens: jax.Array   # [B, b] int32 its tokens (mask where not committed yet)
  pool_busy: jax.Array    # [E] bool prompt-pool entries a waiting slot will still copy


def new_serve_state(model_cfg, cfg: DecodeConfig, n_rows: int, n_slots: int,
                    prompt_len: int, n_waiting: int, pool_entries: int = 0) -> ServeState:
  """An empty engine for a model of `model_cfg`: `n_rows` rows, `n_slots` request slots,
  prompts of `prompt_len` tokens (a multiple of b), at most `n_waiting` admitted requests
  waiting for a row, a prompt pool of `pool_entries` prompt caches (block-causal; the choices
  of a request share one). Call under `jax.jit` (every leaf its own buffer, the engine state
  is donated; `orl_jax.serve.engine` creates it with its shardings)."""
  _check(model_cfg, cfg, prompt_len, n_rows)
  if cfg.capture_states:
    raise ValueError("the serving engine captures no states (capture_states must be 0)")
  q, p, b = n_slots, prompt_len, cfg.block_size
  zeros = jnp.zeros((q,), jnp.int32)
  settings = RowSettings(zeros, jnp.zeros((q,), jnp.float32), jnp.zeros((q,), jnp.float32))
  queue = Queue(jnp.zeros((q, p), jnp.int32), jnp.zeros((q, p), bool), zeros,
                jnp.full((q, b), cfg.mask_id, jnp.int32), prompt_keys(jax.random.key(0), q),
                zeros + 1, settings)
  cache = _new_cache(model_cfg, cfg, n_rows, p)
  pool = None
  if cache is not None and pool_entries:
    empty = init_cache(model_cfg, pool_entries, p)
    pool = PromptPool(empty.k, empty.v, empty.meta, zeros + pool_entries)
  carry = _Carry(_initial_rows(cfg, model_cfg, n_rows, q), cache, jnp.int32(0),
                 _empty_results(cfg, q), None, jnp.int32(0), pool)
  return ServeState(queue, jnp.full((n_waiting,), q, jnp.int32), jnp.int32(0), carry)


def _admit(queue: Queue, new: Admission, cfg: DecodeConfig) -> tuple[Queue, Queue]:
  """(the queue with the admitted requests in their slots, the admitted entries [W])."""
  keys = request_keys(new.seed_lo, new.seed_hi, new.choice)
  entered = new_queue(new.tokens, new.valid, keys, cfg, new.gen_length, new.settings)
  return jax.tree.map(lambda table, x: table.at[new.slot].set(x, mode="drop"), queue,
                      entered), entered


def _pool_admitted(model: Transformer, cfg: DecodeConfig, pool: PromptPool | None,
                   entered: Queue, new: Admission) -> PromptPool | None:
  """The pool with the admitted prompts marked `pool_fill` prefilled into their entries
  (`_prefill_slabs` on the admission's rows; skipped in calls that fill none), and each
  admitted slot pointing at its entry."""
  if pool is None:
    return None
  n_entries, n_slots, p = pool.k.shape[1], pool.entry.shape[0], pool.k.shape[2]
  fill = (jnp.asarray(new.pool_fill) & (jnp.asarray(new.pool_entry) < n_entries)
          & (jnp.asarray(new.slot) < n_slots))
  at = jnp.where(fill, new.pool_entry, n_entries)                  # out of bounds -> dropped

  def prefill(pool: PromptPool) -> PromptPool:
    cache, _ = _prefill_slabs(model, cfg, entered, fill)
    kv = lambda x, c: x.at[:, at].set(c[:, :, :p], mode="drop")
    meta = jax.tree.map(lambda x, c: x.at[at].set(c[:, :p], mode="drop"), pool.meta, cache.meta)
    return pool._replace(k=kv(pool.k, cache.k), v=kv(pool.v, cache.v), meta=meta)

  pool = jax.lax.cond(jnp.any(fill), prefill, lambda x: x, pool)
  return pool._replace(entry=pool.entry.at[new.slot].set(new.pool_entry, mode="drop"))


def _waiting_order(state: ServeState, cancel, admitted):
  """(order [W], n_order): the slots still waiting (not cancelled), then the admitted ones."""
  n_slots, w = state.queue.tokens.shape[0], state.order.shape[0]
  at = jnp.arange(w)
  old = state.order
  keep = (at >= state.carry.cursor) & (at < state.n_order) & ~cancel[jnp.minimum(old,
                                                                                 n_slots - 1)]
  slots = jnp.concatenate([old, admitted])
  ok = jnp.concatenate([keep, admitted < n_slots])
  first = jnp.argsort(~ok, stable=True)[:w]
  return jnp.where(ok[first], slots[first], n_slots), jnp.minimum(jnp.sum(ok, dtype=jnp.int32), w)


def serve_call(model: Transformer, state: ServeState, admission: Admission, cancel,
               cfg: DecodeConfig, iterations: int) -> ServeState:
  """One device call of the serving engine: the `cancel` [Q] slots leave their rows and the
  waiting order, the admitted requests enter their slots and the order, free rows take the
  waiting requests, and up to `iterations` engine iterations run (fewer once every row is
  idle). Call under `jax.jit` (`make_server_call`)."""
  n_rows, p = state.carry.rows.slot.shape[0], state.queue.tokens.shape[1]
  n_slots = state.queue.tokens.shape[0]
  c = state.carry
  rows = c.rows
  gone = (rows.slot < n_slots) & cancel[jnp.minimum(rows.slot, n_slots - 1)]
  rows = rows._replace(phase=jnp.where(gone, IDLE, rows.phase),
                       slot=jnp.where(gone, n_slots, rows.slot))
  queue, entered = _admit(state.queue, admission, cfg)
  pool = _pool_admitted(model, cfg, c.pool, entered, admission)
  order, n_order = _waiting_order(state, cancel, admission.slot)
  results = c.results._replace(done=c.results.done.at[admission.slot].set(False, mode="drop"))
  cv = Canvas(model, cfg, n_rows, p, None, None, None, model.embedding_table)
  eng = _Engine(cv, queue, order, n_order)
  rows, cache, cursor = _refill(eng, rows, c.cache, jnp.int32(0), rows.phase == IDLE, pool)
  limit = c.iterations + iterations
  out = jax.lax.while_loop(
      lambda c: (c.iterations < limit) & jnp.any(c.rows.phase != IDLE),
      lambda c: _iteration(eng, c),
      _Carry(rows, cache, cursor, results, None, c.iterations, pool))
  return ServeState(queue, order, n_order, out)


def serve_view(state: ServeState) -> ServeView:
  rows, pool = state.carry.rows, state.carry.pool
  active = jnp.where((rows.phase == DENOISE) | (rows.phase == COMMIT), rows.block, -1)
  busy = jnp.zeros((0,), bool)
  if pool is not None:         # the entries of the slots still in the waiting order
    n_entries, n_slots = pool.k.shape[1], pool.entry.shape[0]
    at = jnp.arange(state.order.shape[0])
    waiting = (at >= state.carry.cursor) & (at < state.n_order)
    entry = jnp.where(waiting, pool.entry[jnp.minimum(state.order, n_slots - 1)], n_entries)
    busy = jnp.zeros((n_entries,), bool).at[entry].set(True, mode="drop")
  return ServeView(rows.slot, rows.response, rows.nfe, rows.denoise, state.carry.results,
                   state.n_order - state.carry.cursor, state.carry.iterations, active,
                   rows.tokens, busy)


def make_server_call(graphdef, cfg: DecodeConfig, n_rows: int, iterations: int,
                     params_shardings=None, state_shardings=None):
  """Jitted `(params_state, ServeState, Admission, cancel [Q]) -> (ServeState, ServeView)` on
  `n_rows` rows, the engine state donated; with `params_shardings` and `state_shardings` (rows
  over the mesh's batch axes, `orl_jax.serve.engine`), laid out as given. Compiled with the
  options of its step size, as `make_engine`."""

  def run(state, serve_state, admission, cancel):
    new = serve_call(nnx.merge(graphdef, state), serve_state, admission, cancel, cfg, iterations)
    return new, serve_view(new)

  options = step_compiler_options(n_rows * cfg.block_size)
  if state_shardings is None:
    return jax.jit(run, donate_argnums=(1,), compiler_options=options)
  return jax.jit(run, donate_argnums=(1,), compiler_options=options,
                 in_shardings=(params_shardings, state_shardings, None, None),
                 out_shardings=(state_shardings, None))
