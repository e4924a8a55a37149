"""What the TPU and GPU staircase kernels share: layout, tile map, custom VJP
(docs/scaling.md#attention-kernels-and-accelerators).

A backend supplies two functions over head-major, tile-padded operands:

* `forward(cfg, q, k, v, q_meta, k_meta, tiles, count_visits)` -> `(out, lse)` or, with
  `count_visits`, `(out, lse, visits)` where `visits` is int32 [B, Hq, nq] (tiles computed);
* `backward(cfg, q, k, v, q_meta, k_meta, tiles, out, lse, d_out)` -> `(dq, dk, dv)`.

with q [B, Hq, Tq, Dh], k/v [B, Hkv, Tk, Dh], lse f32 [B, Hq, Tq] (0 for queries that see no
key). This module pads sequences to whole tiles with KIND_PAD tokens, builds the tile map once
and wires both passes into one `jax.custom_vjp` (`jax.grad` cannot see through a pallas_call).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.staircase_attention.meta import TokenMeta
from pallas_kernels.staircase_attention.tile_map import (build_tile_map, pad_meta,
                                                         static_count, static_max_steps)

MASKED_LOGIT = -1e30  # finite, like the reference: a fully masked tile never yields inf - inf


class KernelConfig(NamedTuple):
  """Static (hashable) kernel parameters."""
  scale: float
  block_q: int
  block_k: int
  groups: int    # query heads per key/value head (GQA)
  kv_steps: int  # grid length over the key-tile list of a query tile
  q_steps: int   # grid length over the query-tile list of a key tile
  interpret: bool
  window: int = 0         # the rule's sliding window over context keys (0: none)
  visited_tiles: int = 0  # (query tile, key tile) pairs computed per head, all rows: the tile
                          # map's count when concrete, every pair of the grid under a trace


class Backend(NamedTuple):
  name: str
  forward: Callable
  backward: Callable


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _pad_tokens(x, length: int):
  """[B, T, H, D] -> [B, H, length, D] (zero tokens at the end)."""
  x = jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))
  return x.transpose(0, 2, 1, 3)


def check_shapes(q, k, v) -> str | None:
  """A reason the operands cannot be attended, or None."""
  if q.ndim != 4 or k.shape != v.shape or k.ndim != 4:
    return f"expected q [B,Tq,Hq,Dh] and k == v [B,Tk,Hkv,Dh], got {q.shape}, {k.shape}, {v.shape}"
  if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
    return f"q {q.shape} and k {k.shape} disagree on batch or head_dim"
  if q.shape[2] % k.shape[2]:
    return f"query heads ({q.shape[2]}) must be a multiple of key/value heads ({k.shape[2]})"
  return None


def prepare(q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *, scale, block_q, block_k,
            interpret, window: int = 0):
  """Pads to whole tiles, builds the tile map and the static config."""
  b, tq, hq, dh = q.shape
  tk, hkv = k.shape[1], k.shape[2]
  tq_pad, tk_pad = _round_up(tq, block_q), _round_up(tk, block_k)
  q_meta, k_meta = pad_meta(q_meta, tq_pad), pad_meta(k_meta, tk_pad)
  tiles = build_tile_map(q_meta, k_meta, block_q, block_k, window)
  nq, nk = tq_pad // block_q, tk_pad // block_k
  cfg = KernelConfig(scale=float(dh ** -0.5 if scale is None else scale), block_q=block_q,
                     block_k=block_k, groups=hq // hkv,
                     kv_steps=static_max_steps(tiles.kv_counts, nk),
                     q_steps=static_max_steps(tiles.q_counts, nq), interpret=interpret,
                     window=window, visited_tiles=static_count(tiles.kv_counts, b * nq * nk))
  heads_major = (_pad_tokens(q, tq_pad), _pad_tokens(k, tk_pad), _pad_tokens(v, tk_pad))
  return cfg, heads_major, q_meta, k_meta, tiles


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _attend(backend: Backend, cfg: KernelConfig, q, k, v, q_meta, k_meta, tiles):
  return backend.forward(cfg, q, k, v, q_meta, k_meta, tiles, False)[0]


def _attend_fwd(backend, cfg, q, k, v, q_meta, k_meta, tiles):
  out, lse = backend.forward(cfg, q, k, v, q_meta, k_meta, tiles, False)
  return out, (q, k, v, q_meta, k_meta, tiles, out, lse)


def _attend_bwd(backend, cfg, residuals, d_out):
  q, k, v, q_meta, k_meta, tiles, out, lse = residuals
  dq, dk, dv = backend.backward(cfg, q, k, v, q_meta, k_meta, tiles, out, lse, d_out)
  return dq, dk, dv, None, None, None  # integer metadata has no cotangent


_attend.defvjp(_attend_fwd, _attend_bwd)


def attention(backend: Backend, q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *, scale=None,
              block_q: int, block_k: int, interpret: bool, window: int = 0):
  """Staircase attention through `backend`. q [B,Tq,Hq,Dh], k/v [B,Tk,Hkv,Dh] -> like q;
  `window` > 0: the rule's sliding window over context keys (`meta.staircase_visible`)."""
  cfg, (qh, kh, vh), q_meta, k_meta, tiles = prepare(
      q, k, v, q_meta, k_meta, scale=scale, block_q=block_q, block_k=block_k,
      interpret=interpret, window=window)
  out = _attend(backend, cfg, qh, kh, vh, q_meta, k_meta, tiles)
  return out.transpose(0, 2, 1, 3)[:, :q.shape[1]]


