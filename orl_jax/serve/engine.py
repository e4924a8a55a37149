"""The device side of the server: the per-row engine kept on the accelerator between calls
(`orl_jax.decode.per_row.serve_call`), driven by the scheduler thread (`scheduler.py`).

`BlockEngine.call(admission, cancel)` runs one device call: the cancelled slots leave their
rows, the admitted requests take slots (each choice of a request is one slot and, once a row is
free, one row), and up to `serve.iterations_per_call` engine iterations run, rows retiring and
refilling inside the call. It returns what the host needs on numpy (`HostView`): each row's
request and finished blocks, each slot's result once done. Rows are laid out over the mesh's
batch axes and parameters by the family's partition rules, on every device of this host.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from orl_jax import sharding as sharding_lib
from orl_jax.decode import per_row
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.step import RowSettings
from orl_jax.models import families
from orl_jax.models.transformer import KVCache
from orl_jax.unmasking import RULES, UnmaskRule


@dataclasses.dataclass(frozen=True)
class EngineShape:
  """The static shapes of one engine."""
  rows: int          # B rows decoding at once
  waiting: int       # W admitted requests that may wait on the device for a row
  prompt_len: int    # P prompt tokens at most (a multiple of the block size)
  iterations: int    # engine iterations per device call at most
  pool: int = 0      # prompt caches the choices of a request share (`serve.prompt_pool`)

  @property
  def slots(self) -> int:
    """Q request slots: every row's, and every waiting request's."""
    return self.rows + self.waiting


class HostView(NamedTuple):
  """`per_row.ServeView` on the host (numpy)."""
  row_slot: np.ndarray      # [B] int32 (Q: idle)
  row_blocks: np.ndarray    # [B, M*b] int32 finished blocks of the row's request (mask elsewhere)
  row_nfe: np.ndarray       # [B] int32 forwards the row ran for its request so far
  row_denoise: np.ndarray   # [B] int32 of which denoising forwards
  blocks: np.ndarray        # [Q, M*b] int32 each retired slot's blocks
  nfe: np.ndarray           # [Q] int32 forwards, the paper's count (one commit per block)
  nfe_engine: np.ndarray    # [Q] int32 forwards the engine ran
  nfe_denoise: np.ndarray   # [Q] int32 denoising forwards (the authors' count)
  done: np.ndarray          # [Q] bool retired since admission
  waiting: int              # admitted slots still waiting for a row
  iterations: int           # engine iterations so far
  # the block each row is denoising (`per_row.ServeView`; None: an engine without rows)
  row_active: np.ndarray | None = None   # [B] int32 its response block index (-1: none)
  row_tokens: np.ndarray | None = None   # [B, b] int32 its tokens so far (mask elsewhere)
  pool_busy: np.ndarray | None = None   # [E] bool prompt-pool entries still to be copied


@dataclasses.dataclass
class Entry:
  """One choice of a request, as the engine takes it."""
  slot: int
  prompt: np.ndarray        # [n] int32 prompt token ids (n <= P)
  seed: int                 # 0 <= seed < 2**64; choice i samples with `per_row.request_keys`
  choice: int
  max_tokens: int           # <= cfg.gen_length
  rule: UnmaskRule
  temperature: float


def rule_index(rule: UnmaskRule) -> int:
  return RULES.index(rule.name)


def _state_shardings(state: per_row.ServeState, mesh):
  """Rows (and their KV cache) over the mesh's batch axes; the slot tables replicated."""
  batch = tuple(a for a in sharding_lib.BATCH_AXES if a in mesh.axis_names)
  rows = jax.tree.map(lambda _: NamedSharding(mesh, P(batch)), state.carry.rows)
  cache = state.carry.cache
  if isinstance(cache, KVCache):     # [L, B, T, H, Dh] keys and values, [B, T] metadata
    cache = jax.tree.map(lambda x: NamedSharding(mesh, P(None, batch) if x.ndim == 5
                                                 else P(batch)), cache)
  rep = lambda tree: jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)
  carry = state.carry._replace(rows=rows, cache=cache, cursor=rep(state.carry.cursor),
                               results=rep(state.carry.results),
                               iterations=rep(state.carry.iterations), pool=rep(state.carry.pool))
  return per_row.ServeState(rep(state.queue), rep(state.order), rep(state.n_order), carry)


