"""Block-sparse staircase flash attention for GPU (Pallas Triton backend).

One program per (batch, head, query tile), as in JAX's Pallas GPU attention; it loops
(`fori_loop` with a data-dependent trip count) over the listed key tiles of its query tile and
loads only those, `lax.cond` picking the unmasked body for fully visible tiles. The lists are
the tile map's, packed per program as one int32 row `[count | tiles | full flags]` (padded to a
power of two, which Triton block shapes need). Backward: dq walks the same lists; dk/dv walk
the transposed lists over the GQA group of query heads.

On CPU the same `pallas_call`s run with `interpret=True`, which is how the tests check them;
XLA's GPU compiler turns them into sm_90a code for an H100 on any host
(`orl_jax/aot/kernels.py`, `benchmarks/kernel_compile.py`); they have not run on a GPU yet.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.staircase_attention import block_sparse
from pallas_kernels.staircase_attention.block_sparse import MASKED_LOGIT, KernelConfig
from pallas_kernels.staircase_attention.meta import TokenMeta, staircase_visible_pairs

_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b
_TN = (((0,), (0,)), ((), ()))  # a.T @ b
_N_FIELDS = len(TokenMeta._fields)
_META_ROWS = 8  # fields padded to a power of two


def _pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _meta_rows(meta: TokenMeta):
  """[B, 8, T] int32: field f of a token span is `ref[f, span]`."""
  fields = jnp.stack(list(meta), axis=1)
  return jnp.pad(fields, ((0, 0), (0, _META_ROWS - _N_FIELDS), (0, 0)))


def _tile_lists(tables, full, counts):
  """[B, n, W] int32 rows `[count | tables (n) | full (n) | 0...]`, W a power of two.

  Returns (lists, offset of the full flags).
  """
  n = tables.shape[-1]
  packed = jnp.concatenate([counts[..., None], tables, full], axis=-1)
  width = _pow2(packed.shape[-1])
  return jnp.pad(packed, ((0, 0), (0, 0), (0, width - packed.shape[-1]))), 1 + n


def _load_meta(ref, start, size):
  """TokenMeta of tokens [start, start + size) from a [8, T] metadata ref, each field [size]."""
  return TokenMeta(*(ref[f, pl.ds(start, size)] for f in range(_N_FIELDS)))


def _visible(q_meta: TokenMeta, k_meta: TokenMeta, window: int):
  return staircase_visible_pairs(TokenMeta(*(f[:, None] for f in q_meta)),
                                 TokenMeta(*(f[None, :] for f in k_meta)), window)


def _triton_params(head_dim: int) -> pltriton.CompilerParams:
  """Explicit Triton parameters: without them JAX >= 0.10 lowers `pallas_call` with Mosaic GPU
  (`jax_pallas_use_mosaic_gpu`), which stages whole blocks in shared memory and overflows it.
  Warps as in JAX's Pallas GPU flash attention (4 up to head_dim 64, else 8)."""
  return pltriton.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)


def _dot(a, b, dims):
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _for_listed(list_ref, full_offset, body, init):
  """Folds `body(tile, masked, carry)` over the listed tiles of this program."""
  def one(j, carry):
    tile = list_ref[1 + j]
    return jax.lax.cond(list_ref[full_offset + j] != 0,
                        functools.partial(body, tile, False),
                        functools.partial(body, tile, True), carry)
  return jax.lax.fori_loop(0, list_ref[0], one, init)


# ---------------------------------------------------------------- forward


def _fwd_kernel(q_ref, k_ref, v_ref, qm_ref, km_ref, list_ref, o_ref, lse_ref, *visits_ref,
                cfg: KernelConfig, full_offset: int):
  bq, bk = cfg.block_q, cfg.block_k
  q = q_ref[...]
  q_meta = _load_meta(qm_ref, 0, bq)

  def body(tile, masked, carry):
    m, l, acc, visits = carry  # noqa: E741 (FlashAttention's running max m and sum l)
    start = pl.multiple_of(tile * bk, bk)
    v = v_ref[pl.ds(start, bk), :]
    s = _dot(q, k_ref[pl.ds(start, bk), :], _NT) * cfg.scale
    if masked:
      visible = _visible(q_meta, _load_meta(km_ref, start, bk), cfg.window)
      s = jnp.where(visible, s, MASKED_LOGIT)
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    p = jnp.exp(s - m_new[:, None])
    if masked:
      p = jnp.where(visible, p, 0.0)
    alpha = jnp.exp(m - m_new)
    acc = alpha[:, None] * acc + _dot(p.astype(v.dtype), v, _NN)
    return m_new, alpha * l + jnp.sum(p, axis=1), acc, visits + 1

  init = (jnp.full((bq,), MASKED_LOGIT, jnp.float32), jnp.zeros((bq,), jnp.float32),
          jnp.zeros((bq, q.shape[-1]), jnp.float32), jnp.int32(0))
  m, l, acc, visits = _for_listed(list_ref, full_offset, body, init)  # noqa: E741 (as above)
  out, lse = block_sparse.finish_softmax(m[:, None], l[:, None], acc, o_ref.dtype)
  o_ref[...] = out
  lse_ref[...] = lse[:, 0]
  if visits_ref:
    visits_ref[0][...] = jnp.full((bq,), visits, jnp.int32)


