"""The on-policy loop (DESIGN §2.7): rollout -> verify -> select & pack -> one update -> discard.

Each iteration draws fresh prompts, rolls out `G` responses per prompt with the *current*
parameters (capturing every denoising state), verifies them, packs the verified responses'
states into staircase rows and takes exactly one optimizer step on them (accumulated over
`replay.micro_batches` row micro-batches). An iteration with no verified response takes no
step (no moment changes either) and is counted in `updates_skipped`. Trajectories are never
reused: a ledger counts how many updates consumed each rollout, and the jitted step reports the
policy lag (updates applied since the parameters the rollout was drawn with), which must be 0.

Iterations (the checkpoint step, the prompt stream, the rollout key) and optimizer updates
(`TrainState.step`, the learning-rate schedule) are counted separately; they differ by the
skipped iterations.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import time

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from orl_jax import config as config_lib
from orl_jax import distributed
from orl_jax import sharding as sharding_lib
from orl_jax.checkpoint import Checkpointer
from orl_jax.data.pipeline import encode_prompts, prompt_dataset
from orl_jax.losses import OrlObjective
from orl_jax.metrics import MetricsWriter
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.rollout import make_rollout
from orl_jax.train.run import finish_run, loss_config, prepare_run, resume
from orl_jax.train.state import make_train_step
from orl_jax.unmasking import UnmaskRule


class RolloutLedger:
  """Counts updates per rollout id; on-policy means every count is exactly one."""

  def __init__(self):
    self.uses = collections.Counter()

  def consume(self, rollout_id: int):
    if self.uses[rollout_id]:
      raise RuntimeError(f"rollout {rollout_id} was already used for an update (off-policy reuse)")
    self.uses[rollout_id] += 1


def replay_config(config, n_shards: int) -> ReplayConfig:
  """Bidirectional families always replay full canvases (their context cannot be shared)."""
  r = config.replay
  bidirectional = config.model.family == "bidirectional"
  return ReplayConfig(row_len=r.row_len, n_rows=r.n_rows, max_states=r.max_states,
                      max_responses=r.max_responses, states_per_response=r.states_per_response,
                      layout="canvas" if bidirectional else r.layout, n_shards=n_shards,
                      response_blocks=config.decode.gen_length // config.decode.block_size,
                      micro_batches=r.micro_batches)


def rollout_decode_config(config, tok):
  o = config.orl
  dcfg = config_lib.decode_config(config, mask_id=tok.mask_id, eos_id=tok.eos_id,
                                  rule=UnmaskRule(o.rollout_rule, o.rollout_rule_value),
                                  temperature=o.rollout_temperature, capture_states=1)
  steps = dcfg.n_blocks * dcfg.steps_bound
  return dataclasses.replace(dcfg, capture_states=o.capture_states or steps)


def entropy_by_step(capture_entropy, capture_step, capture_valid, canvas, mask_id, n_steps=8):
  """Mean rollout entropy over masked positions per step index (host, small arrays)."""
  out = {}
  masked = canvas == mask_id
  for k in range(n_steps):
    sel = capture_valid & (capture_step == k)
    m = masked & sel[..., None]
    if m.any():
      out[f"rollout_entropy_step{k}"] = float(capture_entropy[m].mean())
  return out


class SimulatedCrash(RuntimeError):
  """Raised by tests to emulate a kill at a chosen point of an iteration."""


def sharded_like(abstract, mesh):
  """Restore targets for a rollout snapshot: leading dimension over the data axes (as the
  rollout's prompts), scalars replicated."""
  rows, repl = sharding_lib.batch_sharding(mesh), sharding_lib.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                     sharding=rows if x.ndim else repl),
                      abstract)


def agreed(rewards: np.ndarray) -> np.ndarray:
  """Process 0's rewards on every process: a verifier that is not deterministic (a sandbox
  timeout under load) must not give the processes different replay plans."""
  if jax.process_count() == 1:
    return rewards
  return np.asarray(multihost_utils.broadcast_one_to_all(rewards))


