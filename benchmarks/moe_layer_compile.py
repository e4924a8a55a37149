"""One MoE layer, forward + backward, compiled for a TPU topology or GPU node (no device needed):
per-device temporaries of the layer alone, at a run's replay rows.

  python benchmarks/moe_layer_compile.py [--target v5p:2x2x2] [--rows 16] [--row_len 4096]
      [--out benchmarks/results/moe_layer_compile.json]

The layer is DiffusionGemma-26B-A4B's (128 experts, top-8, 704 wide, d_model 2816, bf16
activations, float32 weights), its experts split over an `expert` axis of all the target's
devices and its tokens over the same axis, traced on the mesh as every entry point traces
(`sharding.tracing_mesh`): the expert-parallel exchange of `moe.expert_parallel_experts`.
Its dropless buffers are sized for the worst case (every token of every device routed to this
device's experts: devices x tokens a device x top-k rows), which this figure measures apart
from the rest of the train step (`launch/compile.py --programs=train_step`). Needs the
compilers: `make compilers`. The last line is the headline, `moe_layer_temp_gib: <GiB>`.
"""
import argparse
import os
import time

import _common
from orl_jax.aot import targets

targets.prepare_host()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from orl_jax import sharding  # noqa: E402
from orl_jax.models.diffusion_gemma import family  # noqa: E402
from orl_jax.models.diffusion_gemma import model as dg  # noqa: E402
from orl_jax.models.diffusion_gemma.config import release_26b_a4b  # noqa: E402
from pallas_kernels.platform import target_platform  # noqa: E402

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "moe_layer_compile.json")


class _Layer(nnx.Module):
  """The MoE block of one decoder layer (its router, experts and their partition rules)."""

  def __init__(self, cfg):
    self.moe = dg.MoE(cfg, nnx.Rngs(0))


def compile_layer(target: targets.Target, rows: int, row_len: int) -> dict:
  """Compiles the layer's loss gradient for `target`; its memory analysis per device."""
  devices = targets.topology_devices(target)
  cfg = release_26b_a4b(moe_impl="ragged", dtype="bfloat16", param_dtype="float32")
  mesh = sharding.make_mesh(1, 1, 1, devices=devices, expert=len(devices))
  graphdef, params = nnx.split(nnx.eval_shape(lambda: _Layer(cfg)))
  shardings = sharding.tree_shardings(params, mesh, family.PARTITION_RULES)
  params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        params, shardings)
  x = jax.ShapeDtypeStruct((rows, row_len, cfg.d_model), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P((sharding.EXPERT_AXIS,))))

  def loss(params, x):
    y, _ = nnx.merge(graphdef, params).moe(x, x)
    return jnp.sum(y.astype(jnp.float32) ** 2)

  t0 = time.perf_counter()
  with target_platform(target.platform, target.gpu), sharding.tracing_mesh(mesh):
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x)
  mem = lowered.compile().memory_analysis()
  tokens = rows * row_len // len(devices)
  return dict(target=target.label, devices=len(devices), rows=rows, row_len=row_len,
              tokens_per_device=tokens,
              worst_case_expert_rows_per_device=len(devices) * tokens * cfg.top_k,
              compile_seconds=time.perf_counter() - t0,
              temp_bytes=int(mem.temp_size_in_bytes),
              argument_bytes=int(mem.argument_size_in_bytes),
              output_bytes=int(mem.output_size_in_bytes))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--target", default="v5p:2x2x2")
  parser.add_argument("--rows", type=int, default=16)
  parser.add_argument("--row_len", type=int, default=4096)
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()
  result = compile_layer(targets.parse_target(args.target), args.rows, args.row_len)
  for key, value in result.items():
    print(f"{key}: {value}")
  _common.write_json(args.out, result)
  print(f"results: {args.out}")
  print(f"moe_layer_temp_gib: {result['temp_bytes'] / 2**30:.2f}")


if __name__ == "__main__":
  main()
