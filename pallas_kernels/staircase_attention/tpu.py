"""Block-sparse staircase flash attention for TPU (Pallas Mosaic, scalar prefetch).

Grid `(B, Hq, nq, kv_steps)`: step j of query tile i computes key tile `kv_tables[b, i, j]`,
read from SMEM by the BlockSpec index maps, so the pipeline only ever DMAs listed (non-empty)
tiles; steps past the list repeat the last index (no new DMA) and are skipped by `pl.when`.
Fully visible tiles skip the element-wise mask; partial tiles rebuild it in-kernel from the
metadata tiles with the same rule as the reference (`staircase_visible_pairs`).

Backward is the usual two-kernel flash backward: dq walks the same key-tile lists; dk/dv walk
the transposed lists (query tiles per key tile) and the GQA group of query heads.

On CPU the kernels run with `interpret=True` (how the tests check them); libtpu compiles them
for v5e, v5p and v6e on any host (`orl_jax/aot/kernels.py`, `benchmarks/kernel_compile.py`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.staircase_attention import block_sparse
from pallas_kernels.staircase_attention.block_sparse import MASKED_LOGIT, KernelConfig
from pallas_kernels.staircase_attention.meta import TokenMeta, staircase_visible_pairs

_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b
_TN = (((0,), (0,)), ((), ()))  # a.T @ b
_N_FIELDS = len(TokenMeta._fields)
_VISIT_TILE = (8, 128)  # one aligned int32 vreg per query tile for the visit counter


def _meta_columns(meta: TokenMeta):
  """Query-side layout [B, T, 5]: a tile's field f is the column `[:, f:f+1]` ([bq, 1])."""
  return jnp.stack(list(meta), axis=-1)


def _meta_rows(meta: TokenMeta):
  """Key-side layout [B, 5, T]: a tile's field f is the row `[f:f+1, :]` ([1, bk])."""
  return jnp.stack(list(meta), axis=1)


def _kv_head(h, groups: int):
  """The key/value head of query head h (GQA). `lax.div` truncates, which equals floor division
  for these non-negative ids; `//` would emit a `sign` whose Mosaic lowering asks the chip's
  generation, so the kernel could not be lowered (exported, AOT-compiled) off a TPU."""
  return jax.lax.div(h, groups)


def _tile_visible(q_meta_tile, k_meta_tile, window: int):
  """bool [bq, bk] from a [bq, 5] query-metadata tile and a [5, bk] key-metadata tile."""
  q = TokenMeta(*(q_meta_tile[:, f:f + 1] for f in range(_N_FIELDS)))
  k = TokenMeta(*(k_meta_tile[f:f + 1, :] for f in range(_N_FIELDS)))
  return staircase_visible_pairs(q, k, window)


def _visit_listed(full, count, j, step):
  """Runs `step(masked)` when list entry j exists; the mask only for partial tiles."""
  @pl.when(j < count)
  def _():
    pl.when(full != 0)(functools.partial(step, False))
    pl.when(full == 0)(functools.partial(step, True))


# ---------------------------------------------------------------- forward


def _fwd_kernel(kv_tables, kv_full, kv_counts, q_ref, k_ref, v_ref, qm_ref, km_ref,
                o_ref, lse_ref, *rest, cfg: KernelConfig, nq: int, nk: int, count_visits: bool):
  visits_ref = rest[0] if count_visits else None
  m_sc, l_sc, acc_sc = rest[-3:]
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  row = b * nq + i

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full(m_sc.shape, MASKED_LOGIT, jnp.float32)
    l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
    acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)
    if visits_ref is not None:   # count_visits
      visits_ref[...] = jnp.zeros(visits_ref.shape, jnp.int32)

  def step(masked: bool):
    v = v_ref[...]
    s = jax.lax.dot_general(q_ref[...], k_ref[...], _NT,
                            preferred_element_type=jnp.float32) * cfg.scale
    if masked:
      visible = _tile_visible(qm_ref[...], km_ref[...], cfg.window)
      s = jnp.where(visible, s, MASKED_LOGIT)
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_new)
    if masked:
      p = jnp.where(visible, p, 0.0)
    alpha = jnp.exp(m_prev - m_new)
    l_sc[...] = alpha * l_sc[...] + jnp.sum(p, axis=1, keepdims=True)
    acc_sc[...] = alpha * acc_sc[...] + jax.lax.dot_general(
        p.astype(v.dtype), v, _NN, preferred_element_type=jnp.float32)
    m_sc[...] = m_new
    if visits_ref is not None:   # count_visits
      visits_ref[...] += 1

  _visit_listed(kv_full[row * nk + j], kv_counts[row], j, step)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    out, lse = block_sparse.finish_softmax(m_sc[...], l_sc[...], acc_sc[...], o_ref.dtype)
    o_ref[...] = out
    lse_ref[...] = lse


