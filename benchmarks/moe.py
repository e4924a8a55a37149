"""Tokens/s of the LLaDA2 MoE layer (forward + backward), ragged vs dense expert compute, at two
sizes, side by side in one process (orl_jax/models/moe.py).

On CPU `jax.lax.ragged_dot` expands to a dense `[E, m, k]` product, so expect the dense path to
win there; the ragged (dropless grouped matmul) path is the one for TPU/GPU.

  python benchmarks/moe.py [--repeats 5] [--out benchmarks/results/moe.json]
"""
import argparse
import dataclasses
import os

import _common  # noqa: F401
import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax.models.moe import MoE, MoEConfig

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "moe.json")
# (name, tokens, d_model, MoEConfig): LLaDA2-shaped routing (groups, top-k inside kept groups).
SIZES = (
    ("small", 512, 64, MoEConfig(n_experts=8, top_k=2, expert_dim=32, n_group=2, topk_group=1,
                                 routed_scaling_factor=2.5)),
    ("medium", 1024, 128, MoEConfig(n_experts=16, top_k=4, expert_dim=64, n_group=4,
                                    topk_group=2, routed_scaling_factor=2.5)),
)


def fwd_bwd_step(cfg: MoEConfig, d_model: int, tokens: int):
  """(jitted step, params, x): loss and gradients of one MoE layer."""
  graphdef, params = nnx.split(MoE(cfg, d_model, dtype=jnp.float32, param_dtype=jnp.float32,
                                   shared_experts=None, rngs=nnx.Rngs(0)))
  x = jax.random.normal(jax.random.key(1), (1, tokens, d_model))

  @jax.jit
  def step(params, x):
    return jax.value_and_grad(lambda p: jnp.mean(nnx.merge(graphdef, p)(x).y ** 2))(params)

  return step, params, x


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()
  report = {"device": str(jax.devices()[0]), "jax": jax.__version__, "repeats": args.repeats,
            "sizes": {}}
  for name, tokens, d_model, base in SIZES:
    row = {"tokens": tokens, "d_model": d_model, **dataclasses.asdict(base)}
    for impl in ("dense", "ragged"):
      step, params, x = fwd_bwd_step(dataclasses.replace(base, impl=impl), d_model, tokens)
      jax.block_until_ready(step(params, x))                       # compile + warm up
      seconds, times = _common.median_time(lambda: jax.block_until_ready(step(params, x)),
                                           args.repeats)
      row[impl] = {"median_s": seconds, "times_s": times, "tokens_per_s": tokens / seconds}
      print(f"{name:>6} {impl:>6}: {tokens / seconds:10.0f} tokens/s (fwd+bwd)")
    row["ragged_over_dense"] = row["ragged"]["tokens_per_s"] / row["dense"]["tokens_per_s"]
    report["sizes"][name] = row
  _common.write_json(args.out, report)
  print(f"wrote {args.out}")
  print(f"moe_ragged_over_dense_medium: {report['sizes']['medium']['ragged_over_dense']:.2f}")


if __name__ == "__main__":
  main()
