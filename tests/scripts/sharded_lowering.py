"""The ORL train step and the rollout decode step of a `:debug` config on a 4-device
data x fsdp mesh, lowered for a TPU or a GPU (run by tests/kernels/test_lowering.py in a
subprocess with 4 fake CPU devices; prints one JSON line).

  python tests/scripts/sharded_lowering.py sdar,llada tpu,cuda

Also checks, in interpret mode on the CPU devices, that the model's kernels inside `shard_map`
give the logits of the unsharded dense reference.
"""
import json
import os
import sys

import jax

jax.config.update("jax_num_cpu_devices", 4)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import dataclasses  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from configs import llada, sdar  # noqa: E402
from orl_jax.config import derive as config_lib  # noqa: E402
from orl_jax import sharding as sharding_lib  # noqa: E402
from orl_jax.decode.canvas import prompt_layout  # noqa: E402
from orl_jax.apps.dry_run import abstract_replay_batch  # noqa: E402
from orl_jax.losses import OrlObjective  # noqa: E402
from orl_jax.models.transformer import Transformer  # noqa: E402
from orl_jax.decode.trajectories import make_trajectories  # noqa: E402
from orl_jax.setup.build import build_setup  # noqa: E402
from orl_jax.setup.resolve import needs_reference  # noqa: E402
from orl_jax.decode.block_sampler import block_decode_config  # noqa: E402
from orl_jax.train.state import create_train_state, make_train_step  # noqa: E402
from orl_jax.optimizer import optimizer_of  # noqa: E402
from pallas_kernels.staircase_attention import target_platform  # noqa: E402
from pallas_kernels.staircase_attention.lowering import (KERNEL_CALLS, custom_calls,  # noqa: E402
                                                         lowered_text)

CONFIGS = {"sdar": sdar, "llada": llada}


def debug_config(name: str):
  c = CONFIGS[name].get_config("debug")
  c.model.head_dim = 16              # the GPU kernel's smallest head_dim (debug has 8)
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 1
  c.orl.prompts_per_step = 4         # divisible by the 4 data shards
  return c


def abstract(tree, shardings):
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


def _subjaxprs(params):
  for value in params.values():
    for v in value if isinstance(value, (tuple, list)) else (value,):
      if hasattr(v, "eqns"):
        yield v
      elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):
        yield v.jaxpr


def kernels_by_row_split(jaxpr, rows_split=()) -> list[tuple[str, ...]]:
  """For every `pallas_call` in `jaxpr`: the mesh axes its enclosing `shard_map` splits the
  first operand's rows over (empty: the kernel sees the global batch, so XLA gathers it)."""
  out = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      out.append(tuple(rows_split))
    split = rows_split
    if eqn.primitive.name == "shard_map":
      spec = eqn.params["in_specs"][0]
      first = spec[0] if len(spec) else None
      split = tuple(first) if isinstance(first, tuple) else (first,) if first else ()
    for sub in _subjaxprs(eqn.params):
      out += kernels_by_row_split(sub, split)
  return out


def lowered_steps(name: str, platform: str) -> dict:
  c = debug_config(name)
  s = build_setup(c)
  optimizer = optimizer_of(config_lib.optimizer_config(s.config), s.model_cfg)
  graphdef, state, state_sh = create_train_state(s.model_cfg, optimizer, s.mesh, c.seed,
                                                 with_reference=needs_reference(s.config))
  rows, repl = sharding_lib.batch_sharding(s.mesh), sharding_lib.replicated(s.mesh)
  dcfg = block_decode_config(c, None, "rollout", mask_id=s.tokenizer.mask_id,
                             eos_id=s.tokenizer.eos_id)
  n_prompts, group = c.orl.prompts_per_step, c.orl.group_size
  prompts = jax.ShapeDtypeStruct((n_prompts, c.task.prompt_len), jnp.int32, sharding=rows)
  valid = jax.ShapeDtypeStruct((n_prompts, c.task.prompt_len), jnp.bool_, sharding=rows)
  params = abstract(state.params, state_sh.params)
  rollout_fn = make_trajectories(graphdef, dcfg, group, s.mesh)
  key = jax.random.key(0)
  decode_step = lambda params, prompts, valid: rollout_fn(params, prompts, valid, key, 0)
  traj = jax.eval_shape(decode_step, params, prompts, valid)
  batch = abstract_replay_batch(c, s.model_cfg, traj, mask_id=s.model_cfg.mask_id)
  batch_sh = jax.tree.map(lambda x: rows if x.ndim >= 2 else repl, batch)
  objective = OrlObjective(config_lib.loss_config(s.config))
  step_fn = make_train_step(graphdef, optimizer, objective, s.mesh, state_sh, batch_sh)
  train_step = lambda state, batch: step_fn(state, batch, key)
  out = {}
  for what, fn, args in [("decode", decode_step, (params, prompts, valid)),
                         ("train", train_step, (abstract(state, state_sh),
                                                abstract(batch, batch_sh)))]:
    text = lowered_text(fn, *args, platform=platform)
    with target_platform(platform):
      splits = kernels_by_row_split(jax.make_jaxpr(fn)(*args).jaxpr)
    out[what] = dict(kernel_calls=custom_calls(text)[KERNEL_CALLS[platform]],
                     pallas_calls=len(splits),
                     pallas_calls_rows_split=sum(set(s) == {"data", "fsdp"} for s in splits),
                     all_gathers=text.count("all_gather"))
  return out


def sharded_equals_reference(name: str) -> float:
  """Max |logits| difference: interpret-mode kernels in shard_map vs the unsharded reference."""
  c = debug_config(name)
  s = build_setup(c)
  model_cfg = dataclasses.replace(s.model_cfg, attention_impl="pallas")
  reference = Transformer(dataclasses.replace(model_cfg, attention_impl="xla"), rngs=nnx.Rngs(0))
  sharded = Transformer(model_cfg, rngs=nnx.Rngs(0), mesh=s.mesh)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, model_cfg.vocab_size, (4, 32)), jnp.int32)
  valid = jnp.asarray(np.arange(32)[None, :] >= rng.integers(0, 8, (4, 1)))
  positions, meta = prompt_layout(valid, c.decode.block_size)
  want = reference(tokens, positions, meta).logits
  rows = sharding_lib.batch_sharding(s.mesh)
  graphdef, params = nnx.split(sharded)
  forward = jax.jit(lambda p, t, pos, m: nnx.merge(graphdef, p)(t, pos, m).logits)
  got = forward(params, *jax.device_put((tokens, positions, meta), rows))
  keep = np.asarray(valid)  # padding queries see nothing; their logits are the head's bias
  return float(np.max(np.abs(np.asarray(got) - np.asarray(want))[keep]))


if __name__ == "__main__":
  config_names, platforms = sys.argv[1].split(","), sys.argv[2].split(",")
  result = {}
  for name in config_names:
    result[name] = {platform: lowered_steps(name, platform) for platform in platforms}
    result[name]["sharded_max_abs_err"] = sharded_equals_reference(name)
  print(json.dumps(result))
