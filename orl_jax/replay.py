"""Replay: select captured states of verified responses, pack them into staircase rows, and
gather the packed batch on device (DESIGN §2.5).

Packing is planned on the host from small arrays only (validity, block index, rewards): the
plan says, for each row slot, where its token comes from (a prompt, a response's final tokens,
or a captured state) plus its staircase metadata. The device then gathers tokens, residuals and
rollout statistics by index, so large buffers (`z` is [B, S, b, D]) never visit the host.

Row layout (block-causal families): all selected responses of one prompt share one copy of the
prompt; each response contributes the clean blocks its states need (blocks before the state's
block) and its states:

    [ prompt | r1 clean | r1 states ... | r2 clean | r2 states ... | prompt' | ... | pad ]

A group that does not fit one row is split into segments, each with its own prompt copy.
The naive layout (`layout="naive"`) puts every state in its own row with its whole prefix.
Fully bidirectional families (LLaDA) cannot share context — their prompt attends to the canvas
— so `layout="canvas"` replays every state as its own full canvas segment
`[prompt | committed blocks | active block | future masks]` under plain segment masking (all
tokens of a segment see each other), exactly what the decoder forwarded.
Losses are normalised per response (see losses.py), so packing never changes the loss.

Gradient accumulation (`micro_batches > 1`) splits the rows of an update into micro-batches
(`split_rows`) whose losses use normalisers summed over all rows. The one term that couples rows
is AEC: a pair (k, k+1) needs the (stop-gradient) entropy of state k when state k+1 is trained,
so `build_plan` orders rows so that state k's micro-batch never comes after state k+1's
(`order_rows_for_micro_batches`), and the step carries the entropies of earlier micro-batches.
"""
from __future__ import annotations

import dataclasses
import heapq

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                TokenMeta)

SRC_PAD, SRC_PROMPT, SRC_CLEAN, SRC_STATE, SRC_MASK = 0, 1, 2, 3, 4
LAYOUTS = ("packed", "naive", "canvas")


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
  row_len: int                  # T, tokens per packed row
  n_rows: int                   # R, rows per update (static shape)
  max_states: int               # selected-state slots per update
  max_responses: int            # response slots per update
  states_per_response: int = 0  # 0 = all captured states; else a random contiguous window
  layout: str = "packed"        # packed | naive | canvas (bidirectional families)
  response_blocks: int = 0      # canvas layout: blocks per response (future blocks are masks)
  n_shards: int = 1             # data-parallel shards rows are balanced over
  micro_batches: int = 1        # row micro-batches per update (gradient accumulation)


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


def state_cost(block: int, prompt_blocks: int, b: int) -> int:
  """Estimated attention cost of replaying a state of response block `block`: b * context + b^2."""
  return b * (prompt_blocks + block) * b + b * b