class PoolBook:
  """The host's account of the engine's prompt pool (docs/serving.md#the-prompt-pool): which
  of its `n` entries a call may assign, and what was shared. An entry is free once the latest
  view read shows no waiting slot that will copy it (`ServeView.pool_busy`) and no call after
  that view assigned it (calls are dispatched before the previous one is read)."""

  def __init__(self, n: int):
    self.n = n
    self.busy = np.zeros((n,), bool)
    self.assigned = np.full((n,), -1)   # the call that last assigned each entry
    self.read_call = -1                 # the last call whose view was read
    self.fills = 0                      # prompts prefilled into the pool
    self.shared = 0                     # choices whose prompt cache came from the pool
                                        # (n-1 of a request's n prefill nothing)

  def assign(self, entries: list[Entry], call: int) -> tuple[np.ndarray, np.ndarray]:
    """([len(entries)] pool entry, [len(entries)] fills it) for call `call`'s admissions: the
    entries with one prompt (a request's `n` choices) share a free pool entry, the first
    prefilling it; n: none (a lone prompt, or no free entry: its row prefills it)."""
    groups: dict[bytes, list[int]] = {}
    for i, e in enumerate(entries):
      groups.setdefault(np.asarray(e.prompt, np.int32).tobytes(), []).append(i)
    free = [k for k in range(self.n) if not self.busy[k] and self.assigned[k] <= self.read_call]
    entry = np.full((len(entries),), self.n, np.int32)
    fill = np.zeros((len(entries),), bool)
    for at in groups.values():
      if len(at) < 2 or not free:
        continue
      k = free.pop(0)
      self.assigned[k] = call
      entry[at], fill[at[0]] = k, True
      self.fills += 1
      self.shared += len(at)
    return entry, fill

  def read(self, busy: np.ndarray, call: int) -> None:
    """Call `call`'s view: the entries its waiting slots still copy."""
    self.busy, self.read_call = busy, call


