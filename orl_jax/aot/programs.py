"""The jitted programs of one ORL iteration, and the decode launcher's decoder, built on a mesh
of compile-only devices from abstract arguments: nothing is allocated and no weights are read.

The programs are the training loop's own (`train.orl.build_orl_steps`: the rollout with
capture, the device-side rollout metrics, the replay gather, the train step — whose loss runs
the frozen reference's forward for the KL anchor, then the optimizer update), built from a
`Setup` and a `Run` whose train state is abstract, so what is compiled is what a run jits.
Two more price one forward each (`lockstep.prefill`, `lockstep.denoising_step`): a compiler
cannot know how many times a decode's loops run, so its cost of the whole rollout counts each
loop body once; the iteration's time is predicted from the forwards a response takes.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, cast

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax.config import derive as config_lib

from orl_jax.config import build as run_config
from orl_jax.decode import build as decode_build
from orl_jax.decode import lockstep
from orl_jax import sharding as sharding_lib
from orl_jax.replay import ReplayPlan
from orl_jax.tasks import Task
from orl_jax.optimizer import optimizer_of
from orl_jax.train import state as state_lib
from orl_jax.train.orl import build_orl_steps, chunk_shape, sharded_like
from orl_jax.setup.build import Setup, run_model_config
from orl_jax.setup.resolve import needs_reference, run_mesh, special_ids
from pallas_kernels.platform import GpuTarget, target_platform

# How often a program runs: once per ORL iteration, once per decoded forward of a rollout,
# once per rollout (the prompt's prefill), or in the decode launcher (not in the iteration).
PER_ITERATION, PER_FORWARD, PER_ROLLOUT, DECODE = "iteration", "forward", "rollout", "decode"


@dataclasses.dataclass
class Program:
  """One jitted program and its abstract arguments."""
  name: str
  role: str                  # what it does, in a few words
  runs: str                  # PER_ITERATION | PER_FORWARD | PER_ROLLOUT | DECODE
  lower: Callable[[], "jax.stages.Lowered"]   # traced for the target platform
  resident_bytes: int = 0    # per device: live buffers it does not take (the rest of the state)


@dataclasses.dataclass
class ProgramSet:
  """The programs of a run config on one mesh, and what the report needs to price them."""
  programs: list[Program]
  mesh: jax.sharding.Mesh
  n_params: int
  rollout_rows: int          # responses decoded together by a rollout (P / chunks x G)
  gen_length: int            # response tokens
  block_size: int
  decode_rows: int           # rows the decode launcher decodes together


@dataclasses.dataclass(frozen=True)
class _Tokens:
  """The special ids a built `Setup` takes from its tokenizer (only ids are read)."""
  mask_id: int
  eos_id: int


@dataclasses.dataclass(frozen=True)
class _Task:
  tokenizer: _Tokens
  verifier: None = None   # nothing is verified


def _per_device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return total


def _placed(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _rows_or_replicated(mesh, n_rows: int):
  """Rows over the batch axes when they divide `n_rows` (a decode of one prompt cannot be
  split), else replicated."""
  if n_rows % sharding_lib.n_batch_shards(mesh.shape) == 0:
    return sharding_lib.batch_sharding(mesh)
  return sharding_lib.replicated(mesh)


def _with_rows(tree, rows, repl, batch_axis=lambda x: 0):
  """`tree`'s ShapeDtypeStructs placed with rows split (`batch_axis(x)`) or replicated."""
  axes = rows.spec[0] if len(rows.spec) else None

  def place(x):
    if not x.ndim or axes is None:
      return _placed(x.shape, x.dtype, repl)
    spec = [None] * x.ndim
    spec[batch_axis(x)] = axes
    return _placed(x.shape, x.dtype, jax.sharding.NamedSharding(repl.mesh,
                                                                 jax.sharding.PartitionSpec(*spec)))
  return jax.tree.map(place, tree)


