"""Mixture-of-experts feed-forward of LLaDA2.x (docs/models.md#moe-llada2x-mini), pluggable in place
of the dense MLP.

Router (the official LLaDA2 / Ling-2 gate): f32 logits -> sigmoid scores `s`; the `expert_bias`
(aux-loss-free balancing state, never trained by gradient) is added **for selection only**:
groups are scored by the sum of their two best biased scores, the `topk_group` best of `n_group`
groups are kept, and the top-k biased scores inside them pick the experts. The weights are the
*unbiased* scores of the chosen experts, normalised by their sum (+1e-20) and multiplied by
`routed_scaling_factor`. Shared experts (one SwiGLU of width `n_shared * expert_dim`) are added.

Expert compute (`impl`, chosen by config, never silently):
* ``"ragged"`` — dropless: the (token, expert) assignments are sorted by expert and the SwiGLU
  runs as three grouped matmuls (`pallas_kernels.grouped_matmul.ragged_dot`: `jax.lax.ragged_dot`,
  native on TPU; jax's Mosaic GPU kernels on Hopper GPUs, where XLA would expand it over every
  expert; on CPU a dense `[E, m, k]` expansion, so it is for tiny tests there).
* ``"dense"``  — every expert on every token, combined with the routing weights (zero for the
  experts a token did not choose): the tiny-CPU fallback and the oracle of the ragged path.

Expert parallelism (`expert_parallel`): the expert weights are split over the mesh axis
``"expert"``, which also splits the tokens. Inside `shard_map` each device routes its own tokens
(captured routes included), sends every token once to each device that holds one of its experts
(with its expert ids and weights), runs its experts on what it received (ragged, dropless), and
sends the summed partial outputs back, where they add up at the token's owner. `exchange` picks
the collective (`EXCHANGES`):
* ``"ragged_all_to_all"`` — `jax.lax.ragged_all_to_all`: only those rows travel, packed by
  destination (TPU/GPU; XLA:CPU does not implement it: asked for there, it runs as
  ``all_to_all``, with one warning).
* ``"all_to_all"`` — the same slices padded to the exact worst case of `n` rows per destination
  (a device may need all `n` local tokens, never one twice) and moved by one `jax.lax.all_to_all`
  (`padded_all_to_all`): static shapes, dropless, runs everywhere; it moves `P·n·D` per device
  each way, as much as an all-gather.
* ``"auto"`` — ``ragged_all_to_all`` on TPU/GPU, ``all_to_all`` elsewhere.

Route capture (exact replay, issue 13): `__call__` returns the chosen expert ids of every token
and accepts given ids (`-1` in a token's first slot = route it afresh); the weights are always
recomputed from the current router, so the router still gets gradients under replay.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from pallas_kernels import grouped_matmul
from pallas_kernels.platform import current_platform

IMPLS = ("ragged", "dense")
EXCHANGES = ("auto", "all_to_all", "ragged_all_to_all")
# MoEConfig fields that are run-time choices (model.moe.*), not architecture (config.json)
RUNTIME_FIELDS = ("impl", "exchange", "expert_parallel", "freeze_router")
EXPERT_AXIS = "expert"
_TOKEN_AXES = ("data", "fsdp")   # with "expert", the batch axes (orl_jax.sharding.BATCH_AXES)
_warned: set[str] = set()


def _warn_once(msg: str) -> None:
  if msg not in _warned:
    _warned.add(msg)
    logging.warning(msg)


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  n_experts: int
  top_k: int
  expert_dim: int                     # moe_intermediate_size
  n_group: int = 1
  topk_group: int = 1
  n_shared: int = 0                   # shared experts (fused into one SwiGLU of n_shared widths)
  routed_scaling_factor: float = 1.0
  impl: str = "dense"                 # ragged | dense
  expert_parallel: bool = False       # split experts over the mesh axis "expert" (shard_map)
  exchange: str = "auto"              # expert-parallel token exchange, one of EXCHANGES
  freeze_router: bool = False         # router kernel gets no gradient (stop_gradient)

  def validate(self) -> None:
    """Raises ValueError naming the model.moe.* field that is inconsistent."""
    if self.impl not in IMPLS:
      raise ValueError(f"model.moe.impl must be one of {IMPLS}, got {self.impl!r}")
    if self.exchange not in EXCHANGES:
      raise ValueError(f"model.moe.exchange must be one of {EXCHANGES}, got {self.exchange!r}")
    if self.n_experts % self.n_group:
      raise ValueError(f"model.moe.n_group={self.n_group} must divide "
                       f"model.moe.n_experts={self.n_experts}")
    if not 1 <= self.topk_group <= self.n_group:
      raise ValueError(f"model.moe.topk_group={self.topk_group} must be in [1, n_group="
                       f"{self.n_group}]")
    if self.expert_parallel and self.impl != "ragged":
      raise ValueError("model.moe.expert_parallel runs the ragged (dropless) expert compute: "
                       f"set model.moe.impl='ragged' (got {self.impl!r})")
    kept = self.topk_group * (self.n_experts // self.n_group)
    if not 1 <= self.top_k <= kept:
      raise ValueError(f"model.moe.top_k={self.top_k} must be in [1, {kept}] (the experts of "
                       f"the topk_group={self.topk_group} kept groups)")


class RoutedTokens(NamedTuple):
  expert_ids: jax.Array   # [N, K] int32 chosen experts
  weights: jax.Array      # [N, K] f32 combine weights (unbiased, normalised, scaled)
  scores: jax.Array | None  # [N, E] f32 sigmoid scores (load-balance loss); None once exchanged


def route(logits: jax.Array, expert_bias: jax.Array, cfg: MoEConfig,
          given_ids: jax.Array | None = None) -> RoutedTokens:
  """Group-limited top-k selection on biased sigmoid scores. logits: [N, E] f32.

  `given_ids` [N, K] replaces the selection of every token whose first entry is >= 0 (a
  captured route); the weights always come from the current scores of the chosen experts.
  """
  n, e = logits.shape
  scores = jax.nn.sigmoid(logits.astype(jnp.float32))
  biased = scores + expert_bias.astype(jnp.float32)
  per_group = e // cfg.n_group
  grouped = biased.reshape(n, cfg.n_group, per_group)
  group_score = jnp.sum(jax.lax.top_k(grouped, min(2, per_group))[0], axis=-1)   # [N, G]
  _, kept_groups = jax.lax.top_k(group_score, cfg.topk_group)
  group_kept = jnp.sum(jax.nn.one_hot(kept_groups, cfg.n_group, dtype=jnp.int32), axis=1) > 0
  expert_kept = jnp.repeat(group_kept, per_group, axis=-1)                       # [N, E]
  _, ids = jax.lax.top_k(jnp.where(expert_kept, biased, -jnp.inf), cfg.top_k)
  if given_ids is not None:
    ids = jnp.where(given_ids[:, :1] >= 0, given_ids.astype(ids.dtype), ids)
  chosen = jnp.take_along_axis(scores, ids, axis=-1)
  weights = chosen / (jnp.sum(chosen, axis=-1, keepdims=True) + 1e-20)
  return RoutedTokens(ids, weights * cfg.routed_scaling_factor, scores)


# ----------------------------------------------------------------------------- expert compute


class ExpertWeights(NamedTuple):
  gate: jax.Array   # [E, D, F]
  up: jax.Array     # [E, D, F]
  down: jax.Array   # [E, F, D]


def dense_experts(x, routed: RoutedTokens, w: ExpertWeights, act=jax.nn.silu):
  """Every expert on every token, combined by the routing weights. x: [N, D] -> [N, D].
  `act` is the gate activation (SiLU: LLaDA2; tanh-GELU: DiffusionGemma)."""
  n, e = x.shape[0], w.gate.shape[0]
  combine = jnp.zeros((n, e), jnp.float32).at[jnp.arange(n)[:, None],
                                               routed.expert_ids].add(routed.weights)
  h = act(jnp.einsum("nd,edf->enf", x, w.gate)) * jnp.einsum("nd,edf->enf", x, w.up)
  y = jnp.einsum("enf,efd->end", h, w.down, preferred_element_type=jnp.float32)
  return jnp.einsum("end,ne->nd", y, combine).astype(x.dtype)


def ragged_experts(x, routed: RoutedTokens, w: ExpertWeights, expert_offset=0, act=jax.nn.silu):
  """Dropless grouped SwiGLU of the assignments whose expert is one of the `E_local` experts in
  `w` (ids `expert_offset .. expert_offset + E_local - 1`); the other assignments contribute
  nothing. x: [N, D] -> [N, D]."""
  n, k = routed.expert_ids.shape
  n_local = w.gate.shape[0]
  local_ids = routed.expert_ids.reshape(-1) - expert_offset              # [N*K]
  is_local = (local_ids >= 0) & (local_ids < n_local)
  sort_key = jnp.where(is_local, local_ids, n_local)                     # others sort last
  order = jnp.argsort(sort_key, stable=True)
  group_sizes = jnp.bincount(sort_key, length=n_local + 1)[:n_local].astype(jnp.int32)
  token_of = order // k                                                  # [N*K] source token
  xs = x[token_of]
  h = (act(grouped_matmul.ragged_dot(xs, w.gate, group_sizes))
       * grouped_matmul.ragged_dot(xs, w.up, group_sizes))
  ys = grouped_matmul.ragged_dot(h, w.down, group_sizes, preferred_element_type=jnp.float32)
  # Rows past sum(group_sizes) belong to no local expert: select, never multiply (their
  # content is unspecified on some backends).
  weight = routed.weights.reshape(-1)[order]
  ys = jnp.where(is_local[order][:, None], ys * weight[:, None], 0.0)
  return jnp.zeros((n, x.shape[-1]), jnp.float32).at[token_of].add(ys).astype(x.dtype)


class RaggedSlices(NamedTuple):
  """The arguments of `jax.lax.ragged_all_to_all` after its two arrays: device `d`'s slice is
  `input_offsets[d] : input_offsets[d] + send_sizes[d]` of the operand and lands at
  `output_offsets[d]` of device `d`'s output; `recv_sizes[s]` rows arrive from device `s`."""
  input_offsets: jax.Array    # [P] int32
  send_sizes: jax.Array       # [P] int32
  output_offsets: jax.Array   # [P] int32 (in the receiver's output)
  recv_sizes: jax.Array       # [P] int32

  def reverse(self) -> RaggedSlices:
    """The slices that send every received slice back to where it came from."""
    a2a = lambda v: jax.lax.all_to_all(v, EXPERT_AXIS, 0, 0, tiled=True)
    return RaggedSlices(a2a(self.output_offsets), self.recv_sizes, a2a(self.input_offsets),
                        self.send_sizes)


