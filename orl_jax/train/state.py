"""Train state, optimizer (AdamW + warmup + clipping + residual scaling) and the jitted step."""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from orl_jax.models.build import build_model, init_model_params
from orl_jax.models import families
from orl_jax.models.family_base import AnyModelConfig
from orl_jax import sharding as sharding_lib

if TYPE_CHECKING:
  from orl_jax.storage.checkpoint import Checkpointer


@struct.dataclass
class TrainState:
  step: jax.Array     # scalar int32: optimizer updates applied
  params: Any         # nnx.State of nnx.Param
  opt_state: Any
  reference: Any = None  # frozen copy of the starting params (ORL's KL anchor), or None;
                         # sharded like params, checkpointed with the state, never updated


@dataclasses.dataclass
class Run:
  """What every training loop starts from (`train.run.prepare_run`; the compile command builds
  one on abstract state)."""
  graphdef: nnx.GraphDef
  state: TrainState
  state_shardings: TrainState     # the state's NamedShardings, leaf for leaf
  optimizer: optax.GradientTransformation
  ckpt: Checkpointer | None       # None: a run that saves nothing (the compile command's)
  found: tuple[str, ...] = ()     # what the work directory held before the run wrote to it


def _state_init(model_cfg: AnyModelConfig, optimizer, seed: int, with_reference: bool):
  """`init(params or None) -> TrainState` (fresh parameters when None)."""
  def init(given):
    p = given if given is not None else init_model_params(model_cfg, seed)[1]
    reference = jax.tree.map(jnp.copy, p) if with_reference else None
    return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=optimizer.init(p),
                      reference=reference)
  return init


def abstract_train_state(model_cfg: AnyModelConfig, optimizer, mesh, seed: int, params=None, *,
                         with_reference: bool = False):
  """(graphdef, state as ShapeDtypeStructs carrying their shardings, shardings): the train
  state `create_train_state` would make on `mesh`, allocating nothing (the compile command
  builds it on compile-only devices)."""
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: build_model(model_cfg, seed, mesh)), nnx.Param)
  abstract = jax.eval_shape(_state_init(model_cfg, optimizer, seed, with_reference), params)
  rules = families.of_model(model_cfg).partition_rules
  shardings = sharding_lib.tree_shardings(abstract, mesh, rules)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract, shardings)
  return graphdef, abstract, shardings


def create_train_state(model_cfg: AnyModelConfig, optimizer, mesh, seed: int, params=None, *,
                       with_reference: bool = False):
  """Creates the state inside `jit(..., out_shardings=...)` so it is born sharded: parameters
  and optimizer moments follow the model family's partition rules on the fsdp/tensor/expert
  axes (replicated when only `data` has more than one device). `with_reference` adds a frozen
  copy of the starting parameters (the KL anchor's reference, docs/method.md#the-losses), sharded
  like them. The returned graphdef carries the mesh to the model's attention (kernels run per device
  inside `shard_map`)."""
  graphdef, _, shardings = abstract_train_state(model_cfg, optimizer, mesh, seed, params,
                                                with_reference=with_reference)
  init = _state_init(model_cfg, optimizer, seed, with_reference)
  state = jax.jit(init, out_shardings=shardings)(params)
  return graphdef, state, shardings


def _check_accumulable(loss_fn, micro_batches: int):
  if getattr(loss_fn, "grad_norm_terms", None):
    raise ValueError(f"loss.term_grad_norms needs micro_batches=1 (got {micro_batches}): the "
                     "terms' gradients are taken on the whole batch")
  if not all(hasattr(loss_fn, f) for f in ("prepare", "split", "micro_loss")):
    raise ValueError(f"micro_batches={micro_batches} needs a loss with prepare/split/micro_loss "
                     f"(e.g. losses.OrlObjective); got {loss_fn!r}")


def _ref_kwargs(graphdef, reference) -> dict:
  """`{"reference": model}` for the loss (no gradient reaches its parameters), or {}."""
  if reference is None:
    return {}
  return {"reference": nnx.merge(graphdef, jax.lax.stop_gradient(reference))}


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _prepare(graphdef, loss_fn, micro_batches: int, n_shards: int, batch, reference):
  """What every micro-batch needs from the whole batch, and the batch cut into micro-batches."""
  batch, totals, carry, fixed = loss_fn.prepare(batch, **_ref_kwargs(graphdef, reference))
  return totals, carry, fixed, loss_fn.split(batch, micro_batches, n_shards)


