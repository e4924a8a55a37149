"""Grouped matmul (`ragged_dot`) for the MoE expert compute, chosen per platform.

`ragged_dot(lhs [M, K], rhs [G, K, N], group_sizes [G])`: rows `s_g .. s_g + n_g - 1` of `lhs`
(sorted by group) times `rhs[g]`; rows past `sum(group_sizes)` belong to no group and give 0.

* TPU, CPU: `jax.lax.ragged_dot` (a native grouped matmul on TPU; on CPU a dense expansion, for
  tiny tests).
* Hopper GPUs (compute capability 9.x): jax's Mosaic GPU kernels under one `custom_vjp`
  (XLA's GPU compiler lowers `jax.lax.ragged_dot` as a dense product over every group, with a
  `[G, M, N]`-sized temporary, and its gradient likewise):
    out     = ragged_dot(lhs, rhs)                      `ragged_dot_mgpu.ragged_dot`
    d lhs   = ragged_dot(d out, rhs, transpose_rhs)     the same kernel, rhs read transposed
    d rhs_g = lhs_g^T d out_g                           `transposed_ragged_dot_mgpu`
  The kernels leave the rows past `sum(group_sizes)` unwritten; they are set to 0 here. The
  output is rounded to the input dtype (the kernels accumulate in f32 and store their input
  dtype), so `preferred_element_type` is applied by a cast.
* Other GPUs (A100): `jax.lax.ragged_dot` with a warning (dense over the groups, as above).

`GroupedMatmul` holds the three primitives; `with_grad(GroupedMatmul)` is the differentiable
ragged_dot built from them, so the same plumbing runs with `REFERENCE` (lax primitives) on any
host, which is how it is tested without a GPU.
"""
from __future__ import annotations

import functools
import logging
import types
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.platform import current_gpu, current_platform

# The fallback warnings logged so far: each is logged once per process; clear the set to have
# them logged again (a process that traces for another target).
warned: set[str] = set()


def _warn_once(msg: str) -> None:
  if msg not in warned:
    warned.add(msg)
    logging.warning(msg)


class GroupedMatmul(NamedTuple):
  """The three products of a ragged_dot and its gradient (all in the operands' dtype)."""
  forward: Callable     # (lhs [M, K], rhs [G, K, N], group_sizes) -> [M, N]
  lhs_grad: Callable    # (d_out [M, N], rhs [G, K, N], group_sizes) -> [M, K]
  rhs_grad: Callable    # (lhs [M, K], d_out [M, N], group_sizes) -> [G, K, N]


def _ref_rhs_grad(lhs, d_out, group_sizes):
  dims = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((0,), (0,)), ((), ())),
                                           lhs_ragged_dimensions=[0], rhs_group_dimensions=[])
  return jax.lax.ragged_dot_general(lhs, d_out, group_sizes, dims)


REFERENCE = GroupedMatmul(
    forward=lambda lhs, rhs, gs: jax.lax.ragged_dot(lhs, rhs, gs),
    lhs_grad=lambda d_out, rhs, gs: jax.lax.ragged_dot(d_out, jnp.swapaxes(rhs, 1, 2), gs),
    rhs_grad=_ref_rhs_grad)


def _in_groups(rows: int, group_sizes) -> jax.Array:
  """[rows, 1] bool: the row belongs to a group."""
  return (jnp.arange(rows) < jnp.sum(group_sizes))[:, None]


def with_grad(prims: GroupedMatmul) -> Callable:
  """A differentiable `ragged_dot(lhs, rhs, group_sizes)` from `prims` (rows in no group: 0)."""

  @jax.custom_vjp
  def ragged(lhs, rhs, group_sizes):
    out = prims.forward(lhs, rhs, group_sizes)
    return jnp.where(_in_groups(lhs.shape[0], group_sizes), out, 0).astype(lhs.dtype)

  def fwd(lhs, rhs, group_sizes):
    return ragged(lhs, rhs, group_sizes), (lhs, rhs, group_sizes)

  def bwd(res, d_out):
    lhs, rhs, group_sizes = res
    in_groups = _in_groups(lhs.shape[0], group_sizes)
    d_out = jnp.where(in_groups, d_out, 0).astype(lhs.dtype)
    d_lhs = jnp.where(in_groups, prims.lhs_grad(d_out, rhs, group_sizes), 0).astype(lhs.dtype)
    d_rhs = prims.rhs_grad(lhs, d_out, group_sizes).astype(rhs.dtype)
    return d_lhs, d_rhs, None

  ragged.defvjp(fwd, bwd)
  return ragged


