"""The replay plan (docs/method.md#replay-states-packing-staircase-attention), built on the host
from small arrays only (validity, block index, rewards): for each row slot, where its token comes
from (a prompt, a response's final tokens, or a captured state) plus its staircase metadata.
`replay/gather.py` then gathers tokens, residuals and rollout statistics by index on the device, so
large buffers (`z` is [B, S, b, D]) never visit the host.

`build_plan` is six steps: `select_states` -> `form_units` -> `pack_rows` (first-fit
decreasing) -> `lay_out` (tokens and metadata) -> `aec_pairs` -> `balance_and_order` (data
shards, micro-batches).

Row layout (block-causal families): all selected responses of one prompt share one copy of the
prompt; each response contributes the clean blocks its states need (blocks before the state's
block) and its states:

    [ prompt | r1 clean | r1 states ... | r2 clean | r2 states ... | prompt' | ... | pad ]

The prompt is the one the rollout's prefill read (`Trajectories.prompt_tokens`): with absolute
block placement (LLaDA2.x, SDAR) its complete blocks only; its last n mod b tokens open response
block 0, in that block's clean copy and in every state of it (`Capture.block_final`,
`Capture.block_tokens`), exactly as the decoder forwarded them.
A group that does not fit one row is split into segments, each with its own prompt copy.
The naive layout (`layout="naive"`) puts every state in its own row with its whole prefix.
Fully bidirectional families (LLaDA) cannot share context — their prompt attends to the canvas
— so `layout="canvas"` replays every state as its own full canvas segment
`[prompt | committed blocks | active block | future masks]` under plain segment masking (all
tokens of a segment see each other), exactly what the decoder forwarded.
Losses are normalised per response (see losses.py), so packing never changes the loss.

Gradient accumulation (`micro_batches > 1`) splits the rows of an update into micro-batches
(`batch.split_rows`) whose losses use normalisers summed over all rows. The one term that
couples rows is AEC: a pair (k, k+1) needs the (stop-gradient) entropy of state k when state
k+1 is trained, so the plan orders rows so that state k's micro-batch never comes after state
k+1's (`order_rows_for_micro_batches`), and the step carries the entropies of earlier
micro-batches.
"""
from __future__ import annotations

import dataclasses
import heapq
import typing
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from orl_jax.packed_batch import micro_batch_of_rows
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                TokenMeta)

SRC_PAD, SRC_PROMPT, SRC_CLEAN, SRC_STATE, SRC_MASK = 0, 1, 2, 3, 4
ReplayLayout = Literal["packed", "naive", "canvas"]   # replay.layout
LAYOUTS: tuple[str, ...] = typing.get_args(ReplayLayout)
CONTEXTS = ("block", "token")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayConfig:
  """The replay plan's settings; the fields named as the `replay` section's have no defaults
  of their own (the section, `orl_jax.config.sections.Replay`, holds them;
  `orl_jax.config.derive.replay_config` builds one from a run)."""
  row_len: int                  # T, tokens per packed row
  n_rows: int                   # R, rows per update (static shape)
  max_states: int               # selected-state slots per update
  max_responses: int            # response slots per update
  block_size: int               # b, tokens of a decoded block (a captured state's width)
  states_per_response: int      # 0 = all captured states; else a random contiguous window
  layout: ReplayLayout          # packed | naive | canvas (bidirectional families)
  response_blocks: int = 0      # canvas layout: blocks per response (future blocks are masks)
  context: str = "block"        # block: block-causal context | token: token-causal context
                                # (DiffusionGemma's commit stream; metadata block = position)
  n_shards: int = 1             # data-parallel shards rows are balanced over
  micro_batches: int            # row micro-batches per update (gradient accumulation)

  def __post_init__(self):
    if self.block_size <= 0:
      raise ValueError(f"the replay block size must be positive, got {self.block_size}")
    if self.context not in CONTEXTS:
      raise ValueError(f"replay context must be one of {CONTEXTS}, got {self.context!r}")
    if self.context == "token" and self.layout != "packed":
      raise ValueError("a token-causal context replays in the packed layout only")
    if self.layout == "canvas" and self.response_blocks <= 0:
      raise ValueError("the canvas replay layout needs response_blocks > 0")
    if self.micro_batches < 1 or self.n_rows % (self.n_shards * self.micro_batches):
      raise ValueError(f"replay.n_rows={self.n_rows} must be divisible by replay.micro_batches="
                       f"{self.micro_batches} times the {self.n_shards} data shards (add rows; "
                       "unused rows are padding)")

  @property
  def one_state_per_unit(self) -> bool:
    """naive and canvas layouts: every state is its own segment with its whole prefix."""
    return self.layout in ("naive", "canvas")