def count_visited_tiles(backend: Backend, q, k, v, q_meta: TokenMeta, k_meta: TokenMeta, *,
                        block_q: int, block_k: int, interpret: bool, window: int = 0):
  """Runs the forward kernel with its visit counter: int32 [B, Hq, nq] tiles computed.

  The counter is incremented by the kernel itself in every grid step / loop iteration that
  computes a tile, so a test can compare it with the tile map (skipped tiles cost nothing).
  """
  cfg, (qh, kh, vh), q_meta, k_meta, tiles = prepare(
      q, k, v, q_meta, k_meta, scale=None, block_q=block_q, block_k=block_k,
      interpret=interpret, window=window)
  return backend.forward(cfg, qh, kh, vh, q_meta, k_meta, tiles, True)[2]


def softmax_delta(out, d_out):
  """rowsum(dO * O), f32 [B, H, T]: the softmax-backward term shared by dq and dk."""
  return jnp.sum(out.astype(jnp.float32) * d_out.astype(jnp.float32), axis=-1)


def finish_softmax(m, l, acc, out_dtype):  # noqa: E741 (FlashAttention's m, l)
  """Normalizes the online-softmax accumulators; queries that saw no key get 0 and lse 0."""
  seen = l > 0
  safe_l = jnp.where(seen, l, 1.0)
  out = jnp.where(seen, acc / safe_l, 0.0).astype(out_dtype)
  lse = jnp.where(seen, m + jnp.log(safe_l), 0.0)
  return out, lse


_META_BYTES = 5 * 4  # the five int32 ids of a token (TokenMeta)
_FLOPS_PER_PAIR = {"fwd": 4, "dq": 6, "dkdv": 8}  # 2 x (QK^T, PV | +dO V^T, dS K | +P^T dO, dS^T Q)


def cost_estimate(cfg: KernelConfig, kernel: str, q, k) -> pl.CostEstimate:
  """What one pass (`fwd`, `dq` or `dkdv`) on head-major q [B, Hq, Tq, Dh], k [B, Hkv, Tk, Dh]
  computes and moves, for the compiler's cost analysis (a `pallas_call` counts only what it is
  told). Every visited tile pair does the pass's matmuls and one exp per score (`fwd`: one
  more per query row for the rescale, one log per query at the end); bytes are what the
  pipeline fetches per visited tile plus each query or key tile's own reads and writes once.
  Per query head: GQA heads re-read their key/value tiles."""
  batch, heads_q, tq, d = q.shape
  heads_kv, tk = k.shape[1], k.shape[2]
  itemsize = jnp.dtype(q.dtype).itemsize
  bq, bk = cfg.block_q, cfg.block_k
  visits = cfg.visited_tiles * heads_q
  q_tiles, k_tiles = batch * (tq // bq) * heads_q, batch * (tk // bk) * heads_kv
  flops = _FLOPS_PER_PAIR[kernel] * bq * bk * d * visits
  transcendentals = bq * bk * visits
  if kernel == "fwd":    # fetch k, v; q in, out and lse out
    transcendentals += bq * visits + bq * q_tiles
    moved = (visits * bk * (2 * d * itemsize + _META_BYTES)
             + q_tiles * bq * (2 * d * itemsize + 4 + _META_BYTES))
  elif kernel == "dq":   # fetch k, v; q, dO in, dq out, lse and delta in
    moved = (visits * bk * (2 * d * itemsize + _META_BYTES)
             + q_tiles * bq * (3 * d * itemsize + 8 + _META_BYTES))
  else:                  # fetch q, dO, lse, delta; k, v in, dk, dv out
    moved = (visits * bq * (2 * d * itemsize + 8 + _META_BYTES)
             + k_tiles * bk * (4 * d * itemsize + _META_BYTES))
  return pl.CostEstimate(flops=int(flops), transcendentals=int(transcendentals),
                         bytes_accessed=int(moved))