def _micro_grads(graphdef, loss_fn, params, mb, key, totals, carry, reference):
  kwargs = _ref_kwargs(graphdef, reference)

  def objective(p):
    return loss_fn.micro_loss(nnx.merge(graphdef, p), mb, key, totals, carry, **kwargs)

  (loss, (metrics, carry)), grads = jax.value_and_grad(objective, has_aux=True)(params)
  return ((loss, metrics), grads), carry


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(8,))
def _accumulate(graphdef, loss_fn, params, mb, key, totals, carry, reference, sums):
  """sums + ((loss, metrics), grads) of micro-batch `mb`, and the carry for the next one."""
  out, carry = _micro_grads(graphdef, loss_fn, params, mb, key, totals, carry, reference)
  return jax.tree.map(jnp.add, sums, out), carry


def _term_grad_norms(objective, params, terms: dict[str, str]) -> dict:
  """`grad_norm_<name>`: the global gradient norm of each term of the loss, `terms` mapping a
  name to the metric that holds the term as it enters the objective. One more forward and one
  backward per term (the terms' gradients sum to the update's). The pullbacks run one by one:
  `jax.vmap` of the pullback over the terms' one-hot cotangents gave wrong norms for all but
  the first term on the tiny model (the test compares each with its own `jax.grad`)."""
  def values(p):
    metrics = objective(p)[1]
    return jnp.stack([metrics[m] for m in terms.values()])
  _, pullback = jax.vjp(values, params)
  one_hot = jnp.eye(len(terms), dtype=jnp.float32)
  return {f"grad_norm_{name}": optax.global_norm(pullback(one_hot[i])[0])
          for i, name in enumerate(terms)}


def loss_and_grads(graphdef, loss_fn: Callable, params, batch, key, *, micro_batches: int = 1,
                   n_shards: int = 1, reference=None):
  """((loss, metrics), grads) of one update.

  `reference`: frozen parameters (same graph as `params`) handed to the loss as a model,
  `loss_fn(..., reference=model)`, when not None (ORL's KL anchor); no gradient reaches them.

  `micro_batches` = 1: `loss_fn(model, batch, key) -> (loss, metrics)` on the whole batch.
  `micro_batches` > 1 (gradient accumulation): the batch's rows are split into micro-batches
  (within each of `n_shards` data shards) and a Python loop of jitted calls sums their losses,
  gradients and metrics, so only one micro-batch's activations are alive at a time. (Not a
  `lax.scan`: indexing the micro-batch with the loop counter made XLA:CPU's replay forward and
  backward ~2.3x slower than the same ops on a statically sliced micro-batch. Under an outer
  `jit` the loop is unrolled: same values, no memory bound.) `loss_fn` then follows the protocol
  of `losses.OrlObjective`: `prepare(batch) -> (batch, totals, carry, fixed_metrics)` from the
  whole batch (the per-response normalisers; the batch gains what the reference computes once),
  `split(batch, M, n_shards)` and
  `micro_loss(model, micro, key, totals, carry) -> (loss, (metrics, carry))` whose losses and
  metrics are additive shares, so the sums equal the full-batch values.
  """
  if micro_batches == 1:
    kwargs = _ref_kwargs(graphdef, reference)

    def objective(p):
      return loss_fn(nnx.merge(graphdef, p), batch, key, **kwargs)
    (loss, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params)
    terms = getattr(loss_fn, "grad_norm_terms", None)
    if terms:
      metrics = dict(metrics, **_term_grad_norms(objective, params, terms))
    return (loss, metrics), grads
  _check_accumulable(loss_fn, micro_batches)
  totals, carry, fixed, micro = _prepare(graphdef, loss_fn, micro_batches, n_shards, batch,
                                         reference)
  one = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), micro)
  shapes = jax.eval_shape(functools.partial(_micro_grads, graphdef, loss_fn), params, one, key,
                          totals, carry, reference)
  sums = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes[0])
  for i in range(micro_batches):  # a static slice per micro-batch
    mb = jax.tree.map(lambda x, i=i: x[i], micro)
    sums, carry = _accumulate(graphdef, loss_fn, params, mb, key, totals, carry, reference,
                              sums)
  (loss, metrics), grads = sums
  return (loss, dict(metrics, **fixed)), grads