def forward_programs(graphdef, params, decode_cfg, n_rows: int, p_len: int, mesh=None):
  """(step, step args, prefill or None, prefill args): one denoising forward of
  `decode_cfg`'s decode on `n_rows` prompts of `p_len` tokens (`lockstep.denoising_step`,
  its carry donated) and the prompt's prefill, jitted, with abstract arguments placed on
  `mesh` (rows over the batch axes where they divide; None: this host's default device)."""
  place = lambda tree, axis=lambda x: 0: tree
  if mesh is not None:
    rows, repl = _rows_or_replicated(mesh, n_rows), sharding_lib.replicated(mesh)
    place = lambda tree, axis=lambda x: 0: _with_rows(tree, rows, repl, axis)
  prompts, valid = place((jax.ShapeDtypeStruct((n_rows, p_len), jnp.int32),
                          jax.ShapeDtypeStruct((n_rows, p_len), jnp.bool_)))
  key = place(jax.ShapeDtypeStruct((), jax.random.key(0).dtype))
  model_of = lambda p: nnx.merge(graphdef, p)
  cache, carry = jax.eval_shape(
      lambda p, t, v: lockstep.denoising_step_inputs(model_of(p), t, v, decode_cfg),
      params, prompts, valid)
  # KV cache k/v are [L, B, ...]: rows on axis 1; everything else leads with the rows
  cache, carry = place(cache, lambda x: 1 if x.ndim == 5 else 0), place(carry)
  step = jax.jit(lambda p, t, v, k, c, s: lockstep.denoising_step(model_of(p), t, v, k,
                                                                 decode_cfg, c, s),
                 donate_argnums=(5,))
  fill = None
  if cache is not None and decode_cfg.cache == "none":   # the exact KV cache
    fill = jax.jit(lambda p, t, v: lockstep.prefill(model_of(p), t, v, decode_cfg))
  return step, (params, prompts, valid, key, cache, carry), fill, (params, prompts, valid)


def _forward_programs(graphdef, params, decode_cfg, mesh, n_rows: int, p_len: int, runs: str,
                      name: str) -> list[Program]:
  """`forward_programs` as Programs: priced per forward and per rollout in an iteration."""
  step, step_args, fill, fill_args = forward_programs(graphdef, params, decode_cfg, n_rows,
                                                      p_len, mesh)
  in_iteration = runs == PER_ITERATION
  out = [Program(f"{name}_step", "one denoising forward (+ capture) of a block",
                 PER_FORWARD if in_iteration else runs, lambda: step.lower(*step_args))]
  if fill is not None:
    out.insert(0, Program(f"{name}_prefill", "the prompt's KV cache (one forward)",
                          PER_ROLLOUT if in_iteration else runs,
                          lambda: fill.lower(*fill_args)))
  return out


def _train_programs(steps, state, batch, key, resident: int) -> list[Program]:
  """The replay train step: one jitted program, or (`replay.micro_batches` > 1) its pieces."""
  update = steps.update
  if not isinstance(update, state_lib.AccumulatedStep):
    return [Program("train_step", "replay forward+backward, reference forward, AdamW update",
                    PER_ITERATION, lambda: update.lower(state, batch, key), resident)]
  m, n = update.micro_batches, update.n_shards
  prep = functools.partial(state_lib._prepare.lower, update.graphdef, update.loss_fn, m, n)
  totals, carry, _, micro = jax.eval_shape(
      lambda b, r: state_lib._prepare(update.graphdef, update.loss_fn, m, n, b, r),
      batch, state.reference)
  one = jax.tree.map(lambda x: x[0], micro)
  sums = jax.eval_shape(functools.partial(state_lib._micro_grads, update.graphdef,
                                          update.loss_fn), state.params, one, key, totals,
                        carry, state.reference)[0]
  acc = functools.partial(state_lib._accumulate.lower, update.graphdef, update.loss_fn)
  (loss, metrics), grads = sums
  return [
      Program("train_prepare", "per-response totals, reference forward, micro-batches",
              PER_ITERATION, lambda: prep(batch, state.reference), resident),
      Program("train_micro_batch", f"forward+backward of one of {m} micro-batches",
              PER_ITERATION, lambda: acc(state.params, one, key, totals, carry,
                                         state.reference, sums), resident),
      Program("train_update", "AdamW update", PER_ITERATION,
              lambda: update.update.lower(state, loss, metrics, grads), resident)]


def orl_programs(config, devices, platform: str, gpu: GpuTarget | None = None) -> ProgramSet:
  """Every jitted program of one ORL iteration of `config` on a mesh of `devices` (and the
  decode launcher's decoder), traced for `platform` when lowered (lower them inside
  `sharding.tracing_mesh(ProgramSet.mesh)`)."""
  config = run_config.build(config, rules=False).replace(
      **{"checkpoint.save_rollouts": False})   # nothing is written
  mesh = run_mesh(config, devices)
  with sharding_lib.tracing_mesh(mesh):
    return _programs_on(config, mesh, platform, gpu)


