"""The LLaDA2 MoE layer (forward + backward, orl_jax/models/moe.py), side by side in one process:

* expert compute: ragged vs dense on one device, at two sizes. On CPU `jax.lax.ragged_dot`
  expands to a dense `[E, m, k]` product, so expect the dense path to win there; the ragged
  (dropless grouped matmul) path is the one for TPU/GPU.
* expert-axis token exchange on 4 (fake CPU) devices, `mesh.expert=4`: `all_to_all` (what
  model.moe.exchange=auto runs on CPU: ragged_all_to_all's slices, padded), the all-gather +
  reduce-scatter issue 13 replaced (kept here only as the baseline), and one device without an
  expert axis. `ragged_all_to_all` itself does not run on
  XLA:CPU; the rows each device would receive are counted from the benchmark's routes.

  python benchmarks/moe.py [--repeats 5] [--out benchmarks/results/moe.json]
"""
import argparse
import contextlib
import dataclasses
import os
from unittest import mock

import _common  # noqa: F401
import jax

jax.config.update("jax_num_cpu_devices", 4)   # before any backend starts

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from orl_jax import sharding  # noqa: E402
from orl_jax.models import moe as moe_lib  # noqa: E402
from orl_jax.models.moe import MoE, MoEConfig  # noqa: E402

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "moe.json")
# (name, tokens, d_model, MoEConfig): LLaDA2-shaped routing (groups, top-k inside kept groups).
SIZES = (
    ("small", 512, 64, MoEConfig(n_experts=8, top_k=2, expert_dim=32, n_group=2, topk_group=1,
                                 routed_scaling_factor=2.5)),
    ("medium", 1024, 128, MoEConfig(n_experts=16, top_k=4, expert_dim=64, n_group=4,
                                    topk_group=2, routed_scaling_factor=2.5)),
)
EXCHANGE_SIZE = "medium"
N_EXPERT_DEVICES = 4


def fwd_bwd_step(cfg: MoEConfig, d_model: int, tokens: int, mesh=None):
  """(jitted step, params, x): loss and gradients of one MoE layer (sharded over `mesh`)."""
  graphdef, params = nnx.split(MoE(cfg, d_model, dtype=jnp.float32, param_dtype=jnp.float32,
                                   shared_experts=None, rngs=nnx.Rngs(0)))
  x = jax.random.normal(jax.random.key(1), (N_EXPERT_DEVICES, tokens // N_EXPERT_DEVICES,
                                             d_model))
  if mesh is not None:
    rules = moe_lib.PARTITION_RULES + sharding.PARTITION_RULES
    params = jax.device_put(params, sharding.tree_shardings(params, mesh, rules))
    x = jax.device_put(x, sharding.batch_sharding(mesh))

  @jax.jit
  def step(params, x):
    return jax.value_and_grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(x).y ** 2))(params)

  return step, params, x, graphdef


def gather_expert_parallel(x, logits, expert_bias, given_ids, w, cfg):
  """The exchange issue 13 replaced (baseline only): route outside, all-gather the tokens of the
  expert peers, run the local experts, reduce-scatter the partial outputs."""
  mesh = jax.sharding.get_abstract_mesh()
  routed = moe_lib.route(logits, expert_bias, cfg, given_ids)
  axis = moe_lib.EXPERT_AXIS
  tokens = P(tuple(a for a in mesh.axis_names if a in ("data", "fsdp")) + (axis,))

  def local(x, ids, weights, w):
    gather = lambda a: jax.lax.all_gather(a, axis, axis=0, tiled=True)
    peers = moe_lib.RoutedTokens(gather(ids), gather(weights), None)
    y = moe_lib.ragged_experts(gather(x), peers, w, jax.lax.axis_index(axis) * w.gate.shape[0])
    return jax.lax.psum_scatter(y, axis, scatter_dimension=0, tiled=True)

  y = jax.shard_map(local, mesh=mesh, in_specs=(tokens, tokens, tokens, P(axis)),
                    out_specs=tokens, check_vma=False)(x, routed.expert_ids, routed.weights, w)
  return y, routed


def timed(step, params, x, repeats: int, tokens: int) -> dict:
  jax.block_until_ready(step(params, x))                             # compile + warm up
  seconds, times = _common.median_time(lambda: jax.block_until_ready(step(params, x)), repeats)
  return {"median_s": seconds, "times_s": times, "tokens_per_s": tokens / seconds}


