"""The on-policy loop (docs/method.md#the-on-policy-loop): rollout -> verify -> plan -> gather ->
update -> discard.

Each iteration draws fresh prompts, rolls out `G` responses per prompt with the *current*
parameters (capturing every denoising state), verifies them, packs the verified responses'
states into staircase rows and takes exactly one optimizer step on them (accumulated over
`replay.micro_batches` row micro-batches). An iteration with no verified response takes no
step (no moment changes either) and is counted in `updates_skipped`. Trajectories are never
reused: a ledger counts how many updates consumed each rollout, and the jitted step reports the
policy lag (updates applied since the parameters the rollout was drawn with), which must be 0.

One iteration, step by step (`orl_iteration`), with the module that owns each step:

    draw_prompts  data/pipeline.py    host -> device: this process's prompts  [hop: prompts]
    rollout       rollout.py          jitted decode with capture -> Trajectories (device)
    summarize     here                device-side metrics; small arrays to host [hop: verification]
    verify        verify/, tasks.py   decoded responses -> rewards [P*G]       [hop: verification]
    plan          replay/plan.py      host plan, then put on device            [hop: planning]
    gather        replay/gather.py    jitted, out_shardings = the batch's      (device)
    update        train/state.py      jitted train step with losses.OrlObjective (device)

Everything but the named hops runs without host transfers (tested under
`jax.transfer_guard("disallow")`): the capture buffers never leave the device.

Iterations (the checkpoint step, the prompt stream, the rollout key) and optimizer updates
(`TrainState.step`, the learning-rate schedule) are counted separately; they differ by the
skipped iterations.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from orl_jax.decode import build as decode_build
from orl_jax.decode.capture import masked_positions
from orl_jax import config as config_lib, distributed, sharding as sharding_lib
from orl_jax.checkpoint import Checkpointer, save_in_background
from orl_jax.data.pipeline import encode_prompts, prompt_dataset
from orl_jax.losses import OrlObjective
from orl_jax.replay import ReplayConfig, abstract_batch, build_plan, gather_batch
from orl_jax.metrics import TPF_COUNT
from orl_jax.tasks import verifier_metrics
from orl_jax.decode.types import Trajectories
from orl_jax.train.setup import Run, RunLog, Setup, finish_run, prepare_run, resume
from orl_jax.train import interrupt
from orl_jax.train.state import make_train_step

ENTROPY_STEPS = 8   # rollout_entropy_step{k} is logged for the first steps of every block


class RolloutLedger:
  """Counts updates per rollout id; on-policy means every count is exactly one."""

  def __init__(self):
    self.uses = collections.Counter()

  def consume(self, rollout_id: int):
    if self.uses[rollout_id]:
      raise RuntimeError(f"rollout {rollout_id} was already used for an update (off-policy reuse)")
    self.uses[rollout_id] += 1


class SimulatedCrash(RuntimeError):
  """Raised by tests to emulate a kill at a chosen point of an iteration."""


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


def rollout_sums(traj: Trajectories, mask_id: int, unresolved=masked_positions) -> dict:
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


@dataclasses.dataclass
class OrlSteps:
  """The pieces of one iteration, built once before the loop (the jitted ones from abstract
  shapes), and what they share."""
  setup: Setup
  run: Run
  replay_cfg: ReplayConfig
  rollout: jax.stages.Wrapped   # (params, tokens, valid, key, rollout_step) -> Trajectories
  sums: jax.stages.Wrapped      # Trajectories -> rollout_sums, replicated
  gather: jax.stages.Wrapped    # (Trajectories, ReplayPlan) -> ReplayBatch, rows over data axes
  update: Callable         # (TrainState, ReplayBatch, base_key) -> (TrainState, metrics)
  plan_sharding: Any       # the plan's device placement (replicated)
  prompt_iter: Any
  base_key: jax.Array
  rollout_key: jax.Array
  ledger: RolloutLedger
  snapshots: Checkpointer | None


def _abstract_batch(setup: Setup, run: Run, rollout_fn, replay_cfg: ReplayConfig, gather_fn):
  """Shapes of one replay batch, from the rollout's and the plan's abstract shapes."""
  p, lp = setup.config.orl.prompts_per_step, setup.config.task.prompt_len
  prompts = jax.ShapeDtypeStruct((p, lp), jnp.int32), jax.ShapeDtypeStruct((p, lp), jnp.bool_)
  traj = jax.eval_shape(rollout_fn, run.state.params, *prompts, jax.random.key(0),
                        run.state.step)
  return abstract_batch(traj, replay_cfg, gather_fn)


def build_orl_steps(setup: Setup, run: Run, prompt_iter) -> OrlSteps:
  """Jits rollout, gather and the train step once, before the first iteration."""
  config, tok = setup.config, setup.tokenizer
  o = config.orl
  sampler = decode_build.sampler_of(config, setup.model_cfg)
  rollout_fn = decode_build.make_decoder(config, setup.model_cfg, run.graphdef, "rollout",
                                     mask_id=tok.mask_id, eos_id=tok.eos_id,
                                     group_size=o.group_size, mesh=setup.mesh)
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
  return OrlSteps(
      setup=setup, run=run, replay_cfg=replay_cfg, rollout=rollout_fn,
      sums=jax.jit(lambda traj: rollout_sums(traj, tok.mask_id, unresolved),
                   out_shardings=repl),
      gather=jax.jit(gather_fn, out_shardings=batch_sh), update=update,
      plan_sharding=repl, prompt_iter=prompt_iter, base_key=jax.random.key(config.seed),
      rollout_key=jax.random.fold_in(jax.random.key(rollout_seed), 1),
      ledger=RolloutLedger(), snapshots=snapshots)


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


def rollout(steps: OrlSteps, state, prompts: Prompts, it: int):
  """(trajectories, rewards or None): drawn with the current parameters (rollout_step = their
  version, state.step), or the snapshot saved for this iteration with its rewards when the run
  was killed between rollout and update."""
  # a snapshot write still in flight is an earlier iteration's: it is never the one restored
  if steps.snapshots is not None and steps.snapshots.latest_step() == it:
    with host_hop("checkpoint"):
      return _restore_rollout(steps, state, prompts, it)
  return steps.rollout(state.params, prompts.tokens, prompts.valid, prompts.rollout_key,
                       state.step), None


def _restore_rollout(steps: OrlSteps, state, prompts: Prompts, it: int):
  o, mesh = steps.setup.config.orl, steps.setup.mesh
  assert steps.snapshots is not None   # `rollout` restores only from a saved snapshot
  abstract = jax.eval_shape(steps.rollout, state.params, prompts.tokens, prompts.valid,
                            steps.rollout_key, state.step)
  saved, _ = steps.snapshots.restore(it, {
      "traj": sharded_like(abstract, mesh),
      "rewards": np.zeros((o.prompts_per_step * o.group_size,), np.float32),
      "prompt_ids": np.zeros((o.prompts_per_step,), np.int32)})
  if not np.array_equal(np.asarray(saved["prompt_ids"]), sharding_lib.to_host(prompts.ids)):
    raise RuntimeError(f"rollout snapshot of iteration {it} was drawn for other prompts; "
                       "delete the work directory's rollouts/ folder to re-roll")
  return saved["traj"], np.asarray(saved["rewards"])


def summarize(steps: OrlSteps, traj: Trajectories, prompts: Prompts) -> RolloutSummary:
  """Every process gets the whole batch's small arrays, so all build the same replay plan."""
  sums = steps.sums(traj)
  with host_hop("verification"):
    host = sharding_lib.to_host({"ids": prompts.ids, "valid": traj.prompt_valid,
                                 "responses": traj.responses, "cvalid": traj.capture.valid,
                                 "cblock": traj.capture.block, "sums": sums})
  return RolloutSummary(prompt_ids=host["ids"], prompt_valid=host["valid"],
                        responses=host["responses"], capture_valid=host["cvalid"],
                        capture_block=host["cblock"],
                        metrics=rollout_metrics(host["sums"], host["responses"].shape[0]))


