"""Pallas staircase kernels vs the dense XLA reference (CPU, interpret mode;
docs/scaling.md#attention-kernels-and-accelerators).

Values and gradients (dq, dk, dv) of the TPU-style and GPU-style kernels and of splash are
checked on random packed rows (several prompt groups per row, clean context, states, trailing
padding that covers whole query tiles), eagerly, under `jax.jit` and under `jax.shard_map` on 4
fake CPU devices; the tile map is checked against a brute-force dense mask, and the tiles the
kernels visit against the non-empty tiles. Tolerances: f32 1e-4, bf16 4e-2 (relative to the
largest reference magnitude). The exhaustive sweep is `@pytest.mark.slow` (`make test-slow`;
`make test` deselects it).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from pallas_kernels.staircase_attention import (TokenMeta, attention, build_tile_map, dispatch,
                                                gpu, splash, staircase_attention_reference,
                                                staircase_visible, target_platform, testing,
                                                tpu)

TOLERANCE = {jnp.float32: 1e-4, jnp.bfloat16: 4e-2}
BACKENDS = {"tpu": tpu, "gpu": gpu}


def _meta(seed, batch, seq_len, block_size, fill=1.0, **sizes) -> TokenMeta:
  rng = np.random.default_rng(seed)
  meta = testing.random_packed_meta(rng, batch, seq_len, block_size, fill=fill, **sizes)
  return TokenMeta(*(jnp.asarray(f) for f in meta))


def _qkv(seed, batch, seq_len, hq, hkv, dh, dtype):
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (batch, seq_len, hq, dh), jnp.float32).astype(dtype)
  k = jax.random.normal(keys[1], (batch, seq_len, hkv, dh), jnp.float32).astype(dtype)
  v = jax.random.normal(keys[2], (batch, seq_len, hkv, dh), jnp.float32).astype(dtype)
  d_out = jax.random.normal(keys[3], q.shape, jnp.float32).astype(dtype)
  return q, k, v, d_out


def _value_and_grads(fn, q, k, v, meta, d_out):
  out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, meta), q, k, v)
  return (out, *vjp(d_out))


def _assert_close(got, want, dtype, what):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  assert np.all(np.isfinite(got)), f"{what}: non-finite values"
  err = np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want)))
  assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.2e}"


def _check_against_reference(kernel_fn, meta, q, k, v, d_out, dtype, jit=False):
  ref_fn = lambda q, k, v, m: staircase_attention_reference(q, k, v, m, m)
  run = lambda fn: (jax.jit(_value_and_grads, static_argnums=0) if jit else _value_and_grads)(
      fn, q, k, v, meta, d_out)
  got, want = run(kernel_fn), run(ref_fn)
  for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
    _assert_close(g, w, dtype, name)
  # Padding (and any query that sees nothing) outputs exactly zero with zero gradient.
  blind = ~np.asarray(staircase_visible(meta, meta)).any(-1)  # [B, T]
  assert np.all(np.asarray(got[0], np.float32)[blind] == 0)
  assert np.all(np.asarray(got[1], np.float32)[blind] == 0)


def _tile_nonempty_dense(meta, block_q, block_k):
  """Brute force: which tiles of the dense mask hold a visible pair."""
  dense = np.asarray(staircase_visible(meta, meta))
  b, t, _ = dense.shape
  tiles = dense.reshape(b, t // block_q, block_q, t // block_k, block_k)
  return tiles.any(axis=(2, 4)), tiles.all(axis=(2, 4))


# ------------------------------------------------------------------ tile map


@pytest.mark.parametrize("block_size,block_q,block_k", [(4, 16, 32), (8, 32, 16), (32, 64, 64)])
def test_tile_map_matches_dense_mask(block_size, block_q, block_k):
  meta = _meta(1, 3, 256, block_size, fill=0.7)
  tiles = build_tile_map(meta, meta, block_q, block_k)
  any_dense, all_dense = _tile_nonempty_dense(meta, block_q, block_k)
  np.testing.assert_array_equal(tiles.any_visible, any_dense)
  np.testing.assert_array_equal(tiles.all_visible, all_dense)
  assert any_dense.sum() < any_dense.size  # the layout really has empty tiles to skip
  for b in range(3):
    for i in range(any_dense.shape[1]):
      listed = np.asarray(tiles.kv_tables[b, i, :tiles.kv_counts[b, i]])
      np.testing.assert_array_equal(listed, np.flatnonzero(any_dense[b, i]))
      np.testing.assert_array_equal(tiles.kv_full[b, i, :len(listed)], all_dense[b, i, listed])
    for t in range(any_dense.shape[2]):
      listed = np.asarray(tiles.q_tables[b, t, :tiles.q_counts[b, t]])
      np.testing.assert_array_equal(listed, np.flatnonzero(any_dense[b, :, t]))


# ------------------------------------------------------------------ kernels vs reference

# (block size, S, fill, Hq, Hkv, head_dim, dtype, tile_q, tile_k)
DEFAULT_CASES = {
    "f32-b8-gqa-padded-tiles": (8, 128, 0.5, 4, 2, 64, jnp.float32, 32, 32),
    "bf16-b32-mha-d128": (32, 256, 1.0, 2, 2, 128, jnp.bfloat16, 64, 128),
}


def _run_case(backend, case, seed=0, jit=False):
  block_size, seq_len, fill, hq, hkv, dh, dtype, tile_q, tile_k = case
  sizes = dict(max_responses=2, max_response_blocks=2, max_states=2)
  if block_size == 32:
    sizes = dict(max_prompt_blocks=1, max_responses=2, max_response_blocks=1, max_states=2)
  meta = _meta(seed, 2, seq_len, block_size, fill=fill, **sizes)
  q, k, v, d_out = _qkv(seed, 2, seq_len, hq, hkv, dh, dtype)
  kernel_fn = lambda q, k, v, m: BACKENDS[backend].staircase_attention(
      q, k, v, m, m, block_q=tile_q, block_k=tile_k, interpret=True)
  _check_against_reference(kernel_fn, meta, q, k, v, d_out, dtype, jit=jit)


@pytest.mark.parametrize("case", list(DEFAULT_CASES))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_kernel_matches_reference(backend, case):
  _run_case(backend, DEFAULT_CASES[case])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_kernel_matches_reference_under_jit(backend):
  """Under jit the metadata is traced: full-length grids, same results."""
  _run_case(backend, DEFAULT_CASES["f32-b8-gqa-padded-tiles"], seed=3, jit=True)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_visited_tiles_equal_nonempty_tiles(backend):
  block_q = block_k = 32
  meta = _meta(5, 2, 256, 8, fill=0.8)
  q, k, v, _ = _qkv(5, 2, 256, 2, 1, 64, jnp.float32)
  visits = BACKENDS[backend].count_visited_tiles(q, k, v, meta, meta, block_q=block_q,
                                                 block_k=block_k, interpret=True)
  nonempty, _ = _tile_nonempty_dense(meta, block_q, block_k)
  for h in range(2):  # every query head visits exactly its query tile's non-empty key tiles
    np.testing.assert_array_equal(visits[:, h], nonempty.sum(-1))
  assert int(visits.sum()) == 2 * int(build_tile_map(meta, meta, block_q, block_k).num_nonempty)
  assert nonempty.sum() < nonempty.size


def _pallas_calls(fn, *args) -> dict:
  """pallas_call name -> its cost estimate, for every kernel `fn(*args)` traces."""
  found = {}

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "pallas_call":
        found[str(eqn.params["name"])] = eqn.params["cost_estimate"]
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if hasattr(sub, "eqns"):
            walk(sub)
          elif hasattr(getattr(sub, "jaxpr", None), "eqns"):
            walk(sub.jaxpr)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def _hand_count(nonempty, hq, hkv, bq, bk, dh, itemsize) -> dict:
  """(flops, transcendentals, bytes) per pass, enumerating what each kernel does: per query
  tile (per key tile for dk/dv) and head its own reads and writes, per listed tile its fetches
  and a tile's matmuls (2 x bq x bk x dh FLOPs each) and exps."""
  count = {p: [0, 0, 0] for p in ("fwd", "dq", "dkdv")}
  matmuls = {"fwd": 2, "dq": 3, "dkdv": 4}
  tile_ids, tile = 20, bq * bk
  batch, nq, nk = nonempty.shape
  for b in range(batch):
    for _head in range(hq):
      for i in range(nq):
        listed = np.flatnonzero(nonempty[b, i])
        count["fwd"][1] += bq                                   # log of the sum
        count["fwd"][2] += bq * (2 * dh * itemsize + 4 + tile_ids)  # q, out, lse, ids
        count["dq"][2] += bq * (3 * dh * itemsize + 8 + tile_ids)   # q, dO, dq, lse, delta
        for _ in listed:
          for p in count:
            count[p][0] += matmuls[p] * 2 * tile * dh
            count[p][1] += tile
          count["fwd"][1] += bq                                 # the rescale
          for p in ("fwd", "dq"):
            count[p][2] += bk * (2 * dh * itemsize + tile_ids)  # k, v, ids
        count["dkdv"][2] += len(listed) * bq * (2 * dh * itemsize + 8 + tile_ids)
    count["dkdv"][2] += hkv * nk * bk * (4 * dh * itemsize + tile_ids)  # k, v, dk, dv, ids
  return count


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_cost_estimates_count_the_work_of_the_visited_tiles(backend, monkeypatch):
  """Every pallas_call tells the compiler's cost analysis its FLOPs, exps and bytes: with a
  concrete tile map (an eager call) those of the listed tiles, checked against a count over
  the brute-force mask; under `jit` (traced metadata) those of every tile pair of the grid."""
  bq = bk = 32
  meta = _meta(5, 2, 128, 8, fill=0.8)
  q, k, v, d_out = _qkv(5, 2, 128, 4, 2, 32, jnp.float32)
  run = lambda q, k, v, m: BACKENDS[backend].staircase_attention(
      q, k, v, m, m, block_q=bq, block_k=bk, interpret=True)
  nonempty, _ = _tile_nonempty_dense(meta, bq, bk)
  assert 0 < nonempty.sum() < nonempty.size
  calls = {}

  def recording_call(kernel, **kwargs):   # records the estimate; zeros stand for the results
    calls[kwargs["name"]] = kwargs["cost_estimate"]
    zeros = lambda s: jnp.zeros(s.shape, s.dtype)
    return lambda *operands: jax.tree.map(zeros, kwargs["out_shape"])

  monkeypatch.setattr(pl, "pallas_call", recording_call)
  for traced in (False, True):
    calls.clear()
    if traced:
      jax.make_jaxpr(lambda *m: _value_and_grads(run, q, k, v, TokenMeta(*m), d_out))(*meta)
    else:
      _value_and_grads(run, q, k, v, meta, d_out)
    want = _hand_count(np.ones_like(nonempty) if traced else nonempty, 4, 2, bq, bk, 32, 4)
    assert len(calls) == 3, calls
    for name, estimate in calls.items():
      pass_ = next(p for p in ("dkdv", "dq", "fwd") if p in name)
      got = [estimate.flops, estimate.transcendentals, estimate.bytes_accessed]
      assert got == want[pass_], (traced, name, got, want[pass_])