def padded_all_to_all(operand, output, slices: RaggedSlices, capacity: int):
  """`jax.lax.ragged_all_to_all` over the expert axis with static shapes: every slice, padded to
  `capacity` rows (at least its size), travels in one `jax.lax.all_to_all`. Runs on CPU."""
  n_dev = slices.send_sizes.shape[0]
  row = jnp.arange(capacity)
  take = jnp.clip(slices.input_offsets[:, None] + row, 0, operand.shape[0] - 1)    # [P, C]
  got = jax.lax.all_to_all(operand[take], EXPERT_AXIS, 0, 0, tiled=True)      # [P, C, ...]
  start = jax.lax.all_to_all(slices.output_offsets, EXPERT_AXIS, 0, 0, tiled=True)
  put = jnp.where(row < slices.recv_sizes[:, None], start[:, None] + row, output.shape[0])
  return output.at[put.reshape(-1)].set(got.reshape((n_dev * capacity,) + got.shape[2:]),
                                        mode="drop")


def ragged_all_to_all(operand, output, slices: RaggedSlices, capacity: int):
  """`jax.lax.ragged_all_to_all` over the expert axis (`capacity` unused: the signature of
  `padded_all_to_all`)."""
  del capacity
  return jax.lax.ragged_all_to_all(operand, output, *slices, axis_name=EXPERT_AXIS)