@struct.dataclass
class ReplayPlan:
  """Host-built, static-shape description of one replay batch (all numpy int32 / bool)."""
  src_type: np.ndarray     # [R, T] SRC_*
  src_group: np.ndarray    # [R, T] prompt index (prompt tokens)
  src_resp: np.ndarray     # [R, T] response index (clean / state tokens)
  src_state: np.ndarray    # [R, T] capture index (state tokens)
  src_pos: np.ndarray      # [R, T] position within prompt / response / block
  positions: np.ndarray    # [R, T] RoPE positions
  meta: TokenMeta          # [R, T]
  state_slot: np.ndarray   # [R, T] selected-state slot of a state token, -1 otherwise
  resp_slot: np.ndarray    # [R, T] response slot of a state token, -1 otherwise
  pair_a: np.ndarray       # [Q] state slot k of an AEC pair (k, k+1)
  pair_b: np.ndarray       # [Q] state slot k + 1
  pair_resp: np.ndarray    # [Q] response slot of the pair
  pair_valid: np.ndarray   # [Q] bool
  state_resp: np.ndarray   # [max_states] response slot of each state slot (-1 unused)
  n_responses: np.ndarray  # scalar int32: responses that produce gradient

  @classmethod
  def abstract(cls, cfg: ReplayConfig) -> "ReplayPlan":
    """Shapes and dtypes of every plan of `cfg` (to trace the gather and the step once)."""
    # ShapeDtypeStruct leaves in place of the arrays the fields are annotated with (Any)
    spec: Callable[..., Any] = jax.ShapeDtypeStruct
    i32 = lambda *s: spec(s, jnp.int32)
    rt, q = (cfg.n_rows, cfg.row_len), max(cfg.max_states, 1)
    return cls(src_type=i32(*rt), src_group=i32(*rt), src_resp=i32(*rt), src_state=i32(*rt),
               src_pos=i32(*rt), positions=i32(*rt), meta=TokenMeta(*(i32(*rt),) * 5),
               state_slot=i32(*rt), resp_slot=i32(*rt), pair_a=i32(q), pair_b=i32(q),
               pair_resp=i32(q), pair_valid=spec((q,), jnp.bool_),
               state_resp=i32(cfg.max_states), n_responses=i32())


@dataclasses.dataclass
class _Unit:
  """A response's piece of a segment: clean blocks it needs and some of its states."""
  group: int
  resp: int
  clean_blocks: int          # number of clean response blocks placed before its states
  states: list               # [(capture index, block)]
  mask_blocks: int = 0       # canvas layout: masked future blocks after the state

  def size(self, b):
    return (self.clean_blocks + len(self.states) + self.mask_blocks) * b


def select_states(valid, blocks, eligible, cfg: ReplayConfig, rng: np.random.Generator):
  """{response index: [(capture index, block)]} for eligible (verified) responses."""
  out = {}
  for r in np.flatnonzero(np.asarray(eligible)):
    idx = np.flatnonzero(valid[r])
    if idx.size == 0:
      continue
    if cfg.states_per_response and idx.size > cfg.states_per_response:
      start = int(rng.integers(0, idx.size - cfg.states_per_response + 1))
      idx = idx[start:start + cfg.states_per_response]
    out[int(r)] = [(int(i), int(blocks[r, i])) for i in idx]
  return out


