"""Exact state capture (docs/method.md#rollout-with-exact-state-capture): the fixed-size device
buffers a decode records into (`Capture` and `RouteCapture`, `orl_jax.models.decoded`), the state
each denoising step consumed (`capture_step`, `record_state`), and the check that route capture
can be exact."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orl_jax import residual as residual_lib
from orl_jax.decode.config import DecodeConfig
from orl_jax.models.decoded import ROUTE_DTYPE, Capture, RouteCapture, token_major_routes
from orl_jax.models.transformer import ModelConfig, Transformer
from orl_jax.residual import Residual


def masked_positions(state_tokens, commit, mask_id: int):
  """The mask tokens of captured blocks (`Sampler.unresolved` of the block samplers). Here,
  below the samplers, so that replay and the loop can default to it without importing them."""
  return state_tokens == mask_id


def empty_capture(b_rows, cfg: DecodeConfig, d_model, z_dtype, route_dims=None) -> Capture:
  """route_dims: (prompt length, MoE layers, experts per token) when capturing routes."""
  s, b, k = cfg.capture_states, cfg.block_size, cfg.top_k
  i32 = lambda *shape: jnp.zeros(shape, jnp.int32)
  f32 = lambda *shape: jnp.zeros(shape, jnp.float32)
  routes = None
  if route_dims is not None:
    p, n_layers, top_k = route_dims
    none = lambda *shape: jnp.full(shape + (n_layers, top_k), -1, ROUTE_DTYPE)
    routes = RouteCapture(state=none(b_rows, s, b), prompt=none(b_rows, p),
                          clean=none(b_rows, cfg.max_blocks * b))
  return Capture(block_tokens=i32(b_rows, s, b), block=i32(b_rows, s), step=i32(b_rows, s),
                 z=jnp.zeros((b_rows, s, b, d_model), z_dtype), alpha=f32(b_rows, s, b),
                 entropy=f32(b_rows, s, b), topk_ids=i32(b_rows, s, b, k),
                 topk_logprobs=f32(b_rows, s, b, k), commit=jnp.zeros((b_rows, s, b), bool),
                 valid=jnp.zeros((b_rows, s), bool), n_states=i32(b_rows),
                 overflow=jnp.zeros((b_rows,), bool), routes=routes,
                 block_final=i32(b_rows, cfg.max_blocks * b))


def captured_top_k(mcfg: ModelConfig) -> int:
  """Experts per token of the MoE model whose routes a decode captures."""
  assert mcfg.moe is not None, "check_route_capture: capture_routes needs an MoE model"
  return mcfg.moe.top_k


def new_capture(model: Transformer, cfg: DecodeConfig, b_rows: int, p: int) -> Capture | None:
  """The empty capture of a decode of `b_rows` prompts of length `p` (None without
  `capture_states`), with the route buffers of `capture_routes`."""
  if not cfg.capture_states:
    return None
  mcfg = model.cfg
  route_dims = (p, mcfg.n_moe_layers, captured_top_k(mcfg)) if cfg.capture_routes else None
  return empty_capture(b_rows, cfg, mcfg.d_model, mcfg.compute_dtype, route_dims)


def record_state(cap: Capture, do: jax.Array, routes=None, rows=None, **fields) -> Capture:
  """Writes one state per row where `do` [B] is true (mode='drop' past the buffer's end).
  routes: the step's [L_moe, B, b, K] expert ids (with `capture_routes`). rows: [B] int32 the
  capture row each batch row writes to (default: its own; `orl_jax.decode.per_row` passes each row's
  prompt slot, distinct where `do`, out of bounds where `do` is false)."""
  s = cap.valid.shape[1]
  if rows is None:
    rows = jnp.arange(do.shape[0])
  n_states = cap.n_states.at[rows].get(mode="fill", fill_value=s)
  idx = jnp.where(do, n_states, s)      # s is out of bounds -> dropped
  upd = {name: getattr(cap, name).at[rows, idx].set(val, mode="drop")
         for name, val in fields.items()}
  if routes is not None:
    assert cap.routes is not None, "routes are recorded into a capture with route buffers"
    state = cap.routes.state.at[rows, idx].set(token_major_routes(routes), mode="drop")
    upd["routes"] = cap.routes._replace(state=state)
  upd["valid"] = cap.valid.at[rows, idx].set(True, mode="drop")
  rows = jnp.where(do, rows, cap.valid.shape[0])   # rows that record nothing write nothing
  overflow = cap.overflow.at[rows].get(mode="fill", fill_value=False) | (n_states >= s)
  upd["overflow"] = cap.overflow.at[rows].set(overflow, mode="drop")
  upd["n_states"] = cap.n_states.at[rows].set(jnp.minimum(n_states + 1, s), mode="drop")
  return cap._replace(**upd)


def capture_step(cfg: DecodeConfig, cap: Capture | None, need, logits, tokens, res: Residual,
                 write, block, step, routes=None, rows=None) -> Capture | None:
  """Records the state a step consumed (`tokens` [B, b] and `res` before the step), its
  prediction (`logits` [B, b, V]: normalized entropy, top-K) and what it wrote, for the rows
  `need` (`record_state`; `rows`: their capture rows). Unchanged without `capture_states`."""
  if not cfg.capture_states:
    return cap
  assert cap is not None, "new_capture makes a capture with capture_states"
  logp = jax.nn.log_softmax(logits, axis=-1)
  top_lp, top_ids = jax.lax.top_k(logp, cfg.top_k)
  return record_state(cap, need, routes, rows=rows, block_tokens=tokens, block=block,
                      step=step, z=res.z, alpha=res.alpha,
                      entropy=residual_lib.normalized_entropy(logits), topk_ids=top_ids,
                      topk_logprobs=top_lp, commit=write)


def check_route_capture(model: Transformer, cfg: DecodeConfig):
  """Route capture needs an MoE model decoded block-causally through the KV cache (the only
  decoding whose forwards match the packed replay rows token for token; the lock-step decoder
  and the per-row engine both check here)."""
  if not cfg.capture_routes:
    return
  mcfg = model.cfg
  if mcfg.moe is None or not mcfg.n_moe_layers:
    raise ValueError("orl.capture_routes records MoE routes, but the model has no MoE layer: "
                     "set orl.capture_routes=False")
  if mcfg.attention == "bidirectional" or not cfg.kv_cache:
    raise ValueError("orl.capture_routes needs a block-causal model decoded through the KV "
                     f"cache (model.attention={mcfg.attention!r}, kv_cache={cfg.kv_cache})")
  if mcfg.moe.n_experts > jnp.iinfo(ROUTE_DTYPE).max:
    raise ValueError(f"orl.capture_routes stores expert ids as {jnp.dtype(ROUTE_DTYPE).name}: "
                     f"model.moe.n_experts={mcfg.moe.n_experts} does not fit")