def test_auto_passes_over_splash_when_its_traced_mask_is_large():
  """On a TPU, `auto` takes splash for concrete metadata and for traced metadata whose dense
  mask is small, and the block-sparse kernel once splash's traced mask would exceed
  `splash.TRACED_MASK_LIMIT_BYTES` (8 query heads a group x 1024^2 x int32 = 32 MiB)."""
  def kernels_traced(seq_len, traced):
    meta = _meta(3, 1, seq_len, 32)
    q, k, v, _ = _qkv(3, 1, seq_len, 8, 1, 64, jnp.bfloat16)
    fn = lambda q, k, v, *m: attention(q, k, v, TokenMeta(*m), TokenMeta(*m), impl="auto")
    with target_platform("tpu"):
      if traced:
        return set(_pallas_calls(fn, q, k, v, *meta))
      return set(_pallas_calls(lambda q, k, v: fn(q, k, v, *meta), q, k, v))

  assert 8 * 256 * 256 * 4 <= splash.TRACED_MASK_LIMIT_BYTES < 8 * 1024 * 1024 * 4
  assert all("splash" in n for n in kernels_traced(256, traced=True))
  assert all("splash" in n for n in kernels_traced(1024, traced=False))
  assert kernels_traced(1024, traced=True) == {"staircase_fwd"}