def form_units(selected, group_size: int, prompt_len: int, b: int, cfg: ReplayConfig):
  """The units to pack: one per state (naive, canvas: with its masked future blocks), else
  each response's states with their clean context, split where they overflow a row."""
  units = []
  for r, states in selected.items():
    if cfg.one_state_per_unit:
      future = cfg.response_blocks if cfg.layout == "canvas" else None
      units += [_Unit(r // group_size, r, blk, [(i, blk)],
                      0 if future is None else future - 1 - blk)
                for i, blk in states]
      continue
    pending = list(states)
    while pending:  # split a response whose states overflow a row
      take: list[tuple[int, int]] = []
      for i, blk in pending:
        clean = max([x[1] for x in take] + [blk])
        if prompt_len + (clean + len(take) + 1) * b > cfg.row_len and take:
          break
        take.append((i, blk))
      pending = pending[len(take):]
      units.append(_Unit(r // group_size, r, max(x[1] for x in take), take))
  if any(prompt_len + u.size(b) > cfg.row_len for u in units):
    raise ValueError(f"replay.row_len={cfg.row_len} cannot hold a prompt ({prompt_len}) plus "
                     f"one state with its context; raise replay.row_len")
  return units


def _segments_of_group(us, prompt_len: int, b: int, cfg: ReplayConfig):
  """A group that fits no row whole: its units cut into segments that each fill a row (each
  segment gets its own prompt copy); naive layouts: one segment per unit."""
  if cfg.one_state_per_unit:
    return [[u] for u in us]
  chunks: list[list[_Unit]] = []
  size = cfg.row_len
  for u in sorted(us, key=lambda u: -u.size(b)):
    if size + u.size(b) > cfg.row_len - prompt_len:
      chunks.append([])
      size = 0
    chunks[-1].append(u)
    size += u.size(b)
  return chunks


def pack_rows(units, prompt_len: int, b: int, cfg: ReplayConfig):
  """First-fit-decreasing over whole prompt groups, then over segments of a group that fits no
  row whole. Returns (rows, states dropped): rows[i] = [(group, [units])], one per segment."""
  rows: list[list[tuple[int, list[_Unit]]]] = []
  used: list[int] = []
  by_group: dict[int, list[_Unit]] = {}
  for u in units:
    by_group.setdefault(u.group, []).append(u)

  def place(group, us):
    need = prompt_len + sum(u.size(b) for u in us)
    if need > cfg.row_len:
      return False
    for i in range(len(rows)):
      if used[i] + need <= cfg.row_len:
        rows[i].append((group, us))
        used[i] += need
        return True
    if len(rows) < cfg.n_rows:
      rows.append([(group, us)])
      used.append(need)
      return True
    return False

  dropped = 0
  groups = sorted(by_group.items(), key=lambda kv: -sum(u.size(b) for u in kv[1]))
  for group, us in groups:
    if not cfg.one_state_per_unit and place(group, us):
      continue
    for chunk in _segments_of_group(us, prompt_len, b, cfg):
      if not place(group, chunk):
        dropped += sum(len(u.states) for u in chunk)
  return rows, dropped


# Token fields of a plan and the value of a padding slot.
_TOKEN_FIELDS = dict(src_type=SRC_PAD, src_group=0, src_resp=0, src_state=0, src_pos=0,
                     positions=0, segment=0, response=-1, kind=KIND_PAD, block=0, state_id=-1,
                     state_slot=-1, resp_slot=-1)


class _Layout:
  """The [R, T] token arrays of a plan, written segment by segment; hands out the state and
  response slots (states beyond `max_states` or `max_responses` are dropped and counted)."""

  def __init__(self, prompt_valid, b: int, cfg: ReplayConfig):
    self.prompt_valid, self.b, self.cfg = prompt_valid, b, cfg
    self.prompt_len = prompt_valid.shape[1]
    self.a = {k: np.full((cfg.n_rows, cfg.row_len), fill, np.int32)
              for k, fill in _TOKEN_FIELDS.items()}
    self.state_resp = np.full((cfg.max_states,), -1, np.int32)
    self.resp_slots: dict[int, int] = {}   # response -> response slot
    # slot_of[(response, capture index)] = (slot, block)
    self.slot_of: dict[tuple[int, int], tuple[int, int]] = {}
    self.n_state_slots = self.state_tokens = self.dropped = 0

  def _set(self, ri: int, t: int, n: int, **values) -> int:
    for k, v in values.items():
      self.a[k][ri, t:t + n] = v
    return t + n

  def row(self, ri: int, segments) -> None:
    t = state_id = 0
    for si, (group, us) in enumerate(segments):
      start = t
      local: dict[int, int] = {}
      t = self._prompt(ri, t, si + 1, group)
      for u in us:
        t, state_id = self._unit(ri, t, si + 1, local.setdefault(u.resp, len(local)), u,
                                 state_id)
      if self.cfg.layout == "canvas":  # one bidirectional segment: every real token sees all
        sl = slice(start, t)
        kind = self.a["kind"][ri, sl]
        self.a["kind"][ri, sl] = np.where(self.a["src_type"][ri, sl] == SRC_PROMPT, kind,
                                          KIND_PROMPT)
        self._set(ri, start, t - start, block=0, response=-1, state_id=-1)

  def _prompt(self, ri: int, t: int, segment: int, group: int) -> int:
    p = self.prompt_len
    return self._set(ri, t, p, src_type=SRC_PROMPT, src_group=group, src_pos=np.arange(p),
                     positions=np.arange(p), segment=segment, block=np.arange(p) // self.b,
                     kind=np.where(self.prompt_valid[group], KIND_PROMPT, KIND_PAD))

  def _slot(self, resp: int):
    """(state slot, response slot) for a new state of `resp`, or None when full."""
    cfg = self.cfg
    if self.n_state_slots >= cfg.max_states or (resp not in self.resp_slots
                                                and len(self.resp_slots) >= cfg.max_responses):
      self.dropped += 1
      return None
    rs = self.resp_slots.setdefault(resp, len(self.resp_slots))
    slot, self.n_state_slots = self.n_state_slots, self.n_state_slots + 1
    self.state_resp[slot] = rs
    return slot, rs

  def _unit(self, ri: int, t: int, segment: int, local_resp: int, u: _Unit, state_id: int):
    """Writes unit `u` at row `ri`, token `t`: its clean blocks, its captured states (those a
    slot is left for) and, in the canvas layout, its still-masked future blocks; each part in
    one vectorised write (`_blocks`). Returns (next token, next state id)."""
    p, b = self.prompt_len, self.b
    common = dict(segment=segment, src_resp=u.resp)
    if u.clean_blocks:
      n = u.clean_blocks * b
      t = self._set(ri, t, n, src_type=SRC_CLEAN, src_pos=np.arange(n), positions=p + np.arange(n),
                    response=local_resp, kind=KIND_CLEAN,
                    block=self._blocks(np.arange(u.clean_blocks)), **common)
    kept = []   # (capture index, block, state slot, response slot) of the states given a slot
    for cap_i, block in u.states:
      slots = self._slot(u.resp)
      if slots is not None:
        kept.append((cap_i, block, *slots))
        self.slot_of[(u.resp, cap_i)] = (slots[0], block)
    if kept:
      cap, blocks, state_slot, resp_slot = (np.asarray(c, np.int32) for c in zip(*kept))
      n, within = len(kept) * b, np.tile(np.arange(b), len(kept))
      t = self._set(ri, t, n, src_type=SRC_STATE, src_state=np.repeat(cap, b), src_pos=within,
                    positions=p + np.repeat(blocks, b) * b + within, response=local_resp,
                    kind=KIND_STATE, block=self._blocks(blocks),
                    state_id=np.repeat(state_id + np.arange(len(kept)), b),
                    state_slot=np.repeat(state_slot, b), resp_slot=np.repeat(resp_slot, b),
                    **common)
      state_id += len(kept)
      self.state_tokens += n
    if u.mask_blocks:  # canvas layout: the still-masked future blocks
      n = u.mask_blocks * b
      t = self._set(ri, t, n, src_type=SRC_MASK,
                    positions=p + (u.states[-1][1] + 1) * b + np.arange(n), **common)
    return t, state_id

  def _blocks(self, blocks: np.ndarray) -> np.ndarray:
    """Each token's block index in the row's positions (the prompt's blocks first) for the
    response blocks `blocks`, `b` tokens each."""
    p, b = self.prompt_len, self.b
    return np.repeat((p + np.asarray(blocks) * b) // b, b)


def lay_out(rows, prompt_valid, b: int, cfg: ReplayConfig) -> _Layout:
  """Token sources, positions and staircase metadata of the packed rows."""
  layout = _Layout(prompt_valid, b, cfg)
  for ri, segments in enumerate(rows):
    layout.row(ri, segments)
  return layout


def aec_pairs(slot_of: dict, resp_slots: dict, max_states: int):
  """(pair_a, pair_b, pair_resp, pair_valid) [Q]: consecutive captured steps (k, k+1) of the
  same block, wherever they were packed."""
  pairs = []
  for (r, cap_i), (slot, block) in slot_of.items():
    nxt = slot_of.get((r, cap_i + 1))
    if nxt is not None and nxt[1] == block:
      pairs.append((slot, nxt[0], resp_slots[r]))
  q = max(max_states, 1)
  pa, pb, pr = (np.zeros((q,), np.int32) for _ in range(3))
  pv = np.zeros((q,), bool)
  for i, (a, bb, rs) in enumerate(pairs[:q]):
    pa[i], pb[i], pr[i], pv[i] = a, bb, rs, True
  return pa, pb, pr, pv


def balance_and_order(plan: ReplayPlan, cfg: ReplayConfig, prompt_len: int, b: int):
  """(plan, cost per data shard): rows balanced over the shards, then ordered for the AEC
  pairs of gradient accumulation."""
  if cfg.n_shards > 1:
    plan, shard_cost = balance_rows(plan, cfg.n_shards, prompt_len, b)
  else:
    shard_cost = np.asarray([row_costs(plan, prompt_len, b).sum()])
  if cfg.micro_batches > 1:
    plan = order_rows_for_micro_batches(plan, cfg.micro_batches, cfg.n_shards)
  return plan, shard_cost


def build_plan(*, prompt_valid, capture_valid, capture_block, eligible, group_size: int,
               cfg: ReplayConfig, rng: np.random.Generator):
  """Packs selected states into `cfg.n_rows` rows of `cfg.row_len` tokens.

  Returns (plan, stats). States that do not fit the static capacity are dropped and counted
  in `stats["states_dropped"]` (raise replay.n_rows / row_len if that is not zero).
  """
  b, prompt_len = cfg.block_size, prompt_valid.shape[1]
  selected = select_states(capture_valid, capture_block, eligible, cfg, rng)
  units = form_units(selected, group_size, prompt_len, b, cfg)
  rows, dropped = pack_rows(units, prompt_len, b, cfg)
  layout = lay_out(rows, prompt_valid, b, cfg)
  pa, pb, pr, pv = aec_pairs(layout.slot_of, layout.resp_slots, cfg.max_states)
  a = layout.a
  block = a["block"]
  if cfg.context == "token":   # blocks of one token; a state's block: its canvas's start
    block = np.where(a["kind"] == KIND_STATE, a["positions"] - a["src_pos"],
                     np.where(a["kind"] == KIND_PAD, 0, a["positions"])).astype(np.int32)
  # numpy fields where TokenMeta's annotations say jax.Array: they are read as arrays
  meta = TokenMeta(segment=a["segment"], response=a["response"], kind=a["kind"],  # type: ignore[arg-type]
                   block=block, state_id=a["state_id"])  # type: ignore[arg-type]
  plan = ReplayPlan(src_type=a["src_type"], src_group=a["src_group"], src_resp=a["src_resp"],
                    src_state=a["src_state"], src_pos=a["src_pos"], positions=a["positions"],
                    meta=meta, state_slot=a["state_slot"], resp_slot=a["resp_slot"],
                    pair_a=pa, pair_b=pb, pair_resp=pr, pair_valid=pv,
                    state_resp=layout.state_resp,
                    n_responses=np.asarray(len(layout.resp_slots), np.int32))
  plan, shard_cost = balance_and_order(plan, cfg, prompt_len, b)
  stats = {"states_selected": sum(len(v) for v in selected.values()),
           "states_packed": layout.n_state_slots, "states_dropped": dropped + layout.dropped,
           "responses_trained": len(layout.resp_slots), "rows_used": len(rows),
           "replay_efficiency": layout.state_tokens / float(cfg.n_rows * cfg.row_len),
           "shard_cost_max_over_mean": float(shard_cost.max() / max(shard_cost.mean(), 1e-9))}
  return plan, stats


def row_costs(plan: ReplayPlan, prompt_len: int, b: int) -> np.ndarray:
  """Estimated cost per row: sum over its states of b * visible context + b^2
  (docs/method.md#replay-states-packing-staircase-attention); the visible context of a state is
  everything before its block's first position."""
  del prompt_len  # the state's first position counts the prompt
  is_first = (plan.src_type == SRC_STATE) & (plan.src_pos == 0)
  context = np.where(is_first, plan.positions, 0)
  cost = np.where(is_first, b * context + b * b, 0)
  return cost.sum(axis=1)


def _reorder_rows(plan: ReplayPlan, order: np.ndarray) -> ReplayPlan:
  n_rows = order.shape[0]
  return jax.tree.map(lambda x: x[order] if (x.ndim == 2 and x.shape[0] == n_rows) else x, plan)


def balance_rows(plan: ReplayPlan, n_shards: int, prompt_len: int, b: int):
  """Reorders rows so that shard s gets rows [s*R/n, (s+1)*R/n) with near-equal total cost
  (longest-processing-time greedy under an equal-rows constraint)."""
  costs = row_costs(plan, prompt_len, b)
  n_rows = costs.shape[0]
  if n_rows % n_shards:
    raise ValueError(f"replay.n_rows={n_rows} must be divisible by the {n_shards} data shards")
  per = n_rows // n_shards
  loads = np.zeros(n_shards)
  members: list[list[int]] = [[] for _ in range(n_shards)]
  for r in np.argsort(-costs, kind="stable"):
    open_ = [s for s in range(n_shards) if len(members[s]) < per]
    s = min(open_, key=lambda s: loads[s])
    members[s].append(int(r))
    loads[s] += costs[r]
  return _reorder_rows(plan, np.asarray([r for m in members for r in m])), loads


def _row_graph(plan: ReplayPlan):
  """Edges row(k) -> row(k + 1) of the AEC pairs whose two states sit in different rows."""
  is_state = plan.state_slot >= 0
  slot_row = np.full(plan.state_resp.shape[0], -1)
  slot_row[plan.state_slot[is_state]] = np.nonzero(is_state)[0]
  row_a, row_b = slot_row[plan.pair_a], slot_row[plan.pair_b]
  cross = plan.pair_valid & (row_a != row_b)
  return set(zip(row_a[cross].tolist(), row_b[cross].tolist()))


def _topological_rank(n_rows: int, edges) -> np.ndarray:
  """Rank of each row in a topological order of the row graph, smallest row first among the
  ready ones (Kahn). Rows on a cycle (two responses split over the same rows in opposite
  orders) and the rows after them keep their order at the end."""
  succ: list[list[int]] = [[] for _ in range(n_rows)]
  indeg = np.zeros(n_rows, int)
  for a, b in edges:
    succ[a].append(b)
    indeg[b] += 1
  ready = [r for r in range(n_rows) if indeg[r] == 0]
  heapq.heapify(ready)
  order = []
  while ready:
    r = heapq.heappop(ready)
    order.append(r)
    for b in succ[r]:
      indeg[b] -= 1
      if indeg[b] == 0:
        heapq.heappush(ready, b)
  order += sorted(set(range(n_rows)) - set(order))
  rank = np.empty(n_rows, int)
  rank[order] = np.arange(n_rows)
  return rank


def order_rows_for_micro_batches(plan: ReplayPlan, micro_batches: int, n_shards: int = 1):
  """Reorders rows (within each data shard, so shard costs are unchanged) so that for every AEC
  pair (k, k+1) the micro-batch of state k is not after that of state k + 1: a stable
  topological order of the rows. Raises if the order found does not achieve that (a cycle of
  split responses, or pairs across shards, straddling micro-batches)."""
  n_rows = plan.state_slot.shape[0]
  edges = _row_graph(plan)
  if not edges:
    return plan
  rank = _topological_rank(n_rows, edges)
  per = n_rows // n_shards
  order = np.concatenate([s * per + np.argsort(rank[s * per:(s + 1) * per], kind="stable")
                          for s in range(n_shards)])
  plan = _reorder_rows(plan, order)
  micro = micro_batch_of_rows(n_rows, micro_batches, n_shards)
  new_row = np.argsort(order)
  bad = [(a, b) for a, b in edges if micro[new_row[a]] > micro[new_row[b]]]
  if bad:
    raise ValueError(f"replay.micro_batches={micro_batches}: {len(bad)} AEC pairs of responses "
                     "split across rows cannot be ordered across micro-batches (rows "
                     f"{bad[:3]} ...); raise replay.row_len or lower replay.micro_batches")
  return plan