def _forward(cfg: KernelConfig, q, k, v, q_meta, k_meta, tiles, count_visits: bool):
  b, hq, tq, dh = q.shape
  tk = k.shape[2]
  bq, g = cfg.block_q, cfg.groups
  nq = tq // bq
  lists, full_offset = _tile_lists(tiles.kv_tables, tiles.kv_full, tiles.kv_counts)
  q_tile = lambda b_, h, i: (b_, h, i, 0)
  kv_all = lambda b_, h, i: (b_, h // g, 0, 0)
  out_specs = [pl.BlockSpec((None, None, bq, dh), q_tile),
               pl.BlockSpec((None, None, bq), lambda b_, h, i: (b_, h, i))]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((b, hq, tq), jnp.float32)]
  if count_visits:
    out_specs.append(out_specs[1])
    out_shape.append(jax.ShapeDtypeStruct((b, hq, tq), jnp.int32))
  results = pl.pallas_call(
      functools.partial(_fwd_kernel, cfg=cfg, full_offset=full_offset),
      grid=(b, hq, nq),
      in_specs=[pl.BlockSpec((None, None, bq, dh), q_tile),
                pl.BlockSpec((None, None, tk, dh), kv_all),
                pl.BlockSpec((None, None, tk, dh), kv_all),
                pl.BlockSpec((None, _META_ROWS, bq), lambda b_, h, i: (b_, 0, i)),
                pl.BlockSpec((None, _META_ROWS, tk), lambda b_, h, i: (b_, 0, 0)),
                pl.BlockSpec((None, None, lists.shape[-1]), lambda b_, h, i: (b_, i, 0))],
      out_specs=out_specs, out_shape=out_shape, interpret=cfg.interpret,
      compiler_params=_triton_params(dh), name="staircase_fwd_gpu",
      cost_estimate=block_sparse.cost_estimate(cfg, "fwd", q, k),
  )(q, k, v, _meta_rows(q_meta), _meta_rows(k_meta), lists)
  if not count_visits:
    return results[0], results[1]
  return results[0], results[1], results[2][:, :, ::bq]


