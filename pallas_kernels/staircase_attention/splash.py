"""Staircase attention through JAX's TPU splash attention
(docs/scaling.md#attention-kernels-and-accelerators,
docs/scaling.md#compiling-for-tpus-and-gpus-you-do-not-have).

Splash takes one mask per kernel, shared by the whole batch, and tiles of 128. The staircase
depends on each row's metadata, so every batch row gets its own kernel:

* concrete metadata (an eager call, or metadata packed on the host): a dense `NumpyMask` per
  distinct row, whose block sparsity splash precomputes on the host (kernels are cached);
* traced metadata (under `jit` / `shard_map`): splash's dynamic-mask path, which takes the dense
  [Tq, Tk] mask as an array and still skips empty 128-blocks, at the price of storing the mask:
  splash keeps one copy per query head of a group, as int32 on a TPU (`groups x Tq x Tk x 4`
  bytes a row: 256 MiB at 4k tokens and 4 query heads per key/value head, 4 GiB at 16k).
  `impl="auto"` therefore takes the block-sparse Pallas kernel instead once that mask would
  exceed `TRACED_MASK_LIMIT_BYTES` (`dense_mask_too_large`).

A computable mask (`_ComputableMask`) is not used: its mask function sees only positions, and a
Pallas TPU kernel cannot close over the per-row metadata arrays.

Splash leaves queries that see no key undefined (0/0 or a mean of values), so their outputs are
zeroed afterwards; with a zero cotangent they receive zero gradients, like the reference.
GQA runs as splash MQA per key/value head.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

from pallas_kernels.staircase_attention import block_sparse
from pallas_kernels.staircase_attention.meta import TokenMeta, staircase_visible

TILE = 128
# The largest dense mask (bytes per row) `auto` lets splash store for traced metadata.
TRACED_MASK_LIMIT_BYTES = 16 * 2**20
_MASK_ITEMSIZE = 4  # a bool operand of a Pallas TPU kernel is passed as int32


def _block_sizes(tq: int, tk: int, tile: int = TILE) -> splash.BlockSizes:
  bq, bk = min(tile, tq), min(tile, tk)
  return splash.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk, block_q_dkv=bq,
                           block_kv_dkv=bk, block_kv_dkv_compute=bk, block_q_dq=bq,
                           block_kv_dq=bk)


@functools.lru_cache(maxsize=64)
def _static_kernel(mask_bytes: bytes, tq: int, tk: int, groups: int, interpret: bool,
                   tile: int):
  """An MQA splash kernel for one row's dense mask (host-side block analysis, cached).

  The cached kernel holds numpy arrays only: splash converts its block tables with `jnp.array`,
  which inside a `jit` trace makes tracers, and a kernel holding them would leak that trace into
  the next one (`UnexpectedTracerError`).
  """
  dense = np.frombuffer(mask_bytes, np.bool_).reshape(tq, tk)
  heads = mask_lib.MultiHeadMask([mask_lib.NumpyMask(dense)] * groups)
  with jax.ensure_compile_time_eval():
    kernel = splash.make_splash_mqa_single_device(heads, block_sizes=_block_sizes(tq, tk, tile),
                                                  interpret=interpret)
  return jax.tree.map(np.asarray, kernel)


def _dynamic_kernel(visible, groups: int, interpret: bool, tile: int):
  """An MQA splash kernel for a traced [Tq, Tk] mask."""
  tq, tk = visible.shape
  heads = jnp.broadcast_to(visible, (groups, tq, tk))
  kernel = splash.make_splash_mqa_single_device(heads, block_sizes=_block_sizes(tq, tk, tile),
                                                interpret=interpret)
  # JAX 0.10 stores the `is_dynamic_mask` flag as an array, which is a tracer under jit and
  # breaks splash's Python branch on it; it is known statically here.
  # The forward's mask info is always built; the backward's are None when not asked for.
  dynamic = lambda info: info if info is None else info._replace(is_dynamic_mask=True)
  return splash.SplashAttentionKernel(kernel.fwd_mask_info._replace(is_dynamic_mask=True),
                                      dynamic(kernel.dq_mask_info), dynamic(kernel.dkv_mask_info),
                                      **kernel.kwargs)


def _concrete(meta: TokenMeta):
  """The metadata as numpy, or None when it is traced."""
  try:
    # numpy fields where TokenMeta's annotations say jax.Array: they are read as arrays
    return TokenMeta(*(np.asarray(f) for f in meta))  # type: ignore[arg-type]
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def unsupported(q, k, v, tile: int = TILE) -> str | None:
  reason = block_sparse.check_shapes(q, k, v)
  if reason:
    return reason
  tq, tk = q.shape[1], k.shape[1]
  if tq % tile or tk % tile:
    return f"splash needs sequence lengths that are multiples of {tile}, got ({tq}, {tk})"
  return None


def dense_mask_too_large(q, k, q_meta: TokenMeta, k_meta: TokenMeta) -> str | None:
  """Why `auto` should not take splash here: traced metadata whose dense mask (one int32 copy
  per query head of a group, per row) exceeds `TRACED_MASK_LIMIT_BYTES`; else None."""
  if _concrete(q_meta) is not None and _concrete(k_meta) is not None:
    return None   # the host analyses the mask: nothing dense reaches the device
  groups = q.shape[2] // k.shape[2]
  size = groups * q.shape[1] * k.shape[1] * _MASK_ITEMSIZE
  if size <= TRACED_MASK_LIMIT_BYTES:
    return None
  return (f"with traced metadata splash would store a dense mask of {size / 2**20:,.0f} MiB a "
          f"row (limit {TRACED_MASK_LIMIT_BYTES / 2**20:.0f} MiB)")


def staircase_attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, scale=None, *,
                        interpret: bool = False, window: int = 0, tile: int = TILE):
  """Staircase attention with splash. q [B,Tq,Hq,Dh], k/v [B,Tk,Hkv,Dh] -> [B,Tq,Hq,Dh];
  `tile`: splash's query and key block sizes (forward and backward).

  Returns a reason string instead when splash cannot run the case.
  """
  reason = unsupported(q, k, v, tile)
  if reason:
    return reason
  b, tq, hq, dh = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  groups = hq // hkv
  scale = dh ** -0.5 if scale is None else scale
  q_np, k_np = _concrete(q_meta), _concrete(k_meta)
  static = q_np is not None and k_np is not None
  visible = (staircase_visible(q_np, k_np, xp=np, window=window) if static
             else staircase_visible(q_meta, k_meta, window=window))  # [B, Tq, Tk]
  # [B, Hkv, groups, Tq, Dh]: splash does not scale logits, so q is pre-scaled.
  q_heads = (q * scale).astype(q.dtype).reshape(b, tq, hkv, groups, dh).transpose(0, 2, 3, 1, 4)
  k_heads, v_heads = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, Hkv, Tk, Dh]
  rows = []
  for row in range(b):
    kernel = (_static_kernel(np.ascontiguousarray(visible[row]).tobytes(), tq, tk, groups,
                             interpret, tile) if static
              else _dynamic_kernel(visible[row], groups, interpret, tile))
    rows.append(jax.vmap(kernel)(q_heads[row], k_heads[row], v_heads[row]))
  out = jnp.stack(rows)                                            # [B, Hkv, groups, Tq, Dh]
  out = out.transpose(0, 3, 1, 2, 4).reshape(b, tq, hq, dh)
  sees_any = jnp.any(jnp.asarray(visible), axis=-1)[:, :, None, None]
  return jnp.where(sees_any, out, 0).astype(q.dtype)
