"""The on-policy loop (docs/method.md#the-on-policy-loop): rollout -> verify -> plan -> gather ->
update -> discard.

Each iteration draws fresh prompts, rolls out `G` responses per prompt with the *current*
parameters (capturing every denoising state), verifies them, packs the verified responses'
states into staircase rows and takes exactly one optimizer step on them (accumulated over
`replay.micro_batches` row micro-batches). An iteration with no verified response takes no
step (no moment changes either) and is counted in `updates_skipped`. Trajectories are never
reused: a ledger counts how many updates consumed each rollout, and the jitted step reports the
policy lag (updates applied since the parameters the rollout was drawn with): 0, or with
`orl.max_staleness=1` (`lagged_iteration`, docs/training.md#one-step-of-lag: the next
iteration's rollout is dispatched before this one's verification and update) 1 -- the
iteration's logged `staleness`.

One iteration, step by step (`orl_iteration`), with the module that owns each step:

    draw_prompts  data/pipeline.py    host -> device: this process's prompts  [hop: prompts]
    rollout       decode/trajectories jitted decode with capture, `orl.rollout_chunks` chunks,
                                      all dispatched at once -> Trajectories per chunk (device);
                                      the per-row engine with `orl.verify_while_decoding`: in
                                      segments of `orl.rollout_segment_iterations` iterations,
                                      each chunk's in turn
    pull_chunk    here                per chunk, in order: device-side sums and the small
                                      arrays to host (waits for that chunk) [hop: verification]
    verify        verify/, tasks.py   a chunk's decoded responses -> rewards, started without
                                      waiting (with `orl.verify_while_decoding`: while the
                                      device decodes the later chunks; per-row segments: each
                                      response as its row retires)     [hop: verification]
    combine       here                chunks -> RolloutSummary, rewards [P*G] in row order
    plan          replay/plan.py      host plan, then put on device            [hop: planning]
    gather        replay/gather.py    jitted: chunks concatenated, rows gathered; out_shardings
                                      = the batch's                            (device)
    update        train/state.py      jitted train step with losses.OrlObjective (device)

Phase times (`phase_seconds`, docs/training.md#verification-overlapped-with-decoding) come from
the loop's clock and a `phases.DeviceTimeline` of every device program's dispatch and
completion.

Everything but the named hops runs without host transfers (tested under
`jax.transfer_guard("disallow")`): the capture buffers never leave the device.

Iterations (the checkpoint step, the prompt stream, the rollout key) and optimizer updates
(`TrainState.step`, the learning-rate schedule) are counted separately; they differ by the
skipped iterations.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import operator
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from orl_jax.decode import build as decode_build
from orl_jax import distributed, sharding as sharding_lib
from orl_jax.config import derive as config_lib
from orl_jax.storage.checkpoint import Checkpointer, abstract_like, save_in_background
from orl_jax.data.pipeline import encode_prompts, prompt_dataset
from orl_jax.losses import OrlObjective
from orl_jax.replay import ReplayConfig, abstract_batch, build_plan, gather_batch
from orl_jax.metrics import tpf_explanation_once
from orl_jax.tasks import verifier_metrics
from orl_jax.models.decoded import Trajectories
from orl_jax.decode.trajectories import SegmentedRollout
from orl_jax.train.run import RunLog, finish_run, prepare_run, resume_with_extra
from orl_jax.setup.build import Setup
from orl_jax.train import interrupt
from orl_jax.train.phases import DeviceTimeline, VerifyCalls, busy_seconds
from orl_jax.train.state import Run, make_train_step

ENTROPY_STEPS = 8   # rollout_entropy_step{k} is logged for the first steps of every block


class RolloutLedger:
  """Counts updates per rollout id; on-policy means every count is exactly one."""

  def __init__(self):
    self.uses = collections.Counter()

  def consume(self, rollout_id: int):
    if self.uses[rollout_id]:
      raise RuntimeError(f"rollout {rollout_id} was already used for an update (off-policy reuse)")
    self.uses[rollout_id] += 1


def sharded_like(abstract, mesh):
  """Restore targets for a rollout snapshot: leading dimension over the data axes (as the
  rollout's prompts), scalars replicated."""
  rows, repl = sharding_lib.batch_sharding(mesh), sharding_lib.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=rows if x.ndim else repl),
                      abstract)


@contextlib.contextmanager
def host_hop(name: str):
  """A named point where an iteration moves data between host and device on purpose
  (prompts, verification, planning, logging, checkpoints); the rest of the iteration makes no
  host transfer, which a test checks under `jax.transfer_guard("disallow")`."""
  del name  # documents the hop at the call site
  with jax.transfer_guard("allow"):
    yield


# ------------------------------------------------------------------------------ typed steps

@dataclasses.dataclass
class Prompts:
  """One iteration's prompts as global device arrays split over the data axes."""
  ids: jax.Array       # [P] int32 problem ids
  tokens: jax.Array    # [P, Lp] int32 left-padded prompt tokens
  valid: jax.Array     # [P, Lp] bool
  rollout_key: jax.Array  # the sampling key of the iteration they were drawn for
  problems: dict = dataclasses.field(default_factory=dict)  # host: this process's, by id


@dataclasses.dataclass
class RolloutSummary:
  """What the host needs of a rollout: the arrays verification and planning read, and the
  rollout metrics (reduced on device; the capture buffers never leave it)."""
  prompt_ids: np.ndarray     # [P] problem ids
  prompt_valid: np.ndarray   # [P, Lp] bool of the prompts as the rollout read them
  responses: np.ndarray      # [P*G, N] int32 final tokens (EOS-filled)
  capture_valid: np.ndarray  # [P*G, S] bool captured states
  capture_block: np.ndarray  # [P*G, S] int32 block index of each state
  metrics: dict              # rollout_* and capture_overflow scalars