def _apply_update(optimizer, state: TrainState, loss, metrics, grads):
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, loss=loss, grad_norm=optax.global_norm(grads))
  return (dataclasses.replace(state, step=state.step + 1, params=params, opt_state=opt_state),
          metrics)


def _lag_metrics(state: TrainState, batch) -> dict:
  """Policy lag of an on-policy batch: updates applied since its rollout was drawn; computed
  from the parameter version the batch carries, inside the step. It is the ORL loop's
  `orl.max_staleness` at most, and equals the iteration's logged `staleness`: 0 on-policy, 1
  when the rollout was dispatched before the previous update (docs/training.md#one-step-of-lag)."""
  if not hasattr(batch, "rollout_step"):
    return {}
  return {"policy_lag": state.step - batch.rollout_step}


def make_train_step(graphdef, optimizer, loss_fn: Callable, mesh, state_shardings,
                    batch_shardings=None, *, micro_batches: int = 1):
  """`(state, batch, base_key) -> (state, metrics)`; the step RNG is `fold_in(base_key, step)`
  so a resumed run draws the same noise. `batch_shardings` defaults to splitting every batch
  leaf's leading dimension over the data axes.

  `micro_batches` = 1: one jitted function (state donated). `micro_batches` > 1 accumulates
  gradients over row micro-batches (`loss_and_grads`; every micro-batch gets the step's key),
  then applies one optimizer update: an `AccumulatedStep` of jitted pieces, same signature.
  """
  n_shards = sharding_lib.n_batch_shards(mesh.shape)
  repl = sharding_lib.replicated(mesh)
  if batch_shardings is None:
    batch_shardings = sharding_lib.batch_sharding(mesh)

  if micro_batches == 1:
    def step(state: TrainState, batch, base_key):
      key = jax.random.fold_in(base_key, state.step)
      (loss, metrics), grads = loss_and_grads(graphdef, loss_fn, state.params, batch, key,
                                              reference=state.reference)
      metrics = dict(metrics, **_lag_metrics(state, batch))
      return _apply_update(optimizer, state, loss, metrics, grads)

    return jax.jit(step, in_shardings=(state_shardings, batch_shardings, repl),
                   out_shardings=(state_shardings, repl), donate_argnums=(0,))

  return AccumulatedStep(graphdef, optimizer, loss_fn, state_shardings, batch_shardings, repl,
                         micro_batches, n_shards)


class AccumulatedStep:
  """`make_train_step` with `micro_batches` > 1: a Python function of jitted pieces (the step
  key, `_prepare` — the reference's forward included —, `_accumulate` per micro-batch and the
  optimizer `update`), each of which the compile command compiles on its own."""

  def __init__(self, graphdef, optimizer, loss_fn, state_shardings, batch_shardings, repl,
               micro_batches: int, n_shards: int):
    _check_accumulable(loss_fn, micro_batches)
    self.graphdef, self.loss_fn = graphdef, loss_fn
    self.batch_shardings = batch_shardings
    self.micro_batches, self.n_shards = micro_batches, n_shards
    self.step_key = jax.jit(jax.random.fold_in, out_shardings=repl)
    self.update = jax.jit(functools.partial(_apply_update, optimizer),
                          out_shardings=(state_shardings, repl), donate_argnums=(0,))

  def __call__(self, state: TrainState, batch, base_key):
    batch = jax.device_put(batch, self.batch_shardings)
    key = self.step_key(base_key, state.step)
    (loss, metrics), grads = loss_and_grads(
        self.graphdef, self.loss_fn, state.params, batch, key, micro_batches=self.micro_batches,
        n_shards=self.n_shards, reference=state.reference)
    metrics = dict(metrics, **_lag_metrics(state, batch))
    return self.update(state, loss, metrics, grads)