def verify(steps: OrlSteps, summary: RolloutSummary, known: dict | None = None) -> np.ndarray:
  """[P*G] rewards of the decoded responses, the same on every process: each process decodes
  and scores its share (`distributed.shared_scores`) and the shares are gathered. `known`: the
  problems this process already built (`Prompts.problems`); others are read again."""
  setup = steps.setup
  with host_hop("verification"):
    return distributed.shared_scores(
        functools.partial(score_responses, setup, summary, dict(known or {})),
        len(summary.responses))


def score_responses(setup: Setup, summary: RolloutSummary, known: dict,
                    indices: list[int]) -> list[float]:
  """The verifier's scores of responses `indices` (of the [P*G], prompt-major)."""
  g = setup.config.orl.group_size
  texts = [setup.tokenizer.decode(summary.responses[i], stop_at_eos=True) for i in indices]
  problems = []
  for i in indices:
    pid = int(summary.prompt_ids[i // g])
    if pid not in known:
      known[pid] = setup.task.train_problem(pid)
    problems.append(known[pid])
  return setup.task.verifier.score_batch(problems, texts)


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


def snapshot(steps: OrlSteps, it: int, traj: Trajectories, rewards: np.ndarray,
             summary: RolloutSummary) -> dict[str, float]:
  """Saves iteration `it`'s rollout snapshot (`checkpoint.save_rollouts`) and returns while it
  is written (planning, gather and the update go on; the next snapshot, a restore and the
  loop's close wait for it): {sec_snapshot_wait, sec_snapshot_blocking} ({} when off)."""
  if steps.snapshots is None:
    return {}
  with host_hop("checkpoint"):
    seconds = save_in_background(steps.snapshots, it, {
        "traj": traj, "rewards": rewards, "prompt_ids": summary.prompt_ids})
  return {f"sec_snapshot_{k[len('sec_'):]}": v for k, v in seconds.items()}


def crash(steps: OrlSteps, it: int):
  """The tests' kill between rollout and update, after the snapshot is written (a kill
  during its write is a real SIGKILL: tests/test_snapshot_kill.py)."""
  if steps.snapshots is not None:
    steps.snapshots.wait()
  raise SimulatedCrash(f"simulated kill between rollout and update at iteration {it}")


@dataclasses.dataclass
class IterationRecord:
  """What an iteration leaves for its log line."""
  summary: RolloutSummary
  rewards: np.ndarray
  verified: np.ndarray
  from_snapshot: bool
  metrics: dict                  # the train step's (empty when no update was taken)
  plan_stats: dict
  seconds: dict


def orl_iteration(steps: OrlSteps, state, it: int, *, crash_before_update_at=None):
  """rollout -> verify -> plan -> gather -> update; returns (state, IterationRecord)."""
  t0 = time.perf_counter()
  prompts = draw_prompts(steps, it)
  traj, rewards = rollout(steps, state, prompts, it)
  summary = summarize(steps, traj, prompts)
  from_snapshot, t1 = rewards is not None, time.perf_counter()
  snapshot_seconds = {}
  if not from_snapshot:
    rewards = verify(steps, summary, prompts.problems)
    snapshot_seconds = snapshot(steps, it, traj, rewards, summary)
  t2 = time.perf_counter()
  if crash_before_update_at == it:
    crash(steps, it)
  verified = rewards >= steps.setup.config.orl.min_reward
  metrics, stats, t3 = {}, {}, time.perf_counter()
  steps.ledger.consume(it)
  if verified.any():
    replay_plan, stats = plan(steps, summary, verified, it)
    batch = steps.gather(traj, replay_plan)
    del traj  # discard: nothing is kept across updates
    t3 = time.perf_counter()
    state, metrics = steps.update(state, batch, steps.base_key)
    jax.block_until_ready(metrics)
  else:   # nothing verified: no optimizer step, no moment change
    del traj
  seconds = dict(sec_rollout=t1 - t0, sec_verify=t2 - t1, sec_pack=t3 - t2,
                 sec_update=time.perf_counter() - t3 if metrics else 0.0, **snapshot_seconds)
  return state, IterationRecord(summary, rewards, verified, from_snapshot, metrics, stats,
                                seconds)


def log_iteration(steps: OrlSteps, log: RunLog, state, it: int, rec: IterationRecord) -> None:
  """Writes the metrics of iteration `it` (1-based: the iterations done)."""
  with host_hop("logging"):
    updates = int(state.step)
    extra = dict(rollout_id=it - 1, rollout_from_snapshot=float(rec.from_snapshot),
                 rollout_uses=steps.ledger.uses[it - 1], reward=rec.rewards.mean(),
                 responses_verified=rec.verified.sum(), updates=updates,
                 updates_skipped=it - updates, **rec.summary.metrics, **rec.seconds,
                 **rec.plan_stats, **verifier_metrics(steps.setup.task.verifier))
    scalars = log.write(it, dict(rec.metrics, **extra))
    log.bar.set_postfix_str(progress_text(scalars, rec.metrics, updates, it))


def progress_text(scalars: dict, step_metrics: dict, updates: int, it: int) -> str:
  """The bar's postfix: reward, rollout TPF, the loss of this iteration's update -- or that it
  took none because no response verified -- and the updates applied so far."""
  loss = (f"loss={scalars['loss']:.3f}" if step_metrics
          else "no response verified: update skipped")
  return (f"reward={scalars['reward']:.2f}, tpf={scalars['rollout_tpf']:.2f}, {loss}, "
          f"updates applied={updates}/{it}")


def prompt_stream(setup: Setup):
  """The iterator of this process's problem ids, `orl.prompts_per_step` per iteration
  (checkpointed with the state)."""
  n_prompts = setup.config.orl.prompts_per_step
  return iter(prompt_dataset(setup.task.train_problem, batch_size=n_prompts,
                             rows=sharding_lib.process_rows(setup.mesh, n_prompts),
                             shuffle_seed=setup.config.train.shuffle_seed))


def train_orl(setup: Setup, *, progress=True, stop_after=None, crash_before_update_at=None) -> str:
  """Runs ORL to `train.steps` iterations, resuming from the work directory's checkpoint."""
  run = prepare_run(setup)
  assert run.ckpt is not None   # `prepare_run` opens it
  prompt_iter = prompt_stream(setup)
  state, start = resume(run, prompt_iter)
  steps = build_orl_steps(setup, run, prompt_iter)
  log = RunLog(setup, start, "orl", progress=progress, stop_after=stop_after)
  if not log.bar.disable:
    log.bar.write(f"orl: the bar's tpf is the rollout's; {TPF_COUNT}", file=sys.stderr)
  ckpt = run.ckpt

  def close():
    log.close()
    if steps.snapshots is not None:
      steps.snapshots.close()

  with interrupt.training_loop(ckpt, start, log.last) as stops:
    it = start   # iterations done (= checkpoint step); state.step counts optimizer updates
    while it < log.last:
      with host_hop("checkpoint"):   # a stop saves here; several processes agree on it
        stops.check(it, state, prompt_iter, close=close)
      state, record = orl_iteration(steps, state, it,
                                    crash_before_update_at=crash_before_update_at)
      it += 1
      if log.due(it):
        log_iteration(steps, log, state, it, record)
      if ckpt.should_save(it, final=it == log.last):
        with host_hop("checkpoint"):
          ckpt.save(it, state, prompt_iter)
    close()
    return finish_run(setup, run, state, it)