@pytest.mark.parametrize("jit", [False, True], ids=["static-mask", "dynamic-mask"])
def test_splash_matches_reference(jit):
  meta = _meta(7, 2, 256, 8, fill=0.6)
  q, k, v, d_out = _qkv(7, 2, 256, 4, 2, 64, jnp.float32)
  kernel_fn = lambda q, k, v, m: splash.staircase_attention(q, k, v, m, m, interpret=True)
  _check_against_reference(kernel_fn, meta, q, k, v, d_out, jnp.float32, jit=jit)


def test_dispatch_runs_an_explicit_kernel_or_says_why_not():
  meta = _meta(9, 2, 96, 8, fill=0.8)
  q, k, v, _ = _qkv(9, 2, 96, 2, 2, 64, jnp.float32)
  want = staircase_attention_reference(q, k, v, meta, meta)
  got = attention(q, k, v, meta, meta, impl="pallas")  # CPU: TPU-style kernel, interpret mode
  _assert_close(got, want, jnp.float32, "pallas via dispatch")
  with pytest.raises(ValueError, match="'splash' cannot run: splash needs sequence lengths"):
    attention(q, k, v, meta, meta, impl="splash")  # 96 is not a multiple of 128
  with target_platform("cuda"), pytest.raises(ValueError, match="no 'splash' kernel for .*gpu"):
    attention(q, k, v, meta, meta, impl="splash")