def train_orl(s, *, progress=True, stop_after=None, crash_before_update_at=None) -> str:
  config = s.config
  tc, workdir, o = config.train, config.workdir, config.orl
  tok = s.tokenizer
  run = prepare_run(s)
  graphdef, state, state_sh, optimizer, ckpt = (run.graphdef, run.state, run.state_shardings,
                                                run.optimizer, run.ckpt)
  n_prompts = o.prompts_per_step
  prompts = prompt_dataset(s.task.train_problem, batch_size=n_prompts,
                           rows=sharding_lib.process_rows(s.mesh, n_prompts))
  prompt_iter = iter(prompts)
  state, start = resume(run, prompt_iter)

  dcfg = rollout_decode_config(config, tok)
  rollout_fn = make_rollout(graphdef, dcfg, o.group_size, s.mesh)
  n_shards = s.mesh.shape["data"] * s.mesh.shape["fsdp"]
  rcfg = replay_config(config, n_shards)
  objective = OrlObjective(loss_config(config))
  gather = jax.jit(lambda traj, plan: gather_batch(traj, plan, mask_id=tok.mask_id,
                                                   block_size=dcfg.block_size))
  rows = sharding_lib.batch_sharding(s.mesh)
  repl = sharding_lib.replicated(s.mesh)
  step_fn = None
  base_key = jax.random.key(config.seed)
  rollout_seed = o.rollout_seed if o.rollout_seed >= 0 else config.seed
  rollout_key = jax.random.fold_in(jax.random.key(rollout_seed), 1)
  ledger = RolloutLedger()
  writer = MetricsWriter(workdir, resume_step=start)
  last = tc.steps if stop_after is None else min(tc.steps, stop_after)
  bar = tqdm(total=tc.steps, initial=start, desc="orl", dynamic_ncols=True,
             disable=not (progress and distributed.is_lead_process()))
  it = start   # iterations done (= checkpoint step); state.step counts optimizer updates
  snapshots = None
  if config.checkpoint.save_rollouts:
    snapshots = Checkpointer(os.path.join(workdir, "rollouts"), every=1, keep=1)
  while it < last:
    t0 = time.perf_counter()
    # this process's prompts -> global [P, ...] arrays split over the data axes
    local_idx = np.asarray(next(prompt_iter), np.int32)
    local_pt, local_pv = encode_prompts([s.task.train_problem(int(i)) for i in local_idx], tok,
                                        config.task.prompt_len)
    idx_dev, pt, pv_dev = sharding_lib.shard_batch((local_idx, local_pt, local_pv), s.mesh,
                                                   n_prompts)
    from_snapshot = snapshots is not None and snapshots.latest_step() == it
    if from_snapshot:  # killed between rollout and update: replay the saved rollout
      abstract = jax.eval_shape(rollout_fn, state.params, pt, pv_dev, rollout_key, state.step)
      saved, _ = snapshots.restore(it, {"traj": sharded_like(abstract, s.mesh),
                                        "rewards": np.zeros((n_prompts * o.group_size,),
                                                            np.float32),
                                        "prompt_ids": np.zeros((n_prompts,), np.int32)})
      traj, rewards = saved["traj"], np.asarray(saved["rewards"])
    else:   # drawn with the current parameters; rollout_step = their version (state.step)
      traj = rollout_fn(state.params, pt, pv_dev, jax.random.fold_in(rollout_key, it),
                        state.step)
    # every process gets the whole batch on the host, so all build the same replay plan
    host = sharding_lib.to_host({
        "prompt_ids": idx_dev, "prompt_valid": pv_dev, "responses": traj.responses,
        "nfe": traj.nfe, "nfe_engine": traj.nfe_engine, "n_gen": traj.n_generated,
        "valid": traj.capture.valid, "block": traj.capture.block, "step": traj.capture.step,
        "entropy": traj.capture.entropy, "canvas": traj.capture.canvas,
        "overflow": traj.capture.overflow})
    idx, pv = host["prompt_ids"], host["prompt_valid"]   # [P] problem ids, [P, Lp] bool
    if from_snapshot and not np.array_equal(np.asarray(saved["prompt_ids"]), idx):
      raise RuntimeError(f"rollout snapshot of iteration {it} was drawn for other prompts; "
                         "delete the work directory's rollouts/ folder to re-roll")
    t_rollout = time.perf_counter() - t0

    t1 = time.perf_counter()
    if not from_snapshot:
      texts = [tok.decode(r, stop_at_eos=True) for r in host["responses"]]
      group_problems = [s.task.train_problem(int(i)) for i in idx for _ in range(o.group_size)]
      rewards = agreed(np.asarray(s.task.verifier.score_batch(group_problems, texts), np.float32))
      if snapshots is not None:
        snapshots.save(it, {"traj": traj, "rewards": rewards, "prompt_ids": idx})
        snapshots.wait()
    t_verify = time.perf_counter() - t1
    if crash_before_update_at == it:
      raise SimulatedCrash(f"simulated kill between rollout and update at iteration {it}")

    t2 = time.perf_counter()
    verified = rewards >= o.min_reward
    metrics, pstats, t_pack, t_update = {}, {}, 0.0, 0.0
    ledger.consume(it)
    if verified.any():
      plan, pstats = build_plan(prompt_valid=pv, capture_valid=host["valid"],
                                capture_block=host["block"], eligible=verified,
                                group_size=o.group_size, block_size=dcfg.block_size, cfg=rcfg,
                                rng=np.random.default_rng([config.seed, it]))
      batch = gather(traj, plan)
      del traj  # discard: nothing is kept across updates
      batch_sh = jax.tree.map(lambda x: rows if x.ndim >= 2 else repl, batch)  # rows over data
      if step_fn is None:
        step_fn = make_train_step(graphdef, optimizer, objective, s.mesh, state_sh, batch_sh,
                                  micro_batches=rcfg.micro_batches)
      batch = jax.device_put(batch, batch_sh)
      t_pack = time.perf_counter() - t2
      t3 = time.perf_counter()
      state, metrics = step_fn(state, batch, base_key)
      jax.block_until_ready(metrics)
      t_update = time.perf_counter() - t3
    else:   # nothing verified: no optimizer step, no moment change
      del traj
    it += 1
    bar.update(1)
    if it % tc.log_every == 0 or it == last:
      extra = dict(rollout_id=it - 1, rollout_from_snapshot=float(from_snapshot),
                   rollout_uses=ledger.uses[it - 1], reward=rewards.mean(),
                   responses_verified=verified.sum(), updates=int(state.step),
                   updates_skipped=it - int(state.step),
                   rollout_tpf=host["n_gen"].sum() / max(host["nfe"].sum(), 1),
                   rollout_tpf_engine=host["n_gen"].sum() / max(host["nfe_engine"].sum(), 1),
                   rollout_nfe=host["nfe"].mean(), rollout_tokens=host["n_gen"].mean(),
                   capture_overflow=host["overflow"].mean(),
                   sec_rollout=t_rollout, sec_verify=t_verify, sec_pack=t_pack,
                   sec_update=t_update, **pstats,
                   **entropy_by_step(host["entropy"], host["step"], host["valid"], host["canvas"],
                                     tok.mask_id))
      scalars = writer.write(it, dict(metrics, **extra))
      bar.set_postfix(reward=f"{scalars['reward']:.2f}", tpf=f"{scalars['rollout_tpf']:.2f}",
                      loss=f"{scalars.get('loss', float('nan')):.3f}")
    if ckpt.should_save(it, final=it == last):
      ckpt.save(it, state, prompt_iter)
  bar.close()
  if snapshots is not None:
    snapshots.close()
  writer.close()
  return finish_run(s, run, state, it)