def exchange_experts(exchange: str):
  """The per-device exchange-and-compute function of `exchange` on the platform being traced for
  (`auto`: ragged on TPU/GPU). `ragged_all_to_all` asked for off TPU/GPU runs padded, with one
  warning (XLA:CPU lacks the collective)."""
  platform = current_platform()
  if exchange == "auto":
    exchange = "ragged_all_to_all" if platform in ("tpu", "gpu") else "all_to_all"
  if exchange == "ragged_all_to_all" and platform not in ("tpu", "gpu"):
    _warn_once(f"model.moe.exchange='ragged_all_to_all' does not run on {platform}: its slices "
               "travel padded (jax.lax.all_to_all) instead")
    exchange = "all_to_all"
  collective = ragged_all_to_all if exchange == "ragged_all_to_all" else padded_all_to_all
  return functools.partial(_exchange_experts, collective=collective)


def _send_plan(ids, n_local: int, n_dev: int):
  """Which local token goes to which device: (token [n*min(K,P)] int32 (sent rows, destination-
  major; rows past the sent count are filler), dest_of_row [same], send_sizes [P] int32)."""
  n, k = ids.shape
  on_dev = jnp.any((ids // n_local)[:, :, None] == jnp.arange(n_dev), axis=1)      # [n, P]
  pair_sent = on_dev.T.reshape(-1)                                     # [P*n] destination-major
  order = jnp.argsort(jnp.where(pair_sent, 0, 1), stable=True)[:n * min(k, n_dev)]
  send_sizes = jnp.sum(on_dev, axis=0).astype(jnp.int32)
  return (order % n).astype(jnp.int32), (order // n).astype(jnp.int32), send_sizes


def _exchange_experts(x, routed: RoutedTokens, w: ExpertWeights, collective, act=jax.nn.silu):
  """Per device inside `shard_map`: the routed-expert output [n, D] of the local tokens x [n, D];
  the (token, device) pairs the routes need, packed by destination, travel through `collective`
  (`ragged_all_to_all` or `padded_all_to_all`) and their outputs come back the same way."""
  n, d = x.shape
  n_local = w.gate.shape[0]
  n_dev = jax.lax.axis_size(EXPERT_AXIS)
  me = jax.lax.axis_index(EXPERT_AXIS)
  token, dest, send_sizes = _send_plan(routed.expert_ids, n_local, n_dev)
  sent = jnp.arange(token.shape[0]) < jnp.sum(send_sizes)
  # device s's rows land at s*n of a [P*n] buffer (a device gets a token at most once)
  slices = RaggedSlices(jnp.cumsum(send_sizes) - send_sizes, send_sizes,
                        jnp.full((n_dev,), me * n, jnp.int32),
                        jax.lax.all_to_all(send_sizes, EXPERT_AXIS, 0, 0, tiled=True))
  send = lambda a, fill: collective(a, jnp.full((n_dev * n,) + a.shape[1:], fill, a.dtype),
                                    slices, n)
  ids = routed.expert_ids[token]
  kept_ids = jnp.where(ids // n_local == dest[:, None], ids, -1)      # the destination's only
  got = RoutedTokens(send(kept_ids, -1), send(routed.weights[token], 0), None)   # [P*n, K]
  y = ragged_experts(send(x[token], 0), got, w, me * n_local, act=act)         # [P*n, D]
  back = collective(y, jnp.zeros((token.shape[0], d), y.dtype), slices.reverse(), n)
  back = jnp.where(sent[:, None], back, 0).astype(jnp.float32)
  return jnp.zeros((n, d), jnp.float32).at[token].add(back).astype(x.dtype)


def expert_axis_size() -> int:
  """The size of the mesh axis "expert" of the mesh being traced on (`jax.set_mesh`, or
  `orl_jax.sharding.tracing_mesh`); 1 without one."""
  mesh = jax.sharding.get_abstract_mesh()
  return dict(mesh.shape).get(EXPERT_AXIS, 1) if mesh.axis_names else 1


def _expert_mesh_and_token_spec():
  mesh = jax.sharding.get_abstract_mesh()
  if EXPERT_AXIS not in mesh.axis_names:
    raise ValueError("model.moe.expert_parallel needs a mesh with an 'expert' axis to trace on "
                     "(jax.set_mesh(...) or orl_jax.sharding.tracing_mesh(mesh)); the current "
                     f"mesh has axes {mesh.axis_names}")
  return mesh, P(tuple(a for a in mesh.axis_names if a in _TOKEN_AXES) + (EXPERT_AXIS,))


def expert_parallel_experts(x, routed: RoutedTokens, w: ExpertWeights, exchange: str = "auto",
                            act=jax.nn.silu) -> jax.Array:
  """`ragged_experts` of routes the caller computed, with the experts split over the mesh axis
  "expert" (module docstring): the tokens, their expert ids and weights split like the batch,
  each device exchanges its own. x: [N, D] -> [N, D]."""
  mesh, token_spec = _expert_mesh_and_token_spec()
  experts = exchange_experts(exchange)
  shards = math.prod(dict(mesh.shape)[axis] for axis in token_spec[0])
  n = x.shape[0]
  pad = -n % shards       # filler tokens (no expert: sent nowhere) make the tokens split evenly
  ids = jnp.pad(routed.expert_ids, ((0, pad), (0, 0)), constant_values=-1)
  weights = jnp.pad(routed.weights, ((0, pad), (0, 0)))

  def local(x, ids, weights, w):
    return experts(x, RoutedTokens(ids, weights, None), w, act=act)

  y = jax.shard_map(local, mesh=mesh, in_specs=(token_spec,) * 3 + (P(EXPERT_AXIS),),
                    out_specs=token_spec, check_vma=False)(jnp.pad(x, ((0, pad), (0, 0))),
                                                           ids, weights, w)
  return y[:n]


def _expert_parallel(x, logits, expert_bias, given_ids, w: ExpertWeights,
                     cfg: MoEConfig) -> tuple[jax.Array, RoutedTokens]:
  """`route` + `ragged_experts` with the experts split over the mesh axis "expert": each device
  routes its own tokens and exchanges them (module docstring). x: [N, D], logits: [N, E]."""
  mesh, token_spec = _expert_mesh_and_token_spec()
  experts = exchange_experts(cfg.exchange)

  def local(x, logits, expert_bias, w, *given_ids):
    routed = route(logits, expert_bias, cfg, *given_ids)
    return experts(x, routed, w), routed

  given = () if given_ids is None else (given_ids,)
  in_specs = (token_spec, token_spec, P(), P(EXPERT_AXIS)) + (token_spec,) * len(given)
  return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=(token_spec, token_spec),
                       check_vma=False)(x, logits, expert_bias, w, *given)


# ----------------------------------------------------------------------------- module


class Router(nnx.Module):
  """`kernel` [D, E] (HF `mlp.gate.weight` transposed) and `expert_bias` [E]. The bias is stored
  as a Param so loading, export and sharding see it, but it is selection-only state: it gets no
  gradient and `frozen_param` tells the optimizer to leave it alone."""

  def __init__(self, d_model: int, n_experts: int, *, param_dtype, rngs: nnx.Rngs):
    self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (d_model, n_experts),
                                                            param_dtype))
    self.expert_bias = nnx.Param(jnp.zeros((n_experts,), param_dtype))

  def logits(self, x, freeze: bool):
    kernel = self.kernel[...].astype(jnp.float32)
    if freeze:
      kernel = jax.lax.stop_gradient(kernel)
    # The official gate keeps this matmul in f32 (bf16 logits flip routes).
    return jnp.einsum("nd,de->ne", x.astype(jnp.float32), kernel,
                      precision=jax.lax.Precision.HIGHEST)


class MoEOutput(NamedTuple):
  y: jax.Array            # [B, T, D]
  expert_ids: jax.Array   # [B, T, K] int32 routes taken (captured for replay)


class MoE(nnx.Module):
  """Routed SwiGLU experts plus an optional shared SwiGLU (`shared_experts`, built by the caller
  with width `n_shared * expert_dim`, so the dense MLP class is reused)."""

  def __init__(self, cfg: MoEConfig, d_model: int, *, dtype, param_dtype,
               shared_experts: nnx.Module | None, rngs: nnx.Rngs):
    cfg.validate()
    self.cfg = cfg
    self.dtype = dtype
    self.router = Router(d_model, cfg.n_experts, param_dtype=param_dtype, rngs=rngs)
    init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    e, d, f = cfg.n_experts, d_model, cfg.expert_dim
    self.gate_proj = nnx.Param(init(rngs.params(), (e, d, f), param_dtype))
    self.up_proj = nnx.Param(init(rngs.params(), (e, d, f), param_dtype))
    self.down_proj = nnx.Param(init(rngs.params(), (e, f, d), param_dtype))
    self.shared_experts = shared_experts

  def __call__(self, x, routes=None) -> MoEOutput:
    """x: [B, T, D]; routes: [B, T, K] int32 captured expert ids (-1: re-route) or None."""
    cfg = self.cfg
    b, t, d = x.shape
    flat = x.reshape(b * t, d)
    given = None if routes is None else routes.reshape(b * t, cfg.top_k)
    logits = self.router.logits(flat, cfg.freeze_router)                   # [N, E] f32
    expert_bias = jax.lax.stop_gradient(self.router.expert_bias[...])
    weights = ExpertWeights(*(p[...].astype(self.dtype)
                              for p in (self.gate_proj, self.up_proj, self.down_proj)))
    flat = flat.astype(self.dtype)
    if cfg.expert_parallel:
      y, routed = _expert_parallel(flat, logits, expert_bias, given, weights, cfg)
    else:
      routed = route(logits, expert_bias, cfg, given)
      y = (ragged_experts if cfg.impl == "ragged" else dense_experts)(flat, routed, weights)
    y = y.reshape(b, t, d)
    if self.shared_experts is not None:
      y = y + self.shared_experts(x)
    return MoEOutput(y, routed.expert_ids.reshape(b, t, cfg.top_k).astype(jnp.int32))


# Partition rules of the MoE parameters, in the (regex, PartitionSpec) form of
# `orl_jax.sharding.PARTITION_RULES` (the LLaDA2 family lists them first, see
# `orl_jax.models.families`): routed experts split over `expert`, their
# [D, F] / [F, D] slices like the dense MLP; the shared experts exactly like the dense MLP; the
# router (small, f32 matmul) replicated. Axes missing from the mesh are dropped by the fitting.
PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"mlp\.(gate_proj|up_proj)$", P(EXPERT_AXIS, "fsdp", "tensor")),            # [E, D, F]
    (r"mlp\.down_proj$", P(EXPERT_AXIS, "tensor", "fsdp")),                      # [E, F, D]
    (r"shared_experts\.(gate_proj|up_proj)\.kernel$", P("fsdp", "tensor")),      # [D, F]
    (r"shared_experts\.down_proj\.kernel$", P("tensor", "fsdp")),                # [F, D]
    (r"mlp\.router\.", P()),
)


def frozen_param(name: str, cfg: MoEConfig | None) -> bool:
  """Whether the parameter with dot-joined name `name` must not be updated by the optimizer:
  every router `expert_bias` (selection state), and the router kernel under `freeze_router`
  (its gradient is already zero; this also keeps weight decay off it)."""
  if cfg is None:
    return False
  if name.endswith("router.expert_bias"):
    return True
  return cfg.freeze_router and name.endswith("router.kernel")
