"""A small MoE feed-forward of the tests (orl_jax/models/moe.py) with random weights, its inputs,
and jitted forward / loss-and-gradient functions (also run by the expert-axis scripts of
tests/models/test_moe.py in their own processes)."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orl_jax.models.moe import MoE, MoEConfig
from orl_jax.sharding import path_name

CFG = MoEConfig(n_experts=8, top_k=2, expert_dim=12, n_group=4, topk_group=2,
                routed_scaling_factor=2.5, impl="dense")


def random_moe(cfg: MoEConfig, seed=0, d_model=16):
  """An MoE with a random expert bias (built abstractly, then filled: eager init is slow)."""
  graphdef, params = nnx.split(nnx.eval_shape(
      lambda: MoE(cfg, d_model, dtype=jnp.float32, param_dtype=jnp.float32,
                  shared_experts=None, rngs=nnx.Rngs(seed))))
  rng = np.random.default_rng(seed)

  def fill(path, leaf):
    scale = 0.3 if path_name(path).endswith("expert_bias") else leaf.shape[-2] ** -0.5
    return jnp.asarray(scale * rng.standard_normal(leaf.shape), jnp.float32)

  return graphdef, jax.tree_util.tree_map_with_path(fill, params)


def random_x(seed, b=2, t=8, d=16):
  return jnp.asarray(np.random.default_rng(seed).standard_normal((b, t, d)), jnp.float32)


apply_moe = jax.jit(
    lambda graphdef, params, x, routes=None: nnx.merge(graphdef, params)(x, routes),
    static_argnums=0)


def sin_loss(graphdef, params, x):
  return jnp.sum(jnp.sin(nnx.merge(graphdef, params)(x).y))


sin_loss_and_grads = jax.jit(jax.value_and_grad(sin_loss, argnums=(1, 2)), static_argnums=0)