def rows_received(graphdef, params, x, n_experts: int) -> dict:
  """Rows each device receives per exchange direction: the padded all-to-all (and the gather)
  always `P·n`; ragged_all_to_all only the (token, device) pairs the routes need."""
  ids = np.asarray(nnx.merge(graphdef, params)(x).expert_ids)        # [P, n, K]
  n_dev, n = ids.shape[:2]
  device = ids // (n_experts // n_dev)
  needs = (device[..., None] == np.arange(n_dev)).any(axis=2)          # [src, n, dst]
  ragged = needs.sum(axis=(0, 1))                                     # per destination
  return {"padded_all_to_all": n_dev * n, "ragged_all_to_all_mean": float(ragged.mean()),
          "ragged_all_to_all_max": int(ragged.max()),
          "ragged_over_padded": float(ragged.mean()) / (n_dev * n)}


# (label, model.moe.exchange, replacement of moe._expert_parallel or None)
EXCHANGES = (("all_to_all", "all_to_all", None),
             ("gather", "all_to_all", gather_expert_parallel))


def exchange_row(name, tokens, d_model, base, repeats) -> dict:
  """One device vs the expert axis (all_to_all, and the gather baseline) at one size."""
  cfg = dataclasses.replace(base, impl="ragged")
  row = {"tokens": tokens, "d_model": d_model, "expert_devices": N_EXPERT_DEVICES}
  step, params, x, graphdef = fwd_bwd_step(cfg, d_model, tokens)
  row["one_device"] = timed(step, params, x, repeats, tokens)
  row["rows_received_per_device"] = rows_received(graphdef, params, x, cfg.n_experts)
  mesh = sharding.make_mesh(data=1, expert=N_EXPERT_DEVICES)
  for label, exchange, patch in EXCHANGES:
    ep = dataclasses.replace(cfg, expert_parallel=True, exchange=exchange)
    with jax.set_mesh(mesh), (mock.patch.object(moe_lib, "_expert_parallel", patch) if patch
                              else contextlib.nullcontext()):
      step, params, x, _ = fwd_bwd_step(ep, d_model, tokens, mesh)
      row[label] = timed(step, params, x, repeats, tokens)
    print(f"{name:>6} expert={N_EXPERT_DEVICES} {label:>22}: "
          f"{row[label]['tokens_per_s']:10.0f} tokens/s (fwd+bwd)")
  row["all_to_all_over_gather"] = (row["all_to_all"]["tokens_per_s"]
                                   / row["gather"]["tokens_per_s"])
  row["all_to_all_over_one_device"] = (row["all_to_all"]["tokens_per_s"]
                                       / row["one_device"]["tokens_per_s"])
  return row


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()
  report = {"device": str(jax.devices()[0]), "n_devices": jax.device_count(),
            "jax": jax.__version__, "repeats": args.repeats, "sizes": {}}
  for name, tokens, d_model, base in SIZES:
    row = {"tokens": tokens, "d_model": d_model, **dataclasses.asdict(base)}
    for impl in ("dense", "ragged"):
      step, params, x, _ = fwd_bwd_step(dataclasses.replace(base, impl=impl), d_model, tokens)
      row[impl] = timed(step, params, x, args.repeats, tokens)
      print(f"{name:>6} {impl:>6}: {row[impl]['tokens_per_s']:10.0f} tokens/s (fwd+bwd)")
    row["ragged_over_dense"] = row["ragged"]["tokens_per_s"] / row["dense"]["tokens_per_s"]
    report["sizes"][name] = row
    if name == EXCHANGE_SIZE:
      report["exchange"] = exchange_row(name, tokens, d_model, base, args.repeats)
  _common.write_json(args.out, report)
  print(f"wrote {args.out}")
  ex = report["exchange"]
  print(f"ragged_all_to_all rows / padded rows (counted): "
        f"{ex['rows_received_per_device']['ragged_over_padded']:.2f}")
  print(f"moe_ragged_over_dense_medium: {report['sizes']['medium']['ragged_over_dense']:.2f}")
  print(f"moe_expert4_all_to_all_over_gather: {ex['all_to_all_over_gather']:.2f}")


if __name__ == "__main__":
  main()
