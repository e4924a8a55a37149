"""Sizing dry-run (`--config.dry_run=True`): per-device bytes of what a run would allocate.

Everything is computed from `jax.eval_shape` (parameters, optimizer state, rollout
trajectories, one replay batch) and the model family's partition rules applied to the mesh
*shape* of the config (`mesh.data/fsdp/tensor/expert`; a -1 axis takes the local devices), so no
device of that mesh has to exist: a 16B MoE on `fsdp=8 x expert=8` (64 devices) is sized on one
CPU without allocating anything. Per-device bytes of an array are its bytes divided by the
product of the mesh axes its PartitionSpec names (the rules drop axes that do not divide a
dimension); rollout and replay buffers are split over the batch axes (data x fsdp x expert).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orl_jax.config import build as run_config
from orl_jax.config import derive as config_lib
from orl_jax import sharding as sharding_lib
from orl_jax.storage import weights as weights_lib
from orl_jax.decode import build as decode_build
from orl_jax.models import families
from orl_jax.models.transformer import Transformer
from orl_jax.replay import abstract_batch, gather_batch
from orl_jax.decode.trajectories import block_final_bytes, capture_bytes, route_capture_bytes
from orl_jax.setup.resolve import needs_reference, own_model_config, resolve_model, special_ids
from orl_jax.setup.build import sizing_model_config
from orl_jax.optimizer import optimizer_of


@dataclasses.dataclass
class SizingRow:
  name: str
  total_bytes: int
  per_device_bytes: int
  note: str = ""


def mesh_shape(config, n_devices: int | None = None) -> dict[str, int]:
  """{axis: size} of the configured mesh; a -1 axis fills `n_devices` (default: local devices)."""
  expert = config.mesh.expert
  sizes = [config.mesh.data, config.mesh.fsdp, config.mesh.tensor]
  if -1 in sizes:
    n = n_devices or jax.device_count()
    known = math.prod(s for s in sizes if s != -1) * expert
    sizes[sizes.index(-1)] = max(n // known, 1)
  return dict(zip(sharding_lib.MESH_AXES, sizes + [expert]))


def _per_device(tree, shape: dict[str, int], rules) -> tuple[int, int]:
  """(total bytes, bytes on one device) of a tree of ShapeDtypeStructs under `rules`."""
  total = per = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    nbytes = int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
    spec = sharding_lib.partition_spec(sharding_lib.path_name(path), leaf.shape, shape, rules)
    split = math.prod(shape[a] for a in jax.tree.leaves(tuple(spec)) if a is not None)
    total += nbytes
    per += nbytes // split
  return total, per


def _tree_bytes(tree) -> int:
  return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def abstract_replay_batch(config, model_cfg, traj, *, mask_id: int):
  """The ShapeDtypeStructs of one replay batch (`config.replay` rows, the run's
  `config.replay_config`) gathered from `traj`, at the positions the model's sampler leaves
  unresolved (`Sampler.unresolved`)."""
  unresolved = decode_build.sampler_of(config, model_cfg).unresolved
  gather = lambda t, p: gather_batch(t, p, mask_id=mask_id, unresolved=unresolved)
  return abstract_batch(traj, config_lib.replay_config(config, n_shards=1), gather)


def _gradient_row(total: int, per: int, dtype) -> SizingRow:
  """One update's gradients: a tree like the params, in their dtype, sharded like them (an
  upper bound: frozen parameters have none)."""
  return SizingRow("gradients", total, per, f"one update's, like the params ({dtype}); at most")


def _optimizer_rows(config, params, shape, rules, model_cfg) -> list[SizingRow]:
  """Optimizer state and (ORL with the KL anchor) the frozen reference copy."""
  optimizer = optimizer_of(config_lib.optimizer_config(config), model_cfg)
  total, per = _per_device(jax.eval_shape(optimizer.init, params), shape, rules)
  rows = [SizingRow("optimizer state", total, per, "AdamW mu + nu (+ counters)")]
  if needs_reference(config):
    total, per = _per_device(params, shape, rules)   # sharded like the params
    rows.append(SizingRow("KL reference (frozen)", total, per,
                          "copy of the starting params (loss.kl_reference='initial')"))
  return rows


def own_model_sizing_rows(config, family, n_devices: int | None = None):
  """`sizing_rows` of a family with its own model (DiffusionGemma): its config from the run
  config (or model.path's config.json), its rollout traced abstractly (the state count and
  the route buffers are read from the traced capture, not from a sampler config of our own)."""
  shape = mesh_shape(config, n_devices)
  vocab = config.model.vocab_size
  hf_dir = weights_lib.hf_dir(config)
  if not vocab and not hf_dir:
    raise config_lib.ConfigError("dry run: set model.vocab_size (or model.path) to size a "
                                 f"{family.name} model")
  cfg = own_model_config(config, hf_dir, family.name, vocab)
  model = nnx.eval_shape(lambda: family.build_model(cfg, nnx.Rngs(0)))
  graphdef, params = nnx.split(model, nnx.Param)
  rules = family.partition_rules
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  total, per = _per_device(params, shape, rules)
  rows = [SizingRow("params", total, per, f"{n_params / 1e9:.3f}B x {cfg.param_dtype}"),
          _gradient_row(total, per, cfg.param_dtype)]
  rows += _optimizer_rows(config, params, shape, rules, cfg)
  data_par = sharding_lib.n_batch_shards(shape)
  o = config.orl
  traj = traced_rollout(config, cfg, graphdef, params, mask_id=-1, eos_id=cfg.eos_ids[0])
  n_rollouts = o.prompts_per_step * o.group_size
  n_states = traj.capture.block_tokens.shape[1]     # canvases x max denoising steps
  cap = _tree_bytes(traj.capture)   # with orl.capture_routes: the route buffers too
  note = (f"{n_rollouts} responses x {n_states} captured states x a canvas of "
          f"{cfg.canvas_length} tokens x hidden width {cfg.d_model}")
  if traj.capture.routes is not None:       # expert ids of every step, the prefill, the commits
    note += f" + routes ({cfg.n_layers} MoE layers x top-{cfg.top_k})"
  rows.append(SizingRow("rollout capture buffers", cap, cap // data_par, note))
  batch = abstract_replay_batch(config, cfg, traj, mask_id=-1)
  r = config.replay
  replay = _tree_bytes(batch)
  rows.append(SizingRow("replay batch", replay, replay // data_par,
                        f"{r.n_rows} rows x {r.row_len} tokens"))
  info = {"mesh": shape, "n_params": n_params, "model": dataclasses.asdict(cfg),
          "capture_bytes_traced": cap}
  return rows, info


def traced_rollout(config, model_cfg, graphdef, params, *, mask_id: int, eos_id: int):
  """The run's rollout (`decode_build.make_decoder(..., "rollout")`, the decoder training uses)
  traced abstractly: `Trajectories` of ShapeDtypeStructs for `orl.prompts_per_step` prompts of
  `task.prompt_len` tokens, `orl.group_size` responses each."""
  o, p_len = config.orl, config.task.prompt_len
  run = decode_build.make_decoder(config, model_cfg, graphdef, "rollout", mask_id=mask_id,
                              eos_id=eos_id, group_size=o.group_size)
  prompts = jax.ShapeDtypeStruct((o.prompts_per_step, p_len), jnp.int32)
  valid = jax.ShapeDtypeStruct((o.prompts_per_step, p_len), jnp.bool_)
  return jax.eval_shape(run, params, prompts, valid, jax.random.key(0), 0)


def sizing_rows(config, n_devices: int | None = None) -> tuple[list[SizingRow], dict]:
  config = run_config.build(config, rules=False)   # a layout is sized before its batch divides
  family = families.get(resolve_model(config).family)
  if family.own_model:
    return own_model_sizing_rows(config, family, n_devices)

  shape = mesh_shape(config, n_devices)
  cfg = sizing_model_config(config)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))),
                               nnx.Param)
  rules = families.of_model(cfg).partition_rules
  rows = []
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  total, per = _per_device(params, shape, rules)
  rows.append(SizingRow("params", total, per, f"{n_params / 1e9:.3f}B x {cfg.param_dtype}"))
  rows.append(_gradient_row(total, per, cfg.param_dtype))
  rows += _optimizer_rows(config, params, shape, rules, cfg)

  # Rollouts: P prompts x G responses, rows split over the data-parallel axes.
  data_par = sharding_lib.n_batch_shards(shape)
  o = config.orl
  mask_id, eos_id = special_ids(config, cfg)
  decode_cfg = decode_build.sampler_of(config, cfg).forward_config("rollout", mask_id=mask_id,
                                                                   eos_id=eos_id)
  assert decode_cfg is not None   # a block sampler's (a family's own model returned above)
  n_rollouts = o.prompts_per_step * o.group_size
  p_len = config.task.prompt_len
  cap = (capture_bytes(n_rollouts, decode_cfg, cfg.d_model, jnp.dtype(cfg.compute_dtype).itemsize)
         + block_final_bytes(n_rollouts, decode_cfg))
  note = (f"{n_rollouts} responses x {decode_cfg.capture_states} captured states x a block "
          f"of {decode_cfg.block_size} tokens x hidden width {cfg.d_model}")
  if cfg.moe is not None and decode_cfg.capture_routes:   # orl.capture_routes: expert ids
    cap += route_capture_bytes(n_rollouts, decode_cfg, p_len, cfg.n_moe_layers, cfg.moe.top_k,
                               decode_cfg.max_blocks)
    note += f" + routes ({cfg.n_moe_layers} MoE layers x top-{cfg.moe.top_k})"
  rows.append(SizingRow("rollout capture buffers", cap, cap // data_par, note))
  traj = traced_rollout(config, cfg, graphdef, params, mask_id=mask_id, eos_id=eos_id)

  # One replay batch: R rows x T tokens.
  batch = abstract_replay_batch(config, cfg, traj, mask_id=cfg.mask_id)
  r = config.replay
  replay = _tree_bytes(batch)
  rows.append(SizingRow("replay batch", replay, replay // data_par,
                        f"{r.n_rows} rows x {r.row_len} tokens"))
  info = {"mesh": shape, "n_params": n_params, "model": dataclasses.asdict(cfg),
          "capture_bytes_traced": _tree_bytes(traj.capture)}
  return rows, info


ACTIVATIONS = ("activations and other temporaries are not in these rows: the compiled train "
               "step's are (python launch/compile.py --config=... --programs=train_step; "
               "docs/scaling.md: 10.7-13.4 GiB a v5p chip for QwenDLM-4B, SDAR-8B and "
               "LLaDA-8B with per-layer recomputation)")


def format_table(rows: list[SizingRow], info: dict) -> str:
  """The sizing table: one row per kind of buffer (total over the mesh and per device, in GiB
  = 2^30 bytes), what each is, and last the per-device sum as the headline `name: value`."""
  gib = lambda b: f"{b / 2**30:10.3f}"
  mesh = " x ".join(f"{k}={v}" for k, v in info["mesh"].items())
  head = f"{'what':<26} {'total GiB':>10} {'per-device GiB':>15}  what it is"
  lines = [f"dry run on mesh {mesh} ({math.prod(info['mesh'].values())} devices), "
           f"{info['n_params']:,} parameters; sizes in GiB (2^30 bytes)", head, "-" * len(head)]
  for r in rows:
    lines.append(f"{r.name:<26} {gib(r.total_bytes)} {gib(r.per_device_bytes):>15}  {r.note}")
  per = sum(r.per_device_bytes for r in rows)
  lines.append(f"the total below is the rows' per-device sum in GiB; {ACTIVATIONS}")
  lines.append(f"per_device_total_gib: {per / 2**30:.3f}")
  return "\n".join(lines)