def _forward(cfg: KernelConfig, q, k, v, q_meta, k_meta, tiles, count_visits: bool):
  b, hq, tq, dh = q.shape
  tk = k.shape[2]
  bq, bk, g = cfg.block_q, cfg.block_k, cfg.groups
  nq, nk = tq // bq, tk // bk

  def kv_index(b_, h, i, j, tables, full, counts):
    return (b_, _kv_head(h, g), tables[(b_ * nq + i) * nk + j], 0)

  def km_index(b_, h, i, j, tables, full, counts):
    return (b_, 0, tables[(b_ * nq + i) * nk + j])

  q_tile = lambda b_, h, i, j, *_: (b_, h, i, 0)
  out_specs = [pl.BlockSpec((None, None, bq, dh), q_tile),
               pl.BlockSpec((None, None, bq, 1), q_tile)]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((b, hq, tq, 1), jnp.float32)]
  if count_visits:
    out_specs.append(pl.BlockSpec((None, None) + _VISIT_TILE, q_tile))
    out_shape.append(jax.ShapeDtypeStruct((b, hq, nq * _VISIT_TILE[0], _VISIT_TILE[1]),
                                          jnp.int32))
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=3,
      grid=(b, hq, nq, cfg.kv_steps),
      in_specs=[pl.BlockSpec((None, None, bq, dh), q_tile),
                pl.BlockSpec((None, None, bk, dh), kv_index),
                pl.BlockSpec((None, None, bk, dh), kv_index),
                pl.BlockSpec((None, bq, _N_FIELDS), lambda b_, h, i, j, *_: (b_, i, 0)),
                pl.BlockSpec((None, _N_FIELDS, bk), km_index)],
      out_specs=out_specs,
      scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                      pltpu.VMEM((bq, dh), jnp.float32)])
  kernel = functools.partial(_fwd_kernel, cfg=cfg, nq=nq, nk=nk, count_visits=count_visits)
  results = pl.pallas_call(
      kernel, grid_spec=grid_spec, out_shape=out_shape, interpret=cfg.interpret,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      name="staircase_fwd", cost_estimate=block_sparse.cost_estimate(cfg, "fwd", q, k),
  )(tiles.kv_tables.reshape(-1), tiles.kv_full.reshape(-1), tiles.kv_counts.reshape(-1),
    q, k, v, _meta_columns(q_meta), _meta_rows(k_meta))
  out, lse = results[0], results[1][..., 0]
  if not count_visits:
    return out, lse
  return out, lse, results[2][:, :, ::_VISIT_TILE[0], 0]


# ---------------------------------------------------------------- backward


def _probs(q, k, lse, qm, km, cfg: KernelConfig, masked):
  """exp(s - lse) for one tile; masked entries 0 (also for queries that see no key)."""
  s = jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * cfg.scale
  p = jnp.exp(s - lse)
  if masked:
    p = jnp.where(_tile_visible(qm, km, cfg.window), p, 0.0)
  return p


