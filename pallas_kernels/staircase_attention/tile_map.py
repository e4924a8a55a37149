"""Which (query tile, key tile) pairs of a packed batch hold any visible pair
(docs/scaling.md#attention-kernels-and-accelerators).

The map is computed once per packed batch and drives every kernel: key tiles a query tile cannot
see are never listed, so they are never fetched; fully visible tiles skip the element-wise mask.
It is exact (a tile is listed iff some pair in it is visible) and jittable. No [S, S] mask is
materialized: the rule is evaluated one query tile at a time (`lax.map`), so the peak is
`[B, block_q, Tk]` booleans.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.staircase_attention.meta import KIND_PAD, TokenMeta, staircase_visible


class TileMap(NamedTuple):
  """Tile summaries and scalar-prefetch tables of one packed batch.

  `kv_tables[b, i, :kv_counts[b, i]]` are the non-empty key tiles of query tile i in ascending
  order; entries past the count repeat the last listed tile (0 if none), so a pipelined kernel
  that keeps stepping fetches nothing new. `q_tables` is the same list transposed (the query
  tiles each key tile is seen by) for the dk/dv pass; `*_full` flag fully visible tiles.
  """
  any_visible: jax.Array  # bool [B, nq, nk]
  all_visible: jax.Array  # bool [B, nq, nk]
  kv_tables: jax.Array    # int32 [B, nq, nk]
  kv_full: jax.Array      # int32 [B, nq, nk]   all_visible of the listed tile
  kv_counts: jax.Array    # int32 [B, nq]
  q_tables: jax.Array     # int32 [B, nk, nq]
  q_full: jax.Array       # int32 [B, nk, nq]
  q_counts: jax.Array     # int32 [B, nk]

  @property
  def num_nonempty(self) -> jax.Array:
    return jnp.sum(self.kv_counts)


def tile_summaries(q_meta: TokenMeta, k_meta: TokenMeta, block_q: int, block_k: int,
                   window: int = 0):
  """(any_visible, all_visible), bool [B, nq, nk]; Tq, Tk must be multiples of the tiles."""
  b, tq = q_meta.shape
  tk = k_meta.shape[1]
  if tq % block_q or tk % block_k:
    raise ValueError(f"sequence lengths ({tq}, {tk}) must be multiples of the tiles "
                     f"({block_q}, {block_k}); pad the metadata with KIND_PAD first.")
  nq, nk = tq // block_q, tk // block_k
  # [nq, B, block_q] per field: lax.map walks query tiles, one [B, block_q, Tk] slab at a time.
  q_tiles = TokenMeta(*(f.reshape(b, nq, block_q).transpose(1, 0, 2) for f in q_meta))

  def one_query_tile(q_tile: TokenMeta):
    visible = staircase_visible(q_tile, k_meta, window=window).reshape(b, block_q, nk, block_k)
    return jnp.any(visible, axis=(1, 3)), jnp.all(visible, axis=(1, 3))

  any_visible, all_visible = jax.lax.map(one_query_tile, q_tiles)  # [nq, B, nk]
  return any_visible.transpose(1, 0, 2), all_visible.transpose(1, 0, 2)


def compact_tables(nonempty: jax.Array, full: jax.Array):
  """Lists the True entries of `nonempty` [..., n] in order, padded by repeating the last one.

  Returns (tables int32 [..., n], full_of_listed int32 [..., n], counts int32 [...]).
  """
  n = nonempty.shape[-1]
  counts = jnp.sum(nonempty, axis=-1, dtype=jnp.int32)
  order = jnp.argsort(~nonempty, axis=-1, stable=True).astype(jnp.int32)  # listed first
  steps = jnp.minimum(jnp.arange(n, dtype=jnp.int32), jnp.maximum(counts[..., None] - 1, 0))
  tables = jnp.take_along_axis(order, steps, axis=-1)
  tables = jnp.where(counts[..., None] > 0, tables, 0)
  listed_full = jnp.take_along_axis(full, tables, axis=-1) & (counts[..., None] > 0)
  return tables, listed_full.astype(jnp.int32), counts


def build_tile_map(q_meta: TokenMeta, k_meta: TokenMeta, block_q: int, block_k: int,
                   window: int = 0) -> TileMap:
  """Tile summaries plus the per-query-tile and per-key-tile lists for scalar prefetch
  (`window`: the sliding window of the rule, `meta.staircase_visible`)."""
  any_visible, all_visible = tile_summaries(q_meta, k_meta, block_q, block_k, window)
  kv_tables, kv_full, kv_counts = compact_tables(any_visible, all_visible)
  q_tables, q_full, q_counts = compact_tables(any_visible.transpose(0, 2, 1),
                                              all_visible.transpose(0, 2, 1))
  return TileMap(any_visible, all_visible, kv_tables, kv_full, kv_counts,
                 q_tables, q_full, q_counts)


def static_max_steps(counts: jax.Array, default: int) -> int:
  """The longest list, when the map is concrete (eager call); `default` under a trace.

  A shorter grid only trims steps that would be skipped anyway, so both are correct.
  """
  try:
    return max(1, int(jnp.max(counts)))
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
    return default


def static_count(counts: jax.Array, default: int) -> int:
  """The listed tiles in all, when the map is concrete; `default` (every tile) under a trace."""
  try:
    return int(jnp.sum(counts))
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
    return default


def pad_meta(meta: TokenMeta, length: int) -> TokenMeta:
  """Right-pads [B, T] metadata with KIND_PAD tokens (which see nothing, and are never seen)."""
  extra = length - meta.shape[-1]
  if extra == 0:
    return meta
  pad = lambda f, value: jnp.pad(f, ((0, 0), (0, extra)), constant_values=value)
  return TokenMeta(segment=pad(meta.segment, -1), response=pad(meta.response, -1),
                   kind=pad(meta.kind, KIND_PAD), block=pad(meta.block, 0),
                   state_id=pad(meta.state_id, -1))