def test_dispatch_auto_falls_back_once_with_a_warning(caplog, monkeypatch):
  monkeypatch.setattr(dispatch, "warned", set())
  meta = _meta(9, 2, 96, 8, fill=0.8)
  q, k, v, _ = _qkv(9, 2, 96, 2, 2, 12, jnp.float32)  # head_dim 12: not for the GPU kernel
  want = staircase_attention_reference(q, k, v, meta, meta)
  with target_platform("cuda"), caplog.at_level(logging.WARNING):
    first = attention(q, k, v, meta, meta, impl="auto")
    second = attention(q, k, v, meta, meta, impl="auto")
  warnings = [r.message for r in caplog.records if "falling back to 'xla'" in r.message]
  assert len(warnings) == 1 and "power-of-two head_dim" in warnings[0], warnings
  np.testing.assert_array_equal(first, want)
  np.testing.assert_array_equal(second, want)


_SHARD_MAP_SCRIPT = textwrap.dedent("""
  import jax
  jax.config.update("jax_num_cpu_devices", 4)
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, PartitionSpec as P
  from pallas_kernels.staircase_attention import (TokenMeta, gpu, splash,
                                                  staircase_attention_reference, testing, tpu)
  assert len(jax.devices()) == 4, jax.devices()
  meta = testing.random_packed_meta(np.random.default_rng(11), 4, 128, 8, fill=0.7)
  keys = jax.random.split(jax.random.key(11), 4)
  q = jax.random.normal(keys[0], (4, 128, 4, 64))
  k, v = (jax.random.normal(key, (4, 128, 2, 64)) for key in keys[1:3])
  d_out = jax.random.normal(keys[3], q.shape)
  mesh = Mesh(np.array(jax.devices()), ("data",))

  def value_and_grads(fn):
    def local(q, k, v, d_out, *meta):
      meta = TokenMeta(*meta)
      out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, meta, meta), q, k, v)
      return (out, *vjp(d_out))
    sharded = jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                            check_vma=False)
    return jax.jit(sharded)(q, k, v, d_out, *meta)

  want = value_and_grads(staircase_attention_reference)
  for backend in (tpu, gpu):
    got = value_and_grads(lambda q, k, v, qm, km: backend.staircase_attention(
        q, k, v, qm, km, block_q=32, block_k=32, interpret=True))
    err = max(float(jnp.max(jnp.abs(g - w))) for g, w in zip(got, want))
    print(backend.__name__, "max_abs_err", err)
    assert err < 1e-4, err
  # splash under shard_map sees traced metadata: its dynamic-mask path.
  got = value_and_grads(lambda q, k, v, qm, km: splash.staircase_attention(
      q, k, v, qm, km, interpret=True))
  err = max(float(jnp.max(jnp.abs(g - w))) for g, w in zip(got, want))
  print("splash max_abs_err", err)
  assert err < 1e-4, err
  print("SHARD_MAP_OK")
""")


def test_kernels_under_shard_map_on_4_cpu_devices():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _SHARD_MAP_SCRIPT], capture_output=True,
                          text=True, env=env, timeout=600)
  assert "SHARD_MAP_OK" in result.stdout, result.stdout + result.stderr


# ------------------------------------------------------------------ exhaustive sweep (slow)

SWEEP = [(bs, s, fill, hq, hkv, dh, dtype, tq, tk)
         for bs, s, tq, tk in [(4, 128, 32, 32), (8, 256, 32, 64), (32, 256, 128, 64)]
         for dh in (64, 128)
         for dtype in (jnp.float32, jnp.bfloat16)
         for fill, hq, hkv in [(0.6, 4, 1), (1.0, 4, 2)]]


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(SWEEP)))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_kernel_sweep(backend, case):
  _run_case(backend, SWEEP[case], seed=100 + case)


def test_splash_kernel_cache_does_not_leak_tracers():
  """A splash kernel cached while tracing one `jit` is reused by the next trace: it must hold no
  tracer (jit(f) then jit(grad(f)) with the same concrete metadata raised UnexpectedTracerError)."""
  meta = TokenMeta(*(np.asarray(f) for f in _meta(13, 1, 128, 8)))  # concrete: cached kernel
  q, k, v, _ = _qkv(13, 1, 128, 2, 1, 64, jnp.float32)
  loss = lambda q: jnp.sum(splash.staircase_attention(q, k, v, meta, meta, interpret=True))
  value = jax.jit(loss)(q)
  grad = jax.jit(jax.grad(loss))(q)
  reference_sum = lambda q: jnp.sum(staircase_attention_reference(q, k, v, meta, meta))
  want = jax.value_and_grad(reference_sum)(q)
  _assert_close(value, want[0], jnp.float32, "value")
  _assert_close(grad, want[1], jnp.float32, "grad")