# ------------------------------------------------------------------------------ Hopper kernels

HOPPER_DTYPES = (jnp.bfloat16, jnp.float16)
BLOCK_K = 64                 # the contraction tile of every kernel call
BLOCK_M = 128                # rows of lhs a tile (forward); K a tile (rhs gradient: 64)
MAX_CONCURRENT_STEPS = 4     # pipeline depth: 4 x (128x64 + 64x128) bf16 + a 128x128 out tile
                             # = 160 KiB of the H100's 227 KiB shared memory


def _block_n(n: int) -> int:
  return 128 if n % 128 == 0 else 64


def unsupported(lhs, rhs) -> str | None:
  """Why the Hopper kernels cannot take these operands (None: they can)."""
  _, k = lhs.shape
  _, _, n = rhs.shape
  if jnp.dtype(lhs.dtype) not in [jnp.dtype(d) for d in HOPPER_DTYPES]:
    return f"operands of dtype {jnp.dtype(lhs.dtype).name} (the kernels take bf16 / f16)"
  if k % BLOCK_K or n % BLOCK_K:
    return f"K={k} and N={n} must be multiples of {BLOCK_K}"
  return None


class _JaxWithSMs:
  """`jax`, but `devices()` is one device of `sm_count` SMs."""

  def __init__(self, sm_count: int):
    self._device = types.SimpleNamespace(core_count=sm_count)

  def __getattr__(self, name):
    return getattr(jax, name)

  def devices(self, *_, **__):
    return [self._device]


def _transposed_kernel(sm_count: int) -> Callable:
  """jax's `transposed_ragged_dot` sizing its grid by `sm_count` (its code reads
  `jax.devices()[0].core_count`, which on a compile-only host is this CPU's device)."""
  from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu as module
  fn = module.transposed_ragged_dot
  copy = types.FunctionType(fn.__code__, {**vars(module), "jax": _JaxWithSMs(sm_count)},
                            fn.__name__,
                            fn.__defaults__, fn.__closure__)
  copy.__kwdefaults__ = fn.__kwdefaults__
  return copy


def hopper(sm_count: int) -> GroupedMatmul:
  """The Mosaic GPU primitives for a Hopper GPU of `sm_count` SMs."""
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu

  def forward(lhs, rhs, gs, transpose_rhs=False):
    n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
    return ragged_dot_mgpu.ragged_dot(
        lhs, rhs.astype(lhs.dtype), group_sizes=gs, block_m=BLOCK_M, block_n=_block_n(n),
        block_k=BLOCK_K, max_concurrent_steps=MAX_CONCURRENT_STEPS, grid_block_n=1,
        transpose_rhs=transpose_rhs)

  def rhs_grad(lhs, d_out, gs):
    return _transposed_kernel(sm_count)(
        lhs, d_out, group_sizes=gs, block_m=64, block_n=_block_n(d_out.shape[1]),
        block_k=BLOCK_K, max_concurrent_steps=MAX_CONCURRENT_STEPS, grid_block_n=1)

  return GroupedMatmul(forward, functools.partial(forward, transpose_rhs=True), rhs_grad)


def implementation(lhs, rhs) -> tuple[str, GroupedMatmul | None]:
  """(name, primitives) for the platform being traced for: `("mosaic_gpu", ...)` on a Hopper
  GPU that takes the operands, else `("xla", None)` (`jax.lax.ragged_dot`), warned once on a
  GPU."""
  if current_platform() != "gpu":
    return "xla", None
  gpu = current_gpu()
  if gpu is None or gpu.compute_capability[0] != 9:
    why = "not a Hopper GPU" if gpu else "an unknown GPU"
    _warn_once(f"grouped matmul: {why} — jax.lax.ragged_dot, which XLA's GPU compiler expands "
               "over every expert (memory grows with the number of experts)")
    return "xla", None
  reason = unsupported(lhs, rhs)
  if reason:
    _warn_once(f"grouped matmul: the Mosaic GPU kernels cannot take {reason}; "
               "jax.lax.ragged_dot instead (expanded over every expert)")
    return "xla", None
  return "mosaic_gpu", hopper(gpu.sm_count or 132)


def ragged_dot(lhs, rhs, group_sizes, preferred_element_type=None) -> jax.Array:
  """`jax.lax.ragged_dot` with the platform's grouped matmul (module docstring)."""
  name, prims = implementation(lhs, rhs)
  if prims is None:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=preferred_element_type)
  out = with_grad(prims)(lhs, rhs.astype(lhs.dtype), group_sizes)
  return out if preferred_element_type is None else out.astype(preferred_element_type)