def _units(selected, group_size, prompt_len, b, row_len, naive, future_blocks=None):
  units = []
  for r, states in selected.items():
    if naive:  # one state per unit; canvas units also carry the masked future blocks
      units += [_Unit(r // group_size, r, blk, [(i, blk)],
                      0 if future_blocks is None else future_blocks - 1 - blk)
                for i, blk in states]
      continue
    pending = list(states)
    while pending:  # split a response whose states overflow a row
      take = []
      for i, blk in pending:
        clean = max([x[1] for x in take] + [blk])
        if prompt_len + (clean + len(take) + 1) * b > row_len and take:
          break
        take.append((i, blk))
      pending = pending[len(take):]
      units.append(_Unit(r // group_size, r, max(x[1] for x in take), take))
  return units


def build_plan(*, prompt_valid, capture_valid, capture_block, eligible, group_size: int,
               block_size: int, cfg: ReplayConfig, rng: np.random.Generator):
  """Packs selected states into `cfg.n_rows` rows of `cfg.row_len` tokens.

  Returns (plan, stats). States that do not fit the static capacity are dropped and counted
  in `stats["states_dropped"]` (raise replay.n_rows / row_len if that is not zero).
  """
  b = block_size
  n_prompts, prompt_len = prompt_valid.shape
  if cfg.layout not in LAYOUTS:
    raise ValueError(f"replay.layout must be one of {LAYOUTS}, got {cfg.layout!r}")
  canvas = cfg.layout == "canvas"
  if canvas and cfg.response_blocks <= 0:
    raise ValueError("the canvas replay layout needs response_blocks > 0")
  naive = cfg.layout == "naive" or canvas
  if cfg.micro_batches < 1 or cfg.n_rows % (cfg.n_shards * cfg.micro_batches):
    raise ValueError(f"replay.n_rows={cfg.n_rows} must be divisible by replay.micro_batches="
                     f"{cfg.micro_batches} times the {cfg.n_shards} data shards (add rows; "
                     "unused rows are padding)")
  selected = select_states(capture_valid, capture_block, eligible, cfg, rng)
  units = _units(selected, group_size, prompt_len, b, cfg.row_len, naive,
                 cfg.response_blocks if canvas else None)
  if any(prompt_len + u.size(b) > cfg.row_len for u in units):
    raise ValueError(f"replay.row_len={cfg.row_len} cannot hold a prompt ({prompt_len}) plus "
                     f"one state with its context; raise replay.row_len")

  # First-fit-decreasing over whole prompt groups, then over single units of a group that fits
  # no row whole. rows[i] = list of segments; segment = (group, [units]).
  rows, used = [], []
  by_group = {}
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
    if naive:
      chunks = [[u] for u in us]
    elif place(group, us):
      continue
    else:  # split the group into segments that each fill a row, each with a prompt copy
      chunks, size = [], cfg.row_len
      for u in sorted(us, key=lambda u: -u.size(b)):
        if size + u.size(b) > cfg.row_len - prompt_len:
          chunks.append([])
          size = 0
        chunks[-1].append(u)
        size += u.size(b)
    for chunk in chunks:
      if not place(group, chunk):
        dropped += sum(len(u.states) for u in chunk)

  # Lay out tokens.
  r_, t_ = cfg.n_rows, cfg.row_len
  z = lambda fill=0: np.full((r_, t_), fill, np.int32)
  src_type, src_group, src_resp, src_state, src_pos, positions = z(), z(), z(), z(), z(), z()
  seg, resp, kind, blk, sid = z(), z(-1), z(KIND_PAD), z(), z(-1)
  state_slot, resp_slot = z(-1), z(-1)
  state_resp = np.full((cfg.max_states,), -1, np.int32)
  resp_slots, slot_of = {}, {}   # slot_of[(response, capture index)] = (slot, block)
  n_state_slots = 0
  state_tokens = 0
  for ri, row in enumerate(rows):
    t = 0
    state_id = 0
    for si, (group, us) in enumerate(row):
      sl = slice(t, t + prompt_len)
      src_type[ri, sl], src_group[ri, sl] = SRC_PROMPT, group
      src_pos[ri, sl] = positions[ri, sl] = np.arange(prompt_len)
      seg[ri, sl], blk[ri, sl] = si + 1, np.arange(prompt_len) // b
      kind[ri, sl] = np.where(prompt_valid[group], KIND_PROMPT, KIND_PAD)
      if canvas:
        blk[ri, sl] = 0
      seg_start = t
      t += prompt_len
      local = {}
      for u in us:
        lr = local.setdefault(u.resp, len(local))
        for j in range(u.clean_blocks):
          sl = slice(t, t + b)
          src_type[ri, sl], src_resp[ri, sl] = SRC_CLEAN, u.resp
          src_pos[ri, sl] = j * b + np.arange(b)
          positions[ri, sl] = prompt_len + j * b + np.arange(b)
          seg[ri, sl], resp[ri, sl], kind[ri, sl] = si + 1, lr, KIND_CLEAN
          blk[ri, sl] = (prompt_len + j * b) // b
          t += b
        for cap_i, block in u.states:
          if n_state_slots >= cfg.max_states or (u.resp not in resp_slots
                                                 and len(resp_slots) >= cfg.max_responses):
            dropped += 1
            continue
          rs = resp_slots.setdefault(u.resp, len(resp_slots))
          slot = n_state_slots
          n_state_slots += 1
          state_resp[slot] = rs
          sl = slice(t, t + b)
          src_type[ri, sl], src_resp[ri, sl], src_state[ri, sl] = SRC_STATE, u.resp, cap_i
          src_pos[ri, sl] = np.arange(b)
          positions[ri, sl] = prompt_len + block * b + np.arange(b)
          seg[ri, sl], resp[ri, sl], kind[ri, sl] = si + 1, lr, KIND_STATE
          blk[ri, sl] = (prompt_len + block * b) // b
          sid[ri, sl] = state_id
          state_slot[ri, sl], resp_slot[ri, sl] = slot, rs
          state_id += 1
          t += b
          state_tokens += b
          slot_of[(u.resp, cap_i)] = (slot, block)
        for j in range(u.mask_blocks):  # canvas layout: the still-masked future blocks
          sl = slice(t, t + b)
          src_type[ri, sl], src_resp[ri, sl] = SRC_MASK, u.resp
          first = u.states[-1][1] + 1 + j
          positions[ri, sl] = prompt_len + first * b + np.arange(b)
          seg[ri, sl] = si + 1
          t += b
      if canvas:  # one bidirectional segment: every real token sees every other
        sl = slice(seg_start, t)
        kind[ri, sl] = np.where(src_type[ri, sl] == SRC_PROMPT, kind[ri, sl], KIND_PROMPT)
        blk[ri, sl], resp[ri, sl], sid[ri, sl] = 0, -1, -1
  # AEC pairs: consecutive captured steps (k, k+1) of the same block, wherever they were packed.
  pairs = []
  for (r, cap_i), (slot, block) in slot_of.items():
    nxt = slot_of.get((r, cap_i + 1))
    if nxt is not None and nxt[1] == block:
      pairs.append((slot, nxt[0], resp_slots[r]))
  q = max(cfg.max_states, 1)
  pa, pb, pr = (np.zeros((q,), np.int32) for _ in range(3))
  pv = np.zeros((q,), bool)
  for i, (a, bb, rs) in enumerate(pairs[:q]):
    pa[i], pb[i], pr[i], pv[i] = a, bb, rs, True
  plan = ReplayPlan(src_type=src_type, src_group=src_group, src_resp=src_resp, src_state=src_state,
                    src_pos=src_pos, positions=positions,
                    meta=TokenMeta(segment=seg, response=resp, kind=kind, block=blk, state_id=sid),
                    state_slot=state_slot, resp_slot=resp_slot, pair_a=pa, pair_b=pb,
                    pair_resp=pr, pair_valid=pv, state_resp=state_resp,
                    n_responses=np.asarray(len(resp_slots), np.int32))
  if cfg.n_shards > 1:
    plan, shard_cost = balance_rows(plan, cfg.n_shards, prompt_len, b)
  else:
    shard_cost = np.asarray([row_costs(plan, prompt_len, b).sum()])
  if cfg.micro_batches > 1:
    plan = order_rows_for_micro_batches(plan, cfg.micro_batches, cfg.n_shards)
  stats = {"states_selected": sum(len(v) for v in selected.values()),
           "states_packed": n_state_slots, "states_dropped": dropped,
           "responses_trained": len(resp_slots), "rows_used": len(rows),
           "replay_efficiency": state_tokens / float(r_ * t_),
           "shard_cost_max_over_mean": float(shard_cost.max() / max(shard_cost.mean(), 1e-9))}
  return plan, stats


def row_costs(plan: ReplayPlan, prompt_len: int, b: int) -> np.ndarray:
  """Estimated cost per row: sum over its states of b * visible context + b^2."""
  is_first = (plan.src_type == SRC_STATE) & (plan.src_pos == 0)
  blocks = np.where(is_first, plan.meta.block, 0)
  cost = np.where(is_first, b * blocks * b + b * b, 0)
  return cost.sum(axis=1)


def balance_rows(plan: ReplayPlan, n_shards: int, prompt_len: int, b: int):
  """Reorders rows so that shard s gets rows [s*R/n, (s+1)*R/n) with near-equal total cost
  (longest-processing-time greedy under an equal-rows constraint)."""
  costs = row_costs(plan, prompt_len, b)
  n_rows = costs.shape[0]
  if n_rows % n_shards:
    raise ValueError(f"replay.n_rows={n_rows} must be divisible by the {n_shards} data shards")
  per = n_rows // n_shards
  loads, members = np.zeros(n_shards), [[] for _ in range(n_shards)]
  for r in np.argsort(-costs, kind="stable"):
    open_ = [s for s in range(n_shards) if len(members[s]) < per]
    s = min(open_, key=lambda s: loads[s])
    members[s].append(int(r))
    loads[s] += costs[r]
  order = np.asarray([r for m in members for r in m])
  return jax.tree.map(lambda x: x[order] if (x.ndim == 2 and x.shape[0] == n_rows) else x,
                      plan), loads


def micro_batch_of_rows(n_rows: int, micro_batches: int, n_shards: int = 1) -> np.ndarray:
  """[R] micro-batch index of each row under `split_rows`: every data shard's block of rows
  is cut into `micro_batches` consecutive chunks, so a micro-batch keeps rows on their shard."""
  per_shard = n_rows // n_shards
  return (np.arange(n_rows) % per_shard) // (per_shard // micro_batches)


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
  succ, indeg = [[] for _ in range(n_rows)], np.zeros(n_rows, int)
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
  plan = jax.tree.map(lambda x: x[order] if (x.ndim == 2 and x.shape[0] == n_rows) else x, plan)
  micro = micro_batch_of_rows(n_rows, micro_batches, n_shards)
  new_row = np.argsort(order)
  bad = [(a, b) for a, b in edges if micro[new_row[a]] > micro[new_row[b]]]
  if bad:
    raise ValueError(f"replay.micro_batches={micro_batches}: {len(bad)} AEC pairs of responses "
                     "split across rows cannot be ordered across micro-batches (rows "
                     f"{bad[:3]} ...); raise replay.row_len or lower replay.micro_batches")
  return plan


@struct.dataclass
class ReplayBatch:
  tokens: jax.Array          # [R, T]
  positions: jax.Array       # [R, T]
  meta: TokenMeta            # [R, T]
  residual: Residual         # z [R, T, D], alpha [R, T] consumed at state tokens
  targets: jax.Array         # [R, T] final tokens of the verified response
  masked: jax.Array          # [R, T] bool state token still masked in the captured canvas
  rollout_entropy: jax.Array # [R, T]
  topk_ids: jax.Array        # [R, T, K]
  topk_logprobs: jax.Array   # [R, T, K]
  state_slot: jax.Array      # [R, T]
  resp_slot: jax.Array       # [R, T]
  pair_a: jax.Array          # [Q]
  pair_b: jax.Array          # [Q]
  pair_resp: jax.Array       # [Q]
  pair_valid: jax.Array      # [Q]
  state_resp: jax.Array      # [S]
  n_responses: jax.Array     # scalar
  rollout_step: jax.Array    # scalar: update the trajectories were drawn for
  # The frozen KL reference on these rows (losses.attach_reference; None until attached):
  ref_hidden: jax.Array | None = None   # [R, T, D] its final hidden states
  ref_entropy: jax.Array | None = None  # [R, T] its normalized entropy (the anchor's gate)


# ReplayBatch fields with one entry per row; the others (AEC pairs, state slots) are per update.
ROW_FIELDS = ("tokens", "positions", "meta", "residual", "targets", "masked", "rollout_entropy",
              "topk_ids", "topk_logprobs", "state_slot", "resp_slot", "ref_hidden",
              "ref_entropy")


def split_rows(batch: ReplayBatch, micro_batches: int, n_shards: int = 1) -> ReplayBatch:
  """The batch with a leading [micro_batches] axis on every leaf, for `lax.scan`: row fields
  are cut as `micro_batch_of_rows` says ([R, ...] -> [M, R / M, ...]), per-update fields are
  repeated."""
  n_rows = batch.tokens.shape[0]
  if n_rows % (n_shards * micro_batches):
    raise ValueError(f"{n_rows} replay rows cannot be split into {micro_batches} micro-batches "
                     f"on each of {n_shards} data shards; make replay.n_rows a multiple of "
                     f"{n_shards * micro_batches}")

  def rows(x):  # [R, ...] = [shard, micro, row, ...] -> [micro, shard * row, ...]
    x = x.reshape((n_shards, micro_batches, n_rows // (n_shards * micro_batches)) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1).reshape((micro_batches, n_rows // micro_batches) + x.shape[3:])

  repeat = lambda x: jnp.broadcast_to(x, (micro_batches,) + jnp.shape(x))
  return batch.replace(**{f.name: jax.tree.map(rows if f.name in ROW_FIELDS else repeat,
                                               getattr(batch, f.name))
                          for f in dataclasses.fields(batch)})


def gather_batch(traj, plan: ReplayPlan, *, mask_id: int, block_size: int) -> ReplayBatch:
  """Device-side gather of a packed batch from trajectories (call under jit)."""
  cap = traj.capture
  st = plan.src_type
  is_state = st == SRC_STATE
  resp, sidx, pos = plan.src_resp, plan.src_state, plan.src_pos
  prompt_tok = traj.prompt_tokens[plan.src_group, jnp.clip(pos, 0, traj.prompt_tokens.shape[1] - 1)]
  n = traj.responses.shape[1]
  clean_tok = traj.responses[resp, jnp.clip(pos, 0, n - 1)]
  state_pos = jnp.clip(pos, 0, block_size - 1)
  state_tok = cap.canvas[resp, sidx, state_pos]
  tokens = jnp.where(st == SRC_PROMPT, prompt_tok,
                     jnp.where(st == SRC_CLEAN, clean_tok,
                               jnp.where(is_state, state_tok,
                                         jnp.where(st == SRC_MASK, mask_id, 0))))
  resp_block = cap.block[resp, sidx]
  target = traj.responses[resp, jnp.clip(resp_block * block_size + state_pos, 0, n - 1)]
  z = jnp.where(is_state[..., None], cap.z[resp, sidx, state_pos], 0)
  alpha = jnp.where(is_state, cap.alpha[resp, sidx, state_pos], 0)
  sel = lambda x: jnp.where(is_state.reshape(is_state.shape + (1,) * (x.ndim - 2)), x, 0)
  return ReplayBatch(
      tokens=tokens.astype(jnp.int32), positions=jnp.asarray(plan.positions),
      meta=TokenMeta(*(jnp.asarray(f) for f in plan.meta)), residual=Residual(z, alpha),
      targets=jnp.where(is_state, target, 0).astype(jnp.int32),
      masked=is_state & (tokens == mask_id),
      rollout_entropy=sel(cap.entropy[resp, sidx, state_pos]),
      topk_ids=sel(cap.topk_ids[resp, sidx, state_pos]),
      topk_logprobs=sel(cap.topk_logprobs[resp, sidx, state_pos]),
      state_slot=jnp.asarray(plan.state_slot), resp_slot=jnp.asarray(plan.resp_slot),
      pair_a=jnp.asarray(plan.pair_a), pair_b=jnp.asarray(plan.pair_b),
      pair_resp=jnp.asarray(plan.pair_resp), pair_valid=jnp.asarray(plan.pair_valid),
      state_resp=jnp.asarray(plan.state_resp), n_responses=jnp.asarray(plan.n_responses),
      rollout_step=traj.rollout_step)