class BlockEngine:
  """The per-row block decoder as a server's engine (module docstring)."""

  def __init__(self, graphdef, params, model_cfg, cfg: DecodeConfig, shape: EngineShape,
               mesh):
    shards = sharding_lib.n_batch_shards(mesh.shape)
    if shape.rows % shards:
      raise ValueError(f"serve.rows={shape.rows} must be divisible by the {shards} data shards "
                       "of the mesh (mesh.data x mesh.fsdp x mesh.expert)")
    if shape.prompt_len % cfg.block_size:
      raise ValueError(f"the engine's prompt length {shape.prompt_len} must be a multiple of "
                       f"decode.block_size={cfg.block_size}")
    self.cfg, self.shape, self.mesh = cfg, shape, mesh
    rules = families.of_model(model_cfg).partition_rules
    self._params_shardings = sharding_lib.tree_shardings(params, mesh, rules)
    self.params = jax.device_put(params, self._params_shardings)
    new_state = lambda: per_row.new_serve_state(model_cfg, cfg, shape.rows, shape.slots,
                                                shape.prompt_len, shape.waiting, shape.pool)
    state_shardings = _state_shardings(jax.eval_shape(new_state), mesh)
    with sharding_lib.tracing_mesh(mesh):
      self.state = jax.jit(new_state, out_shardings=state_shardings)()
    make = lambda iterations: per_row.make_server_call(
        graphdef, cfg, shape.rows, iterations, self._params_shardings, state_shardings)
    self._calls = {shape.iterations: make(shape.iterations)}
    self._make_call = make
    self.pool = PoolBook(shape.pool if self.state.carry.pool is not None else 0)
    self._dispatched = 0

  @property
  def block_size(self) -> int:
    return self.cfg.block_size

  def set_params(self, params) -> None:
    """New weights (same tree and shapes), laid out as the current ones; the next call uses
    them."""
    self.params = jax.device_put(params, self._params_shardings)

  def admission(self, entries: list[Entry]) -> per_row.Admission:
    """The call's admission arrays ([W]; unused entries point at slot Q)."""
    w, p, q = self.shape.waiting, self.shape.prompt_len, self.shape.slots
    if len(entries) > w:
      raise ValueError(f"{len(entries)} admissions in one call, at most {w}")
    slot = np.full((w,), q, np.int32)
    tokens = np.zeros((w, p), np.int32)
    valid = np.zeros((w, p), bool)
    seed_lo, seed_hi = np.zeros((w,), np.uint32), np.zeros((w,), np.uint32)
    choice = np.zeros((w,), np.int32)
    gen_length = np.full((w,), self.cfg.gen_length, np.int32)
    index = np.zeros((w,), np.int32)
    value = np.zeros((w,), np.float32)
    temperature = np.zeros((w,), np.float32)
    for i, e in enumerate(entries):
      n = len(e.prompt)
      slot[i], choice[i], gen_length[i] = e.slot, e.choice, e.max_tokens
      if n:
        tokens[i, p - n:] = e.prompt
        valid[i, p - n:] = True
      seed_lo[i], seed_hi[i] = e.seed % 2**32, e.seed // 2**32
      index[i], value[i], temperature[i] = rule_index(e.rule), e.rule.value, e.temperature
    pool_entry = np.full((w,), self.pool.n, np.int32)
    pool_fill = np.zeros((w,), bool)
    pool_entry[:len(entries)], pool_fill[:len(entries)] = self.pool.assign(entries,
                                                                           self._dispatched)
    return per_row.Admission(slot, tokens, valid, seed_lo, seed_hi, choice, gen_length,
                             RowSettings(index, value, temperature), pool_entry, pool_fill)

  def dispatch(self, entries: list[Entry], cancel_slots: list[int],
               iterations: int | None = None):
    """Starts one device call (module docstring) and returns at once (JAX dispatches
    asynchronously): the host works while the device runs. `iterations`: at most this many
    engine iterations in this call (default `shape.iterations`; another count compiles its
    own program once: a call of one iteration shows every forward's commits). -> the call's
    view on the device (`fetch` it)."""
    iterations = iterations or self.shape.iterations
    if iterations not in self._calls:
      self._calls[iterations] = self._make_call(iterations)
    cancel = np.zeros((self.shape.slots,), bool)
    cancel[list(cancel_slots)] = True
    with sharding_lib.tracing_mesh(self.mesh):
      self.state, view = self._calls[iterations](self.params, self.state,
                                                 self.admission(entries), jnp.asarray(cancel))
    self._dispatched += 1
    return view, self._dispatched - 1

  def fetch(self, dispatched) -> HostView:
    """The view of a dispatched call on the host (waits for the call); calls are fetched in
    the order they were dispatched."""
    view, number = dispatched
    v = jax.device_get(view)
    r = v.results
    self.pool.read(np.asarray(v.pool_busy), number)
    return HostView(np.asarray(v.row_slot), np.asarray(v.row_blocks), np.asarray(v.row_nfe),
                    np.asarray(v.row_denoise), np.asarray(r.blocks),
                    np.asarray(r.nfe), np.asarray(r.nfe_engine), np.asarray(r.nfe_denoise),
                    np.asarray(r.done), int(v.waiting), int(v.iterations),
                    np.asarray(v.row_active), np.asarray(v.row_tokens), np.asarray(v.pool_busy))

  def call(self, entries: list[Entry], cancel_slots: list[int]) -> HostView:
    """One device call, its view on the host."""
    return self.fetch(self.dispatch(entries, cancel_slots))