def rollout_sums(traj: Trajectories, mask_id: int, unresolved) -> dict:
  """Device-side reductions behind the rollout metrics (exact integer sums; entropy sums and
  counts over the unresolved positions — `Sampler.unresolved`: masked, or not accepted by the
  step — of the states of step k of a block, k < ENTROPY_STEPS)."""
  cap = traj.capture
  masked = unresolved(cap.block_tokens, cap.commit, mask_id)                   # [B, S, b]
  out = {"n_generated": jnp.sum(traj.n_generated), "nfe": jnp.sum(traj.nfe),
         "nfe_engine": jnp.sum(traj.nfe_engine), "overflow": jnp.sum(cap.overflow)}
  if traj.nfe_denoise is not None:
    out["nfe_denoise"] = jnp.sum(traj.nfe_denoise)
  for k in range(ENTROPY_STEPS):
    m = masked & (cap.valid & (cap.step == k))[..., None]
    out[f"entropy_sum{k}"] = jnp.sum(jnp.where(m, cap.entropy, 0.0))
    out[f"entropy_count{k}"] = jnp.sum(m)
  return out


def rollout_metrics(sums: dict, n_rollouts: int) -> dict:
  """The logged rollout metrics from `rollout_sums` (host scalars)."""
  n_gen, nfe, nfe_engine = (int(sums[k]) for k in ("n_generated", "nfe", "nfe_engine"))
  out = {"rollout_tpf": n_gen / max(nfe, 1), "rollout_tpf_engine": n_gen / max(nfe_engine, 1),
         "rollout_nfe": nfe / n_rollouts, "rollout_tokens": n_gen / n_rollouts,
         "capture_overflow": int(sums["overflow"]) / n_rollouts}
  if "nfe_denoise" in sums:   # the authors' TPF: denoising forwards only
    out["rollout_tpf_denoise"] = n_gen / max(int(sums["nfe_denoise"]), 1)
  for k in range(ENTROPY_STEPS):
    count = int(sums[f"entropy_count{k}"])
    if count:
      out[f"rollout_entropy_step{k}"] = float(np.float32(sums[f"entropy_sum{k}"])
                                              / np.float32(count))
  return out


