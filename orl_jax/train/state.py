"""Train state, optimizer (AdamW + warmup + clipping + residual scaling) and the jitted step."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from orl_jax.models.transformer import ModelConfig, Transformer
from orl_jax import sharding as sharding_lib


@struct.dataclass
class TrainState:
  step: jax.Array     # scalar int32
  params: Any         # nnx.State of nnx.Param
  opt_state: Any


def param_labels(params) -> Any:
  """'residual' for the residual adapter's parameters, 'base' for everything else."""
  def label(path, _):
    return "residual" if any(getattr(k, "key", k) == "adapter" for k in path) else "base"
  return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(train_cfg, residual_lr_scale: float, freeze_base: bool = False):
  """AdamW with linear warmup and cosine decay, global-norm clipping, and a separate learning
  rate for the residual adapter (`lr * model.residual.lr_scale`, DESIGN §2.1 residual scaling)."""
  def schedule(scale):
    return optax.warmup_cosine_decay_schedule(
        0.0, train_cfg.lr * scale, max(train_cfg.warmup_steps, 1), max(train_cfg.steps, 2),
        end_value=train_cfg.lr * scale * train_cfg.final_lr_fraction)

  def adamw(scale):
    return optax.adamw(schedule(scale), b1=train_cfg.b1, b2=train_cfg.b2,
                       weight_decay=train_cfg.weight_decay)

  base = optax.set_to_zero() if freeze_base else adamw(1.0)
  return optax.chain(
      optax.clip_by_global_norm(train_cfg.grad_clip),
      optax.multi_transform({"base": base, "residual": adamw(residual_lr_scale)}, param_labels))


def init_model_params(model_cfg: ModelConfig, seed: int):
  """(graphdef, params) of a freshly initialised model."""
  model = Transformer(model_cfg, rngs=nnx.Rngs(seed))
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, params


def create_train_state(model_cfg: ModelConfig, optimizer, mesh, seed: int, params=None):
  """Creates the state inside `jit(..., out_shardings=...)` so it is born sharded: parameters
  and optimizer moments follow `sharding.PARTITION_RULES` on the fsdp/tensor axes (replicated
  when the mesh has fsdp = tensor = 1)."""
  graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: Transformer(model_cfg,
                                                                          rngs=nnx.Rngs(seed))),
                                        nnx.Param)

  def init(given):
    p = given if given is not None else init_model_params(model_cfg, seed)[1]
    return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=optimizer.init(p))

  abstract = jax.eval_shape(init, params)
  shardings = sharding_lib.tree_shardings(abstract, mesh)
  state = jax.jit(init, out_shardings=shardings)(params)
  return graphdef, state, shardings


def make_train_step(graphdef, optimizer, loss_fn: Callable, mesh, state_shardings,
                    batch_shardings=None):
  """Jitted `(state, batch, base_key) -> (state, metrics)`; the step RNG is
  `fold_in(base_key, step)` so a resumed run draws the same noise. `batch_shardings` defaults
  to splitting every batch leaf's leading dimension over the data axes."""

  def step(state: TrainState, batch, base_key):
    key = jax.random.fold_in(base_key, state.step)

    def objective(params):
      return loss_fn(nnx.merge(graphdef, params), batch, key)

    (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

  repl = sharding_lib.replicated(mesh)
  if batch_shardings is None:
    batch_shardings = sharding_lib.batch_sharding(mesh)
  return jax.jit(step, in_shardings=(state_shardings, batch_shardings, repl),
                 out_shardings=(state_shardings, repl), donate_argnums=(0,))