class WholeEngine:
  """A family sampler that decodes a request in one piece (DiffusionGemma's uniform-noise
  sampler: canvases denoised as a whole, its own stopping rule): each device call decodes the
  requests it admits to their end, one decode per request (`decoder` vmapped over batches of
  one, each with the request's key), so a response equals decoding its prompt alone. Calls
  are sized to the smallest power of two that holds their requests (at most `shape.waiting`);
  a response arrives whole (one block event: its text)."""

  def __init__(self, decoder, params, model_cfg, shape: EngineShape, mesh, *, block_size: int,
               eos_id: int):
    self.shape, self.mesh = shape, mesh
    rules = families.of_model(model_cfg).partition_rules
    self._params_shardings = sharding_lib.tree_shardings(params, mesh, rules)
    self.params = jax.device_put(params, self._params_shardings)
    one = lambda p, t, v, k: jax.tree.map(lambda x: x[0], decoder(p, t[None], v[None], k))
    self._decode = jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0)))
    p = shape.prompt_len
    probe = jax.eval_shape(decoder, params, jax.ShapeDtypeStruct((1, p), jnp.int32),
                           jax.ShapeDtypeStruct((1, p), jnp.bool_), jax.random.key(0))
    n = probe.tokens.shape[1]
    # what the scheduler reads: the response's length and its blocks (no mask token)
    self.cfg = DecodeConfig(gen_length=n, block_size=block_size if n % block_size == 0 else n,
                            mask_id=-1, eos_id=eos_id,
                            rule=UnmaskRule(), block_placement="prompt_end", commit_compare=">=")

  @property
  def block_size(self) -> int:
    return self.cfg.block_size

  def set_params(self, params) -> None:
    self.params = jax.device_put(params, self._params_shardings)

  def dispatch(self, entries: list[Entry], cancel_slots: list[int],
               iterations: int | None = None):
    """Decodes `entries` (cancellations have nothing to stop, nor iterations to count: a call
    decodes its requests whole); returns at once. -> (the outputs on the device, their
    slots)."""
    del cancel_slots, iterations
    if not entries:
      return None, []
    width, p = 1, self.shape.prompt_len
    while width < len(entries):
      width *= 2
    tokens = np.zeros((width, p), np.int32)
    valid = np.zeros((width, p), bool)
    seeds = np.zeros((width, 2), np.uint32)
    choice = np.zeros((width,), np.int32)
    for i, e in enumerate(entries):
      if len(e.prompt):
        tokens[i, p - len(e.prompt):], valid[i, p - len(e.prompt):] = e.prompt, True
      seeds[i] = e.seed % 2**32, e.seed // 2**32
      choice[i] = e.choice
    keys = per_row.request_keys(seeds[:, 0], seeds[:, 1], choice)
    with sharding_lib.tracing_mesh(self.mesh):
      out = self._decode(self.params, tokens, valid, keys)
    return out, [e.slot for e in entries]

  def fetch(self, dispatched) -> HostView:
    out, slots = dispatched
    q = self.shape.slots
    blocks = np.full((q, self.cfg.gen_length), self.cfg.eos_id, np.int32)
    nfe, engine, denoise = (np.zeros((q,), np.int32) for _ in range(3))
    done = np.zeros((q,), bool)
    if slots:
      o = jax.device_get(out)
      n = len(slots)
      blocks[slots], done[slots] = np.asarray(o.tokens)[:n], True
      nfe[slots], engine[slots] = np.asarray(o.nfe)[:n], np.asarray(o.nfe_engine)[:n]
      denoise[slots] = np.asarray(o.nfe_denoise)[:n]
    none = np.zeros((0,), np.int32)
    return HostView(none, np.zeros((0, self.cfg.gen_length), np.int32), none, none, blocks,
                    nfe, engine, denoise, done, 0, 0)

  def call(self, entries: list[Entry], cancel_slots: list[int]) -> HostView:
    return self.fetch(self.dispatch(entries, cancel_slots))