def _programs_on(config, mesh, platform: str, gpu: GpuTarget | None) -> ProgramSet:
  model_cfg = run_model_config(config)
  optimizer = optimizer_of(config_lib.optimizer_config(config), model_cfg)
  graphdef, state, state_sh = state_lib.abstract_train_state(
      model_cfg, optimizer, mesh, config.seed, with_reference=needs_reference(config))
  mask_id, eos_id = special_ids(config, model_cfg)
  # a stand-in for the task: the programs read only its tokenizer's special ids
  setup = Setup(config, cast(Task, _Task(_Tokens(mask_id, eos_id))), model_cfg, mesh)
  run = state_lib.Run(graphdef, state, state_sh, optimizer, ckpt=None)
  o, p_len = config.orl, config.task.prompt_len
  rows, repl = sharding_lib.batch_sharding(mesh), sharding_lib.replicated(mesh)
  n_chunk, group = chunk_shape(o)   # prompts of one rollout chunk, responses of each
  with target_platform(platform, gpu):
    steps = build_orl_steps(setup, run, prompt_iter=None)
    prompts = _placed((n_chunk, p_len), jnp.int32, rows)
    valid = _placed((n_chunk, p_len), jnp.bool_, rows)
    key = _placed((), jax.random.key(0).dtype, repl)
    traj = sharded_like(jax.eval_shape(steps.rollout, state.params, prompts, valid, key,
                                       state.step), mesh)
    trajs = (traj,) * o.rollout_chunks
    plan = jax.tree.map(lambda x: _placed(x.shape, x.dtype, repl),
                        ReplayPlan.abstract(steps.replay_cfg))
    batch = jax.eval_shape(steps.gather, trajs, plan)
    batch_sh = jax.tree.map(lambda x: rows if x.ndim >= 2 else repl, batch)
    batch = jax.tree.map(lambda x, s: _placed(x.shape, x.dtype, s), batch, batch_sh)
  state_bytes = _per_device_bytes(state)
  not_params = state_bytes - _per_device_bytes(state.params)
  programs = [
      Program("rollout", f"{n_chunk} prompts x {group} responses, capture",
              PER_ITERATION, lambda: steps.rollout.lower(state.params, prompts, valid, key,
                                                          state.step), not_params),
      Program("rollout_metrics", "device-side rollout sums", PER_ITERATION,
              lambda: steps.sums.lower(traj), state_bytes),
      Program("replay_gather", "packed staircase rows from the capture", PER_ITERATION,
              lambda: steps.gather.lower(trajs, plan), state_bytes)]
  programs += _train_programs(steps, state, batch, key, 0)
  n_rollout = n_chunk * group   # one rollout chunk's responses, decoded together
  decode_cfg = decode_build.sampler_of(config, model_cfg).forward_config(
      "rollout", mask_id=mask_id, eos_id=eos_id)
  if decode_cfg is not None:   # None: a sampler priced whole (its rollout above)
    programs += _forward_programs(graphdef, state.params, decode_cfg, mesh, n_rollout, p_len,
                                  PER_ITERATION, "rollout")
  programs += _decode_programs(config, model_cfg, graphdef, state.params, mesh, mask_id,
                               eos_id)
  n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(state.params))
  block = decode_cfg.block_size if decode_cfg else config.decode.block_size
  return ProgramSet(programs, mesh, n_params, n_rollout, config.decode.gen_length, block, 1)


def _decode_programs(config, model_cfg, graphdef, params, mesh, mask_id: int,
                     eos_id: int) -> list[Program]:
  """`launch/decode.py`'s decoder (one prompt, every state captured for the trajectory page)
  and, for the block decoder, its forward at batch 1 (what tokens/s at batch 1 rests on)."""
  p_len = config.task.prompt_len
  repl = sharding_lib.replicated(mesh)
  prompts = _placed((1, p_len), jnp.int32, repl)
  valid = _placed((1, p_len), jnp.bool_, repl)
  key = _placed((), jax.random.key(0).dtype, repl)
  decoder = decode_build.make_decoder(config, model_cfg, graphdef, "decode", mask_id=mask_id,
                                  eos_id=eos_id)
  out = [Program("decode", "launch/decode.py: one prompt, every state captured", DECODE,
                 lambda: decoder.lower(params, prompts, valid, key))]
  cfg = decode_build.sampler_of(config, model_cfg).forward_config("evaluate", mask_id=mask_id,
                                                                  eos_id=eos_id)
  if cfg is not None:
    out += _forward_programs(graphdef, params, cfg, mesh, 1, p_len, DECODE, "decode")
  return out