def _dq_kernel(kv_tables, kv_full, kv_counts, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
               qm_ref, km_ref, dq_ref, dq_sc, *, cfg: KernelConfig, nq: int, nk: int):
  b, i, j = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  row = b * nq + i

  @pl.when(j == 0)
  def _init():
    dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

  def step(masked: bool):
    k = k_ref[...]
    p = _probs(q_ref[...], k, lse_ref[...], qm_ref[...], km_ref[...], cfg, masked)
    dp = jax.lax.dot_general(do_ref[...], v_ref[...], _NT, preferred_element_type=jnp.float32)
    ds = p * (dp - delta_ref[...])
    dq_sc[...] += jax.lax.dot_general(ds.astype(k.dtype), k, _NN,
                                      preferred_element_type=jnp.float32)

  _visit_listed(kv_full[row * nk + j], kv_counts[row], j, step)

  @pl.when(j == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[...] = (dq_sc[...] * cfg.scale).astype(dq_ref.dtype)


def _dkdv_kernel(q_tables, q_full, q_counts, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref,
                 qm_ref, km_ref, dk_ref, dv_ref, dk_sc, dv_sc, *, cfg: KernelConfig, nq: int,
                 nk: int):
  b, kt, g, j = pl.program_id(0), pl.program_id(2), pl.program_id(3), pl.program_id(4)
  row = b * nk + kt

  @pl.when((g == 0) & (j == 0))
  def _init():
    dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
    dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

  def step(masked: bool):
    q, do = q_ref[...], do_ref[...]
    p = _probs(q, k_ref[...], lse_ref[...], qm_ref[...], km_ref[...], cfg, masked)
    dv_sc[...] += jax.lax.dot_general(p.astype(do.dtype), do, _TN,
                                      preferred_element_type=jnp.float32)
    dp = jax.lax.dot_general(do, v_ref[...], _NT, preferred_element_type=jnp.float32)
    ds = p * (dp - delta_ref[...])
    dk_sc[...] += jax.lax.dot_general(ds.astype(q.dtype), q, _TN,
                                      preferred_element_type=jnp.float32)

  _visit_listed(q_full[row * nq + j], q_counts[row], j, step)

  @pl.when((g == pl.num_programs(3) - 1) & (j == pl.num_programs(4) - 1))
  def _finish():
    dk_ref[...] = (dk_sc[...] * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _backward(cfg: KernelConfig, q, k, v, q_meta, k_meta, tiles, out, lse, d_out):
  b, hq, tq, dh = q.shape
  hkv, tk = k.shape[1], k.shape[2]
  bq, bk, groups = cfg.block_q, cfg.block_k, cfg.groups
  nq, nk = tq // bq, tk // bk
  lse = lse[..., None]                                       # [B, Hq, Tq, 1]
  delta = block_sparse.softmax_delta(out, d_out)[..., None]  # [B, Hq, Tq, 1]
  q_cols, k_rows = _meta_columns(q_meta), _meta_rows(k_meta)
  semantics = pltpu.CompilerParams(
      dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))

  # dq: the forward's loop structure.
  def kv_index(b_, h, i, j, tables, full, counts):
    return (b_, _kv_head(h, groups), tables[(b_ * nq + i) * nk + j], 0)

  def km_index(b_, h, i, j, tables, full, counts):
    return (b_, 0, tables[(b_ * nq + i) * nk + j])

  q_tile = lambda b_, h, i, j, *_: (b_, h, i, 0)
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, cfg=cfg, nq=nq, nk=nk),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3,
          grid=(b, hq, nq, cfg.kv_steps),
          in_specs=[pl.BlockSpec((None, None, bq, dh), q_tile),
                    pl.BlockSpec((None, None, bk, dh), kv_index),
                    pl.BlockSpec((None, None, bk, dh), kv_index),
                    pl.BlockSpec((None, None, bq, dh), q_tile),
                    pl.BlockSpec((None, None, bq, 1), q_tile),
                    pl.BlockSpec((None, None, bq, 1), q_tile),
                    pl.BlockSpec((None, bq, _N_FIELDS), lambda b_, h, i, j, *_: (b_, i, 0)),
                    pl.BlockSpec((None, _N_FIELDS, bk), km_index)],
          out_specs=pl.BlockSpec((None, None, bq, dh), q_tile),
          scratch_shapes=[pltpu.VMEM((bq, dh), jnp.float32)]),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      interpret=cfg.interpret, compiler_params=semantics, name="staircase_dq",
      cost_estimate=block_sparse.cost_estimate(cfg, "dq", q, k),
  )(tiles.kv_tables.reshape(-1), tiles.kv_full.reshape(-1), tiles.kv_counts.reshape(-1),
    q, k, v, d_out, lse, delta, q_cols, k_rows)

  # dk, dv: per key tile, every query head of its GQA group, over the listed query tiles.
  def qh_index(b_, hk, t, g, j, tables, full, counts):
    return (b_, hk * groups + g, tables[(b_ * nk + t) * nq + j], 0)

  def qm_index(b_, hk, t, g, j, tables, full, counts):
    return (b_, tables[(b_ * nk + t) * nq + j], 0)

  k_tile = lambda b_, hk, t, g, j, *_: (b_, hk, t, 0)
  dk, dv = pl.pallas_call(
      functools.partial(_dkdv_kernel, cfg=cfg, nq=nq, nk=nk),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=3,
          grid=(b, hkv, nk, groups, cfg.q_steps),
          in_specs=[pl.BlockSpec((None, None, bq, dh), qh_index),
                    pl.BlockSpec((None, None, bk, dh), k_tile),
                    pl.BlockSpec((None, None, bk, dh), k_tile),
                    pl.BlockSpec((None, None, bq, dh), qh_index),
                    pl.BlockSpec((None, None, bq, 1), qh_index),
                    pl.BlockSpec((None, None, bq, 1), qh_index),
                    pl.BlockSpec((None, bq, _N_FIELDS), qm_index),
                    pl.BlockSpec((None, _N_FIELDS, bk), lambda b_, hk, t, g, j, *_: (b_, 0, t))],
          out_specs=[pl.BlockSpec((None, None, bk, dh), k_tile),
                     pl.BlockSpec((None, None, bk, dh), k_tile)],
          scratch_shapes=[pltpu.VMEM((bk, dh), jnp.float32),
                          pltpu.VMEM((bk, dh), jnp.float32)]),
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      interpret=cfg.interpret,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary", "arbitrary")),
      name="staircase_dkdv", cost_estimate=block_sparse.cost_estimate(cfg, "dkdv", q, k),
  )(tiles.q_tables.reshape(-1), tiles.q_full.reshape(-1), tiles.q_counts.reshape(-1),
    q, k, v, d_out, lse, delta, q_cols, k_rows)
  return dq, dk, dv


BACKEND = block_sparse.Backend("tpu", _forward, _backward)


def unsupported(q, k, v) -> str | None:
  return block_sparse.check_shapes(q, k, v)


def staircase_attention(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, scale=None, *,
                        block_q: int = 128, block_k: int = 128, interpret: bool = False,
                        window: int = 0):
  """Staircase attention, TPU kernel. q [B,Tq,Hq,Dh], k/v [B,Tk,Hkv,Dh] -> [B,Tq,Hq,Dh];
  `window` > 0: the rule's sliding window over context keys.

  Returns the reason string of `unsupported` instead when it cannot run the case.
  """
  reason = unsupported(q, k, v)
  if reason:
    return reason
  return block_sparse.attention(BACKEND, q, k, v, q_meta, k_meta, scale=scale,
                                block_q=block_q, block_k=block_k, interpret=interpret,
                                window=window)


def count_visited_tiles(q, k, v, q_meta, k_meta, *, block_q=128, block_k=128, interpret=False,
                        window=0):
  """int32 [B, Hq, nq]: key tiles the forward kernel computed per query tile."""
  return block_sparse.count_visited_tiles(BACKEND, q, k, v, q_meta, k_meta, block_q=block_q,
                                          block_k=block_k, interpret=interpret, window=window)