# ---------------------------------------------------------------- backward


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qm_ref, km_ref, list_ref, dq_ref,
               *, cfg: KernelConfig, full_offset: int):
  bq, bk = cfg.block_q, cfg.block_k
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]
  q_meta = _load_meta(qm_ref, 0, bq)

  def body(tile, masked, dq):
    start = pl.multiple_of(tile * bk, bk)
    k = k_ref[pl.ds(start, bk), :]
    p = jnp.exp(_dot(q, k, _NT) * cfg.scale - lse)
    if masked:
      p = jnp.where(_visible(q_meta, _load_meta(km_ref, start, bk), cfg.window), p, 0.0)
    ds = p * (_dot(do, v_ref[pl.ds(start, bk), :], _NT) - delta)
    return dq + _dot(ds.astype(k.dtype), k, _NN)

  dq = _for_listed(list_ref, full_offset, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qm_ref, km_ref, list_ref,
                 dk_ref, dv_ref, *, cfg: KernelConfig, full_offset: int):
  bq, bk = cfg.block_q, cfg.block_k
  k, v = k_ref[...], v_ref[...]
  k_meta = _load_meta(km_ref, 0, bk)
  carry = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
  for g in range(cfg.groups):  # the query heads that share this key/value head

    def body(tile, masked, carry, g=g):
      dk, dv = carry
      start = pl.multiple_of(tile * bq, bq)
      q = q_ref[g, pl.ds(start, bq), :]
      do = do_ref[g, pl.ds(start, bq), :]
      p = jnp.exp(_dot(q, k, _NT) * cfg.scale - lse_ref[g, pl.ds(start, bq)][:, None])
      if masked:
        p = jnp.where(_visible(_load_meta(qm_ref, start, bq), k_meta, cfg.window), p, 0.0)
      ds = p * (_dot(do, v, _NT) - delta_ref[g, pl.ds(start, bq)][:, None])
      return dk + _dot(ds.astype(q.dtype), q, _TN), dv + _dot(p.astype(do.dtype), do, _TN)

    carry = _for_listed(list_ref, full_offset, body, carry)
  dk, dv = carry
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _backward(cfg: KernelConfig, q, k, v, q_meta, k_meta, tiles, out, lse, d_out):
  b, hq, tq, dh = q.shape
  hkv, tk = k.shape[1], k.shape[2]
  bq, bk, g = cfg.block_q, cfg.block_k, cfg.groups
  nq, nk = tq // bq, tk // bk
  delta = block_sparse.softmax_delta(out, d_out)
  q_rows, k_rows = _meta_rows(q_meta), _meta_rows(k_meta)

  kv_lists, kv_offset = _tile_lists(tiles.kv_tables, tiles.kv_full, tiles.kv_counts)
  q_tile = lambda b_, h, i: (b_, h, i, 0)
  vec_tile = lambda b_, h, i: (b_, h, i)
  kv_all = lambda b_, h, i: (b_, h // g, 0, 0)
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, cfg=cfg, full_offset=kv_offset),
      grid=(b, hq, nq),
      in_specs=[pl.BlockSpec((None, None, bq, dh), q_tile),
                pl.BlockSpec((None, None, tk, dh), kv_all),
                pl.BlockSpec((None, None, tk, dh), kv_all),
                pl.BlockSpec((None, None, bq, dh), q_tile),
                pl.BlockSpec((None, None, bq), vec_tile),
                pl.BlockSpec((None, None, bq), vec_tile),
                pl.BlockSpec((None, _META_ROWS, bq), lambda b_, h, i: (b_, 0, i)),
                pl.BlockSpec((None, _META_ROWS, tk), lambda b_, h, i: (b_, 0, 0)),
                pl.BlockSpec((None, None, kv_lists.shape[-1]), lambda b_, h, i: (b_, i, 0))],
      out_specs=pl.BlockSpec((None, None, bq, dh), q_tile),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), interpret=cfg.interpret,
      compiler_params=_triton_params(dh), name="staircase_dq_gpu",
      cost_estimate=block_sparse.cost_estimate(cfg, "dq", q, k),
  )(q, k, v, d_out, lse, delta, q_rows, k_rows, kv_lists)

  q_lists, q_offset = _tile_lists(tiles.q_tables, tiles.q_full, tiles.q_counts)
  k_tile = lambda b_, h, t: (b_, h, t, 0)
  group_all = lambda b_, h, t: (b_, h, 0, 0)  # block of g query heads = this kv head's group
  group_vec = lambda b_, h, t: (b_, h, 0)
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, cfg=cfg, full_offset=q_offset),
      grid=(b, hkv, nk),
      in_specs=[pl.BlockSpec((None, g, tq, dh), group_all),
                pl.BlockSpec((None, None, bk, dh), k_tile),
                pl.BlockSpec((None, None, bk, dh), k_tile),
                pl.BlockSpec((None, g, tq, dh), group_all),
                pl.BlockSpec((None, g, tq), group_vec),
                pl.BlockSpec((None, g, tq), group_vec),
                pl.BlockSpec((None, _META_ROWS, tq), lambda b_, h, t: (b_, 0, 0)),
                pl.BlockSpec((None, _META_ROWS, bk), lambda b_, h, t: (b_, 0, t)),
                pl.BlockSpec((None, None, q_lists.shape[-1]), lambda b_, h, t: (b_, t, 0))],
      out_specs=[pl.BlockSpec((None, None, bk, dh), k_tile),
                 pl.BlockSpec((None, None, bk, dh), k_tile)],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      interpret=cfg.interpret, compiler_params=_triton_params(dh), name="staircase_dkdv_gpu",
      cost_estimate=block_sparse.cost_estimate(cfg, "dkdv", q, k),
  )(q, k, v, d_out, lse, delta, q_rows, k_rows, q_lists)
  return dq, dk, dv


BACKEND = block_sparse.Backend("gpu", _forward, _backward)


def unsupported(q, k, v) -> str | None:
  """Triton needs power-of-two tile shapes: head_dim a power of two, at least 16."""
  reason = block_sparse.check_shapes(q, k, v)
  if reason:
    return reason
  dh = q.shape[-1]
  if dh < 16 or dh & (dh - 1):
    return f"the GPU kernel needs a power-of-two head_dim >= 16, got {dh}"
  return None


def default_tile(head_dim: int) -> int:
  """The square tile the kernel runs with: 64, and 32 above head_dim 256, where the backward
  at 64 asks more shared memory than an H100 block may use (head_dim 512: 256 KiB of
  227 KiB; at 32 at most 130 KiB), as XLA's GPU compiler reports (benchmarks/kernel_compile.py)."""
  return 64 if head_dim <= 256 else 32


def staircase_attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, scale=None, *,
                        block_q: int | None = None, block_k: int | None = None,
                        interpret: bool = False, window: int = 0):
  """Staircase attention, GPU kernel. q [B,Tq,Hq,Dh], k/v [B,Tk,Hkv,Dh] -> [B,Tq,Hq,Dh];
  tiles default to `default_tile(Dh)`; `window` > 0: the rule's sliding window over context
  keys.

  Returns the reason string of `unsupported` instead when it cannot run the case.
  """
  reason = unsupported(q, k, v)
  if reason:
    return reason
  tile = default_tile(q.shape[-1])
  return block_sparse.attention(BACKEND, q, k, v, q_meta, k_meta, scale=scale,
                                block_q=block_q or tile, block_k=block_k or tile,
                                interpret=interpret, window=window)


def count_visited_tiles(q, k, v, q_meta, k_meta, *, block_q=None, block_k=None,
                        interpret=False, window=0):
  """int32 [B, Hq, nq]: key tiles the forward kernel computed per query tile."""
  tile = default_tile(q.shape[-1])
  return block_sparse.count_visited_tiles(BACKEND, q, k, v, q_meta, k_meta,
                                          block_q=block_q or tile, block_k=block_k or tile,
                                          interpret=interpret, window=window)
