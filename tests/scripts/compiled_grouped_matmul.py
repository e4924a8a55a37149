"""The MoE expert compute (`orl_jax.models.moe.ragged_experts`, forward and backward) compiled
for one H100 by XLA's GPU compiler on this host (run by tests/kernels/test_grouped_matmul.py in a
subprocess: the compiler is set up before JAX starts). LLaDA2.1-mini's expert sizes (2048 ->
512, top-8) over 32 experts and 2048 tokens, bf16; once as an H100 (Hopper: the Mosaic GPU
kernels), once as an A100 (`jax.lax.ragged_dot`, which XLA expands over every expert). Prints
one JSON line: per GPU, the compiled program's temporary bytes and its Mosaic GPU calls.

  python tests/scripts/compiled_grouped_matmul.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from orl_jax.aot import targets  # noqa: E402

targets.use_compiler("cuda")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from orl_jax.models import moe  # noqa: E402
from pallas_kernels.platform import target_platform  # noqa: E402

TOKENS, D, F, EXPERTS, TOP_K = 2048, 2048, 512, 32, 8


def loss(x, w, ids, weights):
  routed = moe.RoutedTokens(ids, weights, None)
  return jnp.sum(moe.ragged_experts(x, routed, w).astype(jnp.float32) ** 2)


def compiled(gpu: str) -> dict:
  target = targets.parse_target(f"{gpu}x1")
  device = targets.topology_devices(target)[0]
  rep = NamedSharding(jax.sharding.Mesh([device], ("x",)), P())
  s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rep)
  w = moe.ExpertWeights(*(s((EXPERTS, D, F), jnp.bfloat16),) * 2, s((EXPERTS, F, D), jnp.bfloat16))
  args = (s((TOKENS, D), jnp.bfloat16), w, s((TOKENS, TOP_K), jnp.int32),
          s((TOKENS, TOP_K), jnp.float32))
  with target_platform("cuda", target.gpu):
    lowered = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args)
  c = lowered.compile()
  text = c.as_text() or ""
  return {"temp_bytes": int(c.memory_analysis().temp_size_in_bytes),
          "mosaic_gpu_calls": text.count('custom_call_target="mosaic_gpu')}


if __name__ == "__main__":
  print(json.dumps({gpu: compiled(gpu) for gpu in ("h100", "a100")}))