def chunk_shape(o) -> tuple[int, int]:
  """(prompts, responses a prompt) of one rollout chunk of the `orl` section `o`: with
  `chunk_by="samples"` every chunk rolls out all P prompts, G / rollout_chunks responses each;
  with "prompts", P / rollout_chunks prompts with all G responses each."""
  k = o.rollout_chunks
  return (o.prompts_per_step, o.group_size // k) if o.chunk_by == "samples" else (
      o.prompts_per_step // k, o.group_size)


def chunk_prompts(tokens, valid, key, n_chunks: int, by: str) -> tuple:
  """The rollout's inputs in `n_chunks` chunks, in order: ((tokens, valid, key), ...); chunk c
  samples with fold_in(key, c). `by="prompts"`: chunk c holds prompts [c*P/n, (c+1)*P/n);
  "samples": every chunk holds all the prompts (and draws its share of their responses)."""
  if by == "samples":
    return tuple((tokens, valid, jax.random.fold_in(key, c)) for c in range(n_chunks))
  n = tokens.shape[0] // n_chunks
  return tuple((tokens[c * n:(c + 1) * n], valid[c * n:(c + 1) * n], jax.random.fold_in(key, c))
               for c in range(n_chunks))


def interleave_rows(parts, n_prompts: int, xp=jnp):
  """Response rows of `chunk_by="samples"` chunks in prompt-major order: K arrays of [P*g, ...]
  (chunk c: its g responses of each prompt) -> [P*K*g, ...], prompt p's rows being chunk 0's g,
  then chunk 1's, ... (`xp`: jnp on the device, np on the host)."""
  stacked = xp.stack(parts)                                         # [K, P*g, ...]
  k, rows = stacked.shape[:2]
  grouped = stacked.reshape((k, n_prompts, rows // n_prompts) + stacked.shape[2:])
  return xp.swapaxes(grouped, 0, 1).reshape((k * rows,) + stacked.shape[2:])


def concat_trajectories(trajs: tuple, by: str = "prompts") -> Trajectories:
  """The chunks' trajectories as one, rows in the unchunked rollout's order (prompt rows
  [P, ...], response rows [P*G, ...], row i of prompt i // G): "prompts" chunks concatenated
  (chunk order is row order); "samples" chunks' prompt rows are chunk 0's (every chunk read the
  same prompts) and their response rows interleaved (`interleave_rows`). The scalar
  `rollout_step` is the same in every chunk. Inside a jit this holds the chunks and their
  concatenation at once (the capture buffers twice) until the chunks are freed."""
  if len(trajs) == 1:
    return trajs[0]
  if by == "prompts":
    return jax.tree.map(lambda *xs: xs[0] if xs[0].ndim == 0 else jnp.concatenate(xs), *trajs)
  first, n_prompts = trajs[0], trajs[0].prompt_tokens.shape[0]
  rows = [dataclasses.replace(t, prompt_tokens=None, prompt_valid=None) for t in trajs]
  merged = jax.tree.map(lambda *xs: xs[0] if xs[0].ndim == 0 else interleave_rows(xs, n_prompts),
                        *rows)
  return dataclasses.replace(merged, prompt_tokens=first.prompt_tokens,
                             prompt_valid=first.prompt_valid)


def chunked_rollout(rollout_fn, n_chunks: int, by: str):
  """(params, tokens [P, Lp], valid, key, step) -> the iteration's Trajectories, every chunk's
  rollout concatenated: the shapes the gather and a rollout snapshot see (traced, never run:
  the loop dispatches the chunks one by one)."""
  def rollout_all(params, tokens, valid, key, step):
    parts = chunk_prompts(tokens, valid, key, n_chunks, by)
    return concat_trajectories(tuple(rollout_fn(params, t, v, k, step) for t, v, k in parts), by)
  return rollout_all


@dataclasses.dataclass
class OrlSteps:
  """The pieces of one iteration, built once before the loop (the jitted ones from abstract
  shapes), and what they share."""
  setup: Setup
  run: Run
  replay_cfg: ReplayConfig
  rollout: jax.stages.Wrapped   # (params, tokens, valid, key, rollout_step) -> Trajectories
  chunk: jax.stages.Wrapped     # (tokens, valid, key) -> `chunk_prompts`, rows over data axes
  concat: jax.stages.Wrapped    # (Trajectories, ...) -> Trajectories (the rollout snapshot)
  sums: jax.stages.Wrapped      # Trajectories -> rollout_sums, replicated
  gather: jax.stages.Wrapped    # ((Trajectories, ...), ReplayPlan) -> ReplayBatch, rows over data
  update: Callable         # (TrainState, ReplayBatch, base_key) -> (TrainState, metrics)
  plan_sharding: Any       # the plan's device placement (replicated)
  prompt_iter: Any
  base_key: jax.Array
  rollout_key: jax.Array
  ledger: RolloutLedger
  snapshots: Checkpointer | None
  verify_calls: VerifyCalls   # verification started without waiting (`VerifyCalls.submit`)
  segmented: SegmentedRollout | None   # the per-row rollout in segments (responses verified as
  #                                      their rows retire), or None: `rollout` in one program
  waiter: concurrent.futures.ThreadPoolExecutor   # observes device programs' completion
  copy_policy: jax.stages.Wrapped   # (params, step) -> a copy, sharded like the state's
  # orl.max_staleness=1: the next iteration's rollout, dispatched before this one's update
  ahead: InFlight | None = None

  def close(self) -> None:
    self.verify_calls.close()
    self.waiter.shutdown(wait=True)
    if self.snapshots is not None:
      self.snapshots.close()


def _abstract_batch(setup: Setup, run: Run, rollout_fn, replay_cfg: ReplayConfig, gather_fn):
  """Shapes of one replay batch, from the (chunked) rollout's and the plan's abstract shapes."""
  o, lp = setup.config.orl, setup.config.task.prompt_len
  p = o.prompts_per_step
  prompts = jax.ShapeDtypeStruct((p, lp), jnp.int32), jax.ShapeDtypeStruct((p, lp), jnp.bool_)
  traj = jax.eval_shape(chunked_rollout(rollout_fn, o.rollout_chunks, o.chunk_by),
                        run.state.params, *prompts, jax.random.key(0), run.state.step)
  return abstract_batch(traj, replay_cfg, gather_fn)


def _chunk_programs(setup: Setup):
  """The jitted prompt slicer (`chunk_prompts`) and trajectory concatenation, rows over the
  data axes."""
  rows, repl = sharding_lib.batch_sharding(setup.mesh), sharding_lib.replicated(setup.mesh)
  n_chunks, by = setup.config.orl.rollout_chunks, setup.config.orl.chunk_by
  chunk = jax.jit(lambda t, v, k: chunk_prompts(t, v, k, n_chunks, by),
                  out_shardings=tuple((rows, rows, repl) for _ in range(n_chunks)))
  concat_fn = lambda trajs: concat_trajectories(trajs, by)
  concat = jax.jit(lambda *trajs: jax.lax.with_sharding_constraint(
      concat_fn(trajs),
      jax.tree.map(lambda x: rows if x.ndim else repl, jax.eval_shape(concat_fn, trajs))))
  return chunk, concat


def build_orl_steps(setup: Setup, run: Run, prompt_iter) -> OrlSteps:
  """Jits rollout, gather and the train step once, before the first iteration."""
  config, tok = setup.config, setup.tokenizer
  o = config.orl
  sampler = decode_build.sampler_of(config, setup.model_cfg)
  rollout_fn = decode_build.make_decoder(config, setup.model_cfg, run.graphdef, "rollout",
                                     mask_id=tok.mask_id, eos_id=tok.eos_id,
                                     group_size=chunk_shape(o)[1], mesh=setup.mesh)
  unresolved = sampler.unresolved
  replay_cfg = config_lib.replay_config(
      config, sharding_lib.n_batch_shards(setup.mesh.shape), sampler.replay_context)
  rows, repl = sharding_lib.batch_sharding(setup.mesh), sharding_lib.replicated(setup.mesh)
  gather_fn = lambda traj, plan: gather_batch(traj, plan, mask_id=tok.mask_id,
                                              unresolved=unresolved)
  batch_sh = jax.tree.map(lambda x: rows if x.ndim >= 2 else repl,
                          _abstract_batch(setup, run, rollout_fn, replay_cfg, gather_fn))
  objective = OrlObjective(config_lib.loss_config(config))
  update = make_train_step(run.graphdef, run.optimizer, objective, setup.mesh,
                           run.state_shardings, batch_sh, micro_batches=replay_cfg.micro_batches)
  rollout_seed = o.rollout_seed if o.rollout_seed >= 0 else config.seed
  snapshots = None
  if config.checkpoint.save_rollouts:
    snapshots = Checkpointer(os.path.join(config.workdir, "rollouts"), every=1, keep=1)
  chunk, concat = _chunk_programs(setup)
  segmented = None
  # With orl.max_staleness=1 a rollout is dispatched ahead in one program (its verification
  # hides behind the next rollout's decoding instead).
  if o.verify_while_decoding and o.rollout_segment_iterations and not o.max_staleness:
    segmented = decode_build.segmented_rollout(
        config, setup.model_cfg, run.graphdef, mask_id=tok.mask_id, eos_id=tok.eos_id,
        group_size=chunk_shape(o)[1], mesh=setup.mesh, iterations=o.rollout_segment_iterations)
  return OrlSteps(
      setup=setup, run=run, replay_cfg=replay_cfg, rollout=rollout_fn, chunk=chunk,
      concat=concat,
      sums=jax.jit(lambda traj: rollout_sums(traj, tok.mask_id, unresolved),
                   out_shardings=repl),
      gather=jax.jit(lambda trajs, plan: gather_fn(concat_trajectories(trajs, o.chunk_by), plan),
                     out_shardings=batch_sh),
      update=update, plan_sharding=repl, prompt_iter=prompt_iter,
      base_key=jax.random.key(config.seed),
      rollout_key=jax.random.fold_in(jax.random.key(rollout_seed), 1),
      ledger=RolloutLedger(), snapshots=snapshots, verify_calls=VerifyCalls(setup.task.verifier),
      segmented=segmented,
      waiter=concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orl-device-waiter"),
      copy_policy=jax.jit(lambda params, step: jax.tree.map(jnp.copy, (params, step)),
                          out_shardings=(run.state_shardings.params, repl)))


def draw_prompts(steps: OrlSteps, it: int) -> Prompts:
  """This process's next prompts -> global [P, ...] arrays split over the data axes."""
  setup = steps.setup
  n_prompts = setup.config.orl.prompts_per_step
  with host_hop("prompts"):
    local_idx = np.asarray(next(steps.prompt_iter), np.int32)
    problems = {int(i): setup.task.train_problem(int(i)) for i in local_idx}
    local_pt, local_pv = encode_prompts([problems[int(i)] for i in local_idx], setup.tokenizer,
                                        setup.config.task.prompt_len)
    ids, tokens, valid = sharding_lib.shard_batch((local_idx, local_pt, local_pv), setup.mesh,
                                                  n_prompts)
    key = jax.random.fold_in(steps.rollout_key, it)
  return Prompts(ids, tokens, valid, key, problems)


def _chunks_of(steps: OrlSteps, prompts: Prompts, clock: DeviceTimeline) -> tuple:
  """((tokens, valid, key), ...) per chunk; one chunk is the prompts themselves (today's
  rollout: the same program and key)."""
  if steps.setup.config.orl.rollout_chunks == 1:
    return ((prompts.tokens, prompts.valid, prompts.rollout_key),)
  return clock.run("chunk", steps.chunk, prompts.tokens, prompts.valid, prompts.rollout_key)


def dispatch_rollouts(steps: OrlSteps, policy, prompts: Prompts, clock: DeviceTimeline):
  """(trajectories, rollout sums) per chunk, every chunk dispatched before any is read: the
  device decodes them one after another while the host goes on. Drawn with `policy.params`
  (the train state's: the current parameters; or a `Policy`), rollout_step = their version,
  `policy.step`."""
  trajs, sums = [], []
  for c, (tokens, valid, key) in enumerate(_chunks_of(steps, prompts, clock)):
    trajs.append(clock.run(f"rollout{c}", steps.rollout, policy.params, tokens, valid, key,
                           policy.step))
    sums.append(clock.run(f"sums{c}", steps.sums, trajs[-1]))
  return tuple(trajs), sums


def abstract_trajectories(steps: OrlSteps, policy, prompts: Prompts) -> Trajectories:
  """Shapes of the iteration's trajectories, the chunks concatenated (a rollout snapshot's)."""
  o = steps.setup.config.orl
  return jax.eval_shape(chunked_rollout(steps.rollout, o.rollout_chunks, o.chunk_by),
                        policy.params, prompts.tokens, prompts.valid, steps.rollout_key,
                        policy.step)


def restore_rollout(steps: OrlSteps, policy, prompts: Prompts, it: int):
  """(trajectories, rewards) of the snapshot saved for iteration `it` when the run was killed
  between rollout and update (`policy`: parameters of the rollout's shapes)."""
  o, mesh = steps.setup.config.orl, steps.setup.mesh
  assert steps.snapshots is not None   # restores only from a saved snapshot
  saved, _ = steps.snapshots.restore(it, {
      "traj": sharded_like(abstract_trajectories(steps, policy, prompts), mesh),
      "rewards": np.zeros((o.prompts_per_step * o.group_size,), np.float32),
      "prompt_ids": np.zeros((o.prompts_per_step,), np.int32)})
  if not np.array_equal(np.asarray(saved["prompt_ids"]), sharding_lib.to_host(prompts.ids)):
    raise RuntimeError(f"rollout snapshot of iteration {it} was drawn for other prompts; "
                       "delete the work directory's rollouts/ folder to re-roll")
  return saved["traj"], np.asarray(saved["rewards"])


def pull_chunk(traj: Trajectories, sums: dict, prompt_ids: np.ndarray) -> RolloutSummary:
  """A chunk's small arrays on the host (blocks until the chunk is decoded); `metrics` holds
  its raw `rollout_sums` until the chunks are combined. Every process gets the whole chunk."""
  with host_hop("verification"):
    host = sharding_lib.to_host({"valid": traj.prompt_valid, "responses": traj.responses,
                                 "cvalid": traj.capture.valid, "cblock": traj.capture.block,
                                 "sums": sums})
  return RolloutSummary(prompt_ids=prompt_ids, prompt_valid=host["valid"],
                        responses=host["responses"], capture_valid=host["cvalid"],
                        capture_block=host["cblock"], metrics=host["sums"])


def combine_rows(parts: list, n_prompts: int, by: str) -> np.ndarray:
  """The chunks' response rows (host arrays) in the unchunked rollout's prompt-major order."""
  if by == "samples" and len(parts) > 1:
    return interleave_rows(parts, n_prompts, xp=np)
  return np.concatenate(parts)


def combine_chunks(parts: list[RolloutSummary], by: str = "prompts") -> RolloutSummary:
  """The iteration's summary: the chunks' arrays in the unchunked rollout's order (`by`: the
  `orl.chunk_by` they were cut by), their rollout sums added (every entry of `rollout_sums` is
  a sum) and turned into the rollout metrics."""
  samples = by == "samples"
  prompts = lambda name: getattr(parts[0], name) if samples else np.concatenate(
      [getattr(p, name) for p in parts])
  ids = prompts("prompt_ids")
  rows = lambda name: combine_rows([getattr(p, name) for p in parts], len(ids), by)
  sums = {k: functools.reduce(operator.add, [p.metrics[k] for p in parts])
          for k in parts[0].metrics}
  responses = rows("responses")
  return RolloutSummary(prompt_ids=ids, prompt_valid=prompts("prompt_valid"),
                        responses=responses, capture_valid=rows("capture_valid"),
                        capture_block=rows("capture_block"),
                        metrics=rollout_metrics(sums, responses.shape[0]))


def verification_inputs(steps: OrlSteps, summary: RolloutSummary, known: dict,
                        indices: list[int]):
  """(problems, texts) of responses `indices` (of the summary's, prompt-major), a problem per
  response. `known`: the problems this process already built (`Prompts.problems`); only the
  other processes' prompts are read again."""
  g = len(summary.responses) // len(summary.prompt_ids)
  with host_hop("verification"):
    return _texts_and_problems(steps, summary.responses, np.repeat(summary.prompt_ids, g),
                               known, indices)


def chunk_problem_ids(o, ids: np.ndarray, c: int) -> np.ndarray:
  """The problem id of each response row of chunk `c` (`orl` section `o`; `ids` the
  iteration's prompts): "samples" chunks hold every prompt's G / K responses, "prompts" chunks
  P / K prompts' G each; a prompt's rows are adjacent."""
  n_prompts, group = chunk_shape(o)
  chunk_ids = ids if o.chunk_by == "samples" else ids[c * n_prompts:(c + 1) * n_prompts]
  return np.repeat(np.asarray(chunk_ids), group)


def _segmented_chunk(steps: OrlSteps, state, prompts: Prompts, ids: np.ndarray, c: int,
                     inputs: tuple, clock: DeviceTimeline):
  """Chunk `c`'s rollout in segments, each response going to the verifier (this process's
  share) as soon as a segment shows its row retired; the host reads a segment while the next
  one decodes. Returns (Trajectories, rollout sums, future of (scores in share order,
  seconds))."""
  seg = steps.segmented
  assert seg is not None
  tokens, valid, key = inputs
  rows_pid = chunk_problem_ids(steps.setup.config.orl, ids, c)
  mine = distributed.my_share(len(rows_pid))
  submitted = np.zeros(len(rows_pid), bool)
  calls: list = []   # (response indices, future of (scores, seconds))
  # The carry is donated to the next program: the timeline watches each segment's `Retired`
  # (the start program's time falls in the first segment's interval).
  carry = seg.start(state.params, tokens, valid, key)
  pending, i = None, 0
  while True:
    carry, retired = clock.run(f"rollout{c}_segment{i}", seg.advance, state.params, tokens,
                               valid, key, carry, watch=lambda out: out[1])
    if pending is not None:   # the segment before: read while this one decodes
      with host_hop("verification"):
        view = sharding_lib.to_host(pending)
      new = [j for j in mine if view.done[j] and not submitted[j]]
      if new:
        submitted[new] = True
        calls.append((new, steps.verify_calls.submit(
            *_texts_and_problems(steps, view.responses, rows_pid, prompts.problems, new))))
      if not view.active:
        break
    pending, i = retired, i + 1
  traj = clock.run(f"rollout{c}", seg.finish, state.params, tokens, valid, key, carry,
                   state.step)
  return traj, clock.run(f"sums{c}", steps.sums, traj), _joined(calls, mine)


def _texts_and_problems(steps: OrlSteps, responses: np.ndarray, rows_pid: np.ndarray,
                        known: dict, indices: list[int]):
  """(problems, texts) of response rows `indices` (host arrays), a problem per response."""
  setup, known, problems = steps.setup, dict(known), []
  texts = [setup.tokenizer.decode(responses[i], stop_at_eos=True) for i in indices]
  for i in indices:
    pid = int(rows_pid[i])
    if pid not in known:
      known[pid] = setup.task.train_problem(pid)
    problems.append(known[pid])
  return problems, texts


def _joined(calls: list, mine: list[int]) -> concurrent.futures.Future:
  """Future[(scores of `mine` in order, summed seconds)] of verification calls made on parts
  of `mine` ((indices, Future[(scores, seconds)]) each)."""
  out: concurrent.futures.Future = concurrent.futures.Future()
  if not calls:
    out.set_result(([], 0.0))
    return out
  left = [len(calls)]

  def done(_):
    left[0] -= 1
    if left[0]:
      return
    try:
      scores, seconds = {}, 0.0
      for indices, call in calls:
        part, took = call.result()
        scores.update(zip(indices, part))
        seconds += took
      out.set_result(([scores[j] for j in mine], seconds))
    except BaseException as error:  # pylint: disable=broad-except
      out.set_exception(error)

  for _, call in calls:
    call.add_done_callback(done)
  return out


def start_verify(steps: OrlSteps, summary: RolloutSummary, known: dict):
  """Future[(scores, seconds)] of this process's share (`distributed.my_share`) of a summary's
  responses; the loop goes on meanwhile. `gather_rewards` puts the shares together."""
  mine = distributed.my_share(len(summary.responses))
  return steps.verify_calls.submit(*verification_inputs(steps, summary, known, mine))


def gather_rewards(parts: list[RolloutSummary], results: list, by: str) -> np.ndarray:
  """[P*G] rewards in prompt-major order, the same on every process: each chunk's shares
  (`start_verify`'s scores) all-gathered in chunk order (a collective: every process calls it
  at the same point)."""
  with host_hop("verification"):
    chunks = [distributed.gather_shares(scores, len(part.responses))
              for part, (scores, _) in zip(parts, results)]
  return combine_rows(chunks, len(parts[0].prompt_ids), by)


@dataclasses.dataclass
class RolledOut:
  """An iteration's rollout and its verification, and their times."""
  trajs: tuple                   # the chunks' Trajectories, in row order
  summary: RolloutSummary
  rewards: np.ndarray            # [P*G]
  from_snapshot: bool
  seconds: dict                  # sec_rollout, sec_verify_exposed, sec_verify_host


@dataclasses.dataclass
class Policy:
  """The parameters a rollout is drawn with and their version (the optimizer updates applied
  to them; the rollout's `rollout_step`)."""
  params: Any
  step: jax.Array   # scalar int32


@dataclasses.dataclass
class InFlight:
  """With `orl.max_staleness=1`: iteration `it`'s rollout, dispatched during iteration `it - 1`
  before that iteration's update (docs/training.md#one-step-of-lag). A checkpoint taken
  meanwhile saves `policy` and the prompt stream at `stream_state`, so a resume draws the same
  rollout again (`save_checkpoint`)."""
  it: int
  policy: Policy       # a copy of the parameters it is drawn with (the update donates the state)
  stream_state: Any    # the prompt stream's position before its prompts were drawn
  lag: int             # optimizer updates applied since `policy` (its staleness)
  prompts: Prompts | None = None        # None with `started`: not dispatched yet (a resume's)
  started: Dispatched | None = None
  timeline: list = dataclasses.field(default_factory=list)   # its `DeviceTimeline` entries


def _pull_and_verify(steps: OrlSteps, trajs, sums, prompts: Prompts, t0: float):
  """(summary, rewards, seconds since the first dispatch at `t0`): each chunk's arrays pulled
  in order; with `orl.verify_while_decoding` its verification starts at once (while the device
  decodes the later chunks), else only once every chunk is on the host (all chunks submitted
  together: the verifier may run them side by side)."""
  o = steps.setup.config.orl
  with host_hop("verification"):
    ids = sharding_lib.to_host(prompts.ids)
  parts, calls = [], []
  for c, (traj, chunk_sums) in enumerate(zip(trajs, sums)):
    parts.append(pull_chunk(traj, chunk_sums, _chunk_prompt_ids(o, ids, c, len(trajs))))
    if o.verify_while_decoding:
      calls.append(start_verify(steps, parts[-1], prompts.problems))
  t1 = time.perf_counter()
  if not o.verify_while_decoding:
    calls = [start_verify(steps, part, prompts.problems) for part in parts]
  return _rewarded(parts, calls, o.chunk_by, t0, t1)


def _chunk_prompt_ids(o, ids: np.ndarray, c: int, chunks: int) -> np.ndarray:
  """The prompt ids of chunk `c` of `chunks`: a "samples" chunk holds every prompt, a
  "prompts" chunk its share of them."""
  per = len(ids) // chunks
  return ids if o.chunk_by == "samples" else ids[c * per:(c + 1) * per]


def _rewarded(parts: list[RolloutSummary], calls: list, by: str, t0: float, t1: float):
  """(summary, rewards, seconds) once the chunks' verification `calls` (futures of (scores,
  seconds)) are done: the rollout ran from `t0` to `t1`, the rest is verification the loop
  waited for."""
  results = [call.result() for call in calls]
  rewards = gather_rewards(parts, results, by)
  seconds = dict(sec_rollout=t1 - t0, sec_verify_exposed=time.perf_counter() - t1,
                 sec_verify_host=sum(s for _, s in results))
  return combine_chunks(parts, by), rewards, seconds


@dataclasses.dataclass
class Dispatched:
  """A rollout on its way: the chunks' trajectories and rollout sums (device), dispatched from
  `t0` on (the loop's clock)."""
  trajs: tuple
  sums: list
  t0: float


def start_rollout(steps: OrlSteps, policy, prompts: Prompts, it: int,
                  clock: DeviceTimeline) -> Dispatched | RolledOut:
  """Iteration `it`'s rollout drawn with `policy` (`.params`, and `.step`: their version)
  dispatched; or, when the run was killed between rollout and update, the snapshot saved for
  this iteration with its rewards."""
  t0 = time.perf_counter()
  # a snapshot write still in flight is an earlier iteration's: it is never the one restored
  if steps.snapshots is not None and steps.snapshots.latest_step() == it:
    with host_hop("checkpoint"):
      traj, rewards = restore_rollout(steps, policy, prompts, it)
    with host_hop("verification"):
      ids = sharding_lib.to_host(prompts.ids)
    summary = combine_chunks([pull_chunk(traj, clock.run("sums0", steps.sums, traj), ids)])
    seconds = dict(sec_rollout=time.perf_counter() - t0, sec_verify_exposed=0.0,
                   sec_verify_host=0.0)
    return RolledOut((traj,), summary, rewards, True, seconds)
  if steps.segmented is not None:   # verified as rows retire: done once this returns
    summary, rewards, trajs, seconds = _segmented_rollout(steps, policy, prompts, clock, t0)
    return RolledOut(trajs, summary, rewards, False, seconds)
  trajs, sums = dispatch_rollouts(steps, policy, prompts, clock)
  return Dispatched(trajs, sums, t0)


def finish_rollout(steps: OrlSteps, started: Dispatched | RolledOut,
                   prompts: Prompts) -> RolledOut:
  """A started rollout's chunks pulled and verified (`_pull_and_verify`)."""
  if isinstance(started, RolledOut):
    return started
  summary, rewards, seconds = _pull_and_verify(steps, started.trajs, started.sums, prompts,
                                               started.t0)
  return RolledOut(started.trajs, summary, rewards, False, seconds)


def rollout_and_verify(steps: OrlSteps, state, prompts: Prompts, it: int,
                       clock: DeviceTimeline) -> RolledOut:
  """The rollout chunks drawn with the current parameters and their rewards; or the snapshot
  saved for this iteration with its rewards when the run was killed between rollout and
  update."""
  return finish_rollout(steps, start_rollout(steps, state, prompts, it, clock), prompts)


def _segmented_rollout(steps: OrlSteps, state, prompts: Prompts, clock: DeviceTimeline,
                       t0: float):
  """(summary, rewards, trajectories, seconds) of the per-row rollout in segments: each chunk's
  segments in turn, its responses verified as their rows retire."""
  o = steps.setup.config.orl
  with host_hop("verification"):
    ids = sharding_lib.to_host(prompts.ids)
  trajs, parts, calls = [], [], []
  for c, inputs in enumerate(_chunks_of(steps, prompts, clock)):
    traj, chunk_sums, call = _segmented_chunk(steps, state, prompts, ids, c, inputs, clock)
    trajs.append(traj)
    calls.append(call)
    parts.append(pull_chunk(traj, chunk_sums, _chunk_prompt_ids(o, ids, c, o.rollout_chunks)))
  summary, rewards, seconds = _rewarded(parts, calls, o.chunk_by, t0, time.perf_counter())
  return summary, rewards, tuple(trajs), seconds


def plan(steps: OrlSteps, summary: RolloutSummary, verified: np.ndarray, it: int):
  """(replay plan on the device, packing stats): the verified responses' states in rows."""
  config = steps.setup.config
  with host_hop("planning"):
    replay_plan, stats = build_plan(
        prompt_valid=summary.prompt_valid, capture_valid=summary.capture_valid,
        capture_block=summary.capture_block, eligible=verified,
        group_size=config.orl.group_size,
        cfg=steps.replay_cfg, rng=np.random.default_rng([config.seed, it]))
    return jax.device_put(replay_plan, steps.plan_sharding), stats


def snapshot(steps: OrlSteps, it: int, rolled: RolledOut) -> dict[str, float]:
  """Saves iteration `it`'s rollout snapshot (`checkpoint.save_rollouts`: the chunks
  concatenated, the rewards) and returns while it is written (planning, gather and the update
  go on; the next snapshot, a restore and the loop's close wait for it):
  {sec_snapshot_wait, sec_snapshot_blocking} ({} when off or restored from one)."""
  if steps.snapshots is None or rolled.from_snapshot:
    return {}
  with host_hop("checkpoint"):
    traj = rolled.trajs[0] if len(rolled.trajs) == 1 else steps.concat(*rolled.trajs)
    seconds = save_in_background(steps.snapshots, it, {
        "traj": traj, "rewards": rolled.rewards, "prompt_ids": rolled.summary.prompt_ids})
  return {f"sec_snapshot_{k[len('sec_'):]}": v for k, v in seconds.items()}


@dataclasses.dataclass
class IterationRecord:
  """What an iteration leaves for its log line."""
  summary: RolloutSummary
  rewards: np.ndarray
  verified: np.ndarray
  from_snapshot: bool
  metrics: dict                  # the train step's (empty when no update was taken)
  plan_stats: dict
  seconds: dict                  # `phase_seconds`
  staleness: int | None = None   # updates between the rollout's parameters and the update's
                                 # (logged with orl.max_staleness=1; 0 by construction else)


def train_on(steps: OrlSteps, state, rolled: RolledOut, verified: np.ndarray, it: int,
             clock: DeviceTimeline):
  """(state, train-step metrics, packing stats, planning seconds): plan -> gather -> update on
  the verified responses; no optimizer step (no moment change) when none verified."""
  if not verified.any():
    rolled.trajs = ()   # discard
    return state, {}, {}, 0.0
  t0 = time.perf_counter()
  replay_plan, stats = plan(steps, rolled.summary, verified, it)
  plan_s = time.perf_counter() - t0
  batch = clock.run("gather", steps.gather, rolled.trajs, replay_plan)
  rolled.trajs = ()   # discard: nothing is kept across updates
  state, metrics = clock.run("update", steps.update, state, batch, steps.base_key)
  jax.block_until_ready(metrics)
  return state, metrics, stats, plan_s


def phase_seconds(rolled: RolledOut, clock: DeviceTimeline, window: tuple[float, float],
                  plan_s: float, checkpoint_s: float) -> dict:
  """The logged phase times (docs/training.md#verification-overlapped-with-decoding).
  `window`: the iteration's [start, end] on the loop's thread; `checkpoint_s`: its time in
  checkpoints (idle device), counted into the iteration."""
  programs = {name: (a, b) for name, a, b in clock.intervals()}
  gather, update = programs.get("gather"), programs.get("update")
  iteration = window[1] - window[0] + checkpoint_s
  busy = busy_seconds(programs.values(), *window)
  return dict(rolled.seconds, sec_plan=plan_s,
              sec_gather=gather[1] - gather[0] if gather else 0.0,
              sec_update=update[1] - max(update[0], gather[1]) if update and gather else 0.0,
              sec_checkpoint=checkpoint_s, sec_iteration=iteration,
              device_busy=busy / iteration if iteration > 0 else 0.0)


def orl_iteration(steps: OrlSteps, state, it: int, *, checkpoint_s: float = 0.0):
  """rollout (+ verify) -> plan -> gather -> update; returns (state, IterationRecord).
  `checkpoint_s`: the loop's checkpoint time just before this iteration (logged with it)."""
  clock, t0 = DeviceTimeline(steps.waiter), time.perf_counter()
  prompts = draw_prompts(steps, it)
  rolled = rollout_and_verify(steps, state, prompts, it, clock)
  return update_on(steps, state, it, rolled, clock, t0, checkpoint_s)


def update_on(steps: OrlSteps, state, it: int, rolled: RolledOut, clock: DeviceTimeline,
              t0: float, checkpoint_s: float):
  """The rest of iteration `it` (begun at `t0`) once its rollout is verified: snapshot ->
  ledger -> plan -> gather -> update; returns (state, IterationRecord)."""
  rolled.seconds.update(snapshot(steps, it, rolled))
  checkpoint_s += rolled.seconds.get("sec_snapshot_wait", 0.0)
  checkpoint_s += rolled.seconds.get("sec_snapshot_blocking", 0.0)
  verified = rolled.rewards >= steps.setup.config.orl.min_reward
  steps.ledger.consume(it)
  state, metrics, stats, plan_s = train_on(steps, state, rolled, verified, it, clock)
  seconds = phase_seconds(rolled, clock, (t0, time.perf_counter()), plan_s, checkpoint_s)
  return state, IterationRecord(rolled.summary, rolled.rewards, verified, rolled.from_snapshot,
                                metrics, stats, seconds)


def dispatch_ahead(steps: OrlSteps, state, it: int, clock: DeviceTimeline) -> InFlight:
  """Iteration `it`'s rollout dispatched now, drawn with a copy of the current parameters (the
  coming update donates them): the device decodes it while the host verifies the rollout before
  it. Its programs are also entered in `clock` (as `next_*`), the iteration they run in."""
  t0, stream_state = time.perf_counter(), steps.prompt_iter.get_state()
  prompts = draw_prompts(steps, it)
  own = DeviceTimeline(steps.waiter)
  policy = Policy(*own.run("policy_copy", steps.copy_policy, state.params, state.step))
  trajs, sums = dispatch_rollouts(steps, policy, prompts, own)
  started = Dispatched(trajs, sums, t0)
  clock.pending.extend((f"next_{name}", a, done) for name, a, done in own.pending)
  return InFlight(it, policy, stream_state, 0, prompts, started, own.pending)


def lagged_iteration(steps: OrlSteps, state, it: int, *, checkpoint_s: float = 0.0):
  """`orl_iteration` with `orl.max_staleness=1` (docs/training.md#one-step-of-lag): the
  rollout of `it` (in flight since the iteration before; dispatched now on a run's first
  iteration and after a resume) -> the rollout of `it + 1` dispatched with the current
  parameters -> verify -> plan -> gather -> update. The update replays states drawn one update
  earlier (0 on the first iteration, or after one that took no update); returns (state,
  IterationRecord)."""
  clock, t0 = DeviceTimeline(steps.waiter), time.perf_counter()
  current = steps.ahead or InFlight(it, Policy(state.params, state.step), None, 0)
  assert current.it == it, f"the rollout in flight is iteration {current.it}'s, not {it}'s"
  started: Dispatched | RolledOut
  if current.started is None:
    current.prompts = draw_prompts(steps, it)
    started = start_rollout(steps, current.policy, current.prompts, it, clock)
  else:
    started = current.started
    clock.pending.extend(current.timeline)
  assert current.prompts is not None
  steps.ahead = None   # the next is dispatched before this one is verified; not after the last
  if it + 1 < steps.setup.config.train.steps:
    steps.ahead = dispatch_ahead(steps, state, it + 1, clock)
  rolled = finish_rollout(steps, started, current.prompts)
  state, record = update_on(steps, state, it, rolled, clock, t0, checkpoint_s)
  if record.metrics and steps.ahead is not None:
    steps.ahead.lag += 1
  record.staleness = current.lag
  return state, record


def save_checkpoint(ckpt: Checkpointer, steps: OrlSteps, it: int, state) -> None:
  """Checkpoint `it`: the state and the prompt stream; with a rollout in flight
  (`orl.max_staleness=1`) also the parameters it is drawn with (the `extra` item), the stream
  put back before its prompts: a resume draws it again (`resumed_in_flight`), the same bits."""
  ahead = steps.ahead
  if ahead is None:
    ckpt.save(it, state, steps.prompt_iter)
    return
  now = steps.prompt_iter.get_state()
  steps.prompt_iter.set_state(ahead.stream_state)
  try:
    ckpt.save(it, state, steps.prompt_iter, {"params": ahead.policy.params,
                                             "step": ahead.policy.step})
  finally:
    steps.prompt_iter.set_state(now)


def abstract_in_flight(run: Run) -> dict:
  """Restore targets of a checkpoint's `extra` item (`save_checkpoint`)."""
  return {"params": abstract_like(run.state.params), "step": abstract_like(run.state.step)}


def resumed_in_flight(steps: OrlSteps, state, start: int, extra: dict) -> InFlight:
  """The rollout in flight when checkpoint `start` was saved, to be dispatched again with the
  parameters it saved (`extra`); the prompt stream is already at its prompts."""
  with host_hop("checkpoint"):
    lag = int(state.step) - int(extra["step"])
  return InFlight(start, Policy(extra["params"], extra["step"]),
                  steps.prompt_iter.get_state(), lag)


def log_iteration(steps: OrlSteps, log: RunLog, state, it: int, rec: IterationRecord) -> None:
  """Writes the metrics of iteration `it` (1-based: the iterations done)."""
  with host_hop("logging"):
    updates = int(state.step)
    lag = {} if rec.staleness is None else {"staleness": rec.staleness}
    extra = dict(rollout_id=it - 1, rollout_from_snapshot=float(rec.from_snapshot), **lag,
                 rollout_uses=steps.ledger.uses[it - 1], reward=rec.rewards.mean(),
                 responses_verified=rec.verified.sum(), updates=updates,
                 updates_skipped=it - updates, **rec.summary.metrics, **rec.seconds,
                 **rec.plan_stats, **verifier_metrics(steps.setup.task.verifier))
    scalars = log.write(it, dict(rec.metrics, **extra))
    log.bar.set_postfix_str(progress_text(scalars, rec.metrics, updates, it))


def progress_text(scalars: dict, step_metrics: dict, updates: int, it: int) -> str:
  """The bar's postfix: reward, rollout TPF, the loss of this iteration's update -- or that it
  took none because no response verified --, the updates applied so far and the share of the
  iteration the device had no work queued (1 - device_busy)."""
  loss = (f"loss={scalars['loss']:.3f}" if step_metrics
          else "no response verified: update skipped")
  idle = (f", idle={1 - scalars['device_busy']:.0%}" if "device_busy" in scalars else "")
  return (f"reward={scalars['reward']:.2f}, tpf={scalars['rollout_tpf']:.2f}, {loss}, "
          f"updates applied={updates}/{it}{idle}")


def prompt_stream(setup: Setup):
  """The iterator of this process's problem ids, `orl.prompts_per_step` per iteration
  (checkpointed with the state)."""
  n_prompts = setup.config.orl.prompts_per_step
  return iter(prompt_dataset(setup.task.train_problem, batch_size=n_prompts,
                             rows=sharding_lib.process_rows(setup.mesh, n_prompts),
                             shuffle_seed=setup.config.train.shuffle_seed))


def train_orl(setup: Setup, *, progress=True, stop_after=None) -> str:
  """Runs ORL to `train.steps` iterations, resuming from the work directory's checkpoint."""
  run = prepare_run(setup)
  assert run.ckpt is not None   # `prepare_run` opens it
  prompt_iter = prompt_stream(setup)
  lagged = setup.config.orl.max_staleness > 0
  state, start, in_flight = resume_with_extra(run, prompt_iter,
                                              abstract_in_flight(run) if lagged else None)
  steps = build_orl_steps(setup, run, prompt_iter)
  if in_flight is not None:
    steps.ahead = resumed_in_flight(steps, state, start, in_flight)
  iteration = lagged_iteration if lagged else orl_iteration
  log = RunLog(setup, start, "orl", progress=progress, stop_after=stop_after)
  explained = None if log.bar.disable else tpf_explanation_once("orl: the bar's tpf is the "
                                                                 "rollout's; ")
  if explained:
    log.bar.write(explained, file=sys.stderr)
  ckpt = run.ckpt

  def close():
    log.close()
    steps.close()

  with interrupt.training_loop(ckpt, start, log.last) as stops:
    it = start   # iterations done (= checkpoint step); state.step counts optimizer updates
    checkpoint_s = 0.0   # the last checkpoint's time on this thread, logged with the next row
    while it < log.last:
      with host_hop("checkpoint"):   # a stop saves here; several processes agree on it
        stops.check(it, state, prompt_iter, close=close,
                    save=functools.partial(save_checkpoint, ckpt, steps, state=state))
      state, record = iteration(steps, state, it, checkpoint_s=checkpoint_s)
      it += 1
      if log.due(it):
        log_iteration(steps, log, state, it, record)
      t_save, checkpoint_s = time.perf_counter(), 0.0
      if ckpt.should_save(it, final=it == log.last):
        with host_hop("checkpoint"):
          save_checkpoint(ckpt, steps, it, state)
        checkpoint_s = time.perf_counter() - t_save
    close()
    return finish_run(setup, run, state, it)
