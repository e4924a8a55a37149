import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.staircase_attention import (KIND_PAD, TokenMeta, attention, masked_attention,
                                                staircase_visible)
from pallas_kernels.staircase_attention import gpu, tile_map, tpu
from tests.support.helpers import (brute_force_token_causal_visible, brute_force_visible,
                           random_packed_meta, random_token_causal_meta)


@pytest.mark.parametrize("seed,block", [(0, 2), (1, 4), (2, 3), (3, 8)])
def test_mask_matches_brute_force(seed, block):
  meta = random_packed_meta(np.random.default_rng(seed), 160, block)
  expected = brute_force_visible(meta)
  got = np.asarray(staircase_visible(TokenMeta(*map(jnp.asarray, meta)),
                                     TokenMeta(*map(jnp.asarray, meta))))
  np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(staircase_visible(meta, meta, xp=np), expected)
  assert expected.any() and not expected.all()


def test_fully_masked_queries_give_zero_output_and_zero_grads():
  meta = random_packed_meta(np.random.default_rng(5), 64, 4)
  meta = TokenMeta(*(jnp.asarray(f)[None] for f in meta))
  assert (np.asarray(meta.kind) == KIND_PAD).any()
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 64, 4, 8)) for i in range(3))
  out = attention(q, k, v, meta, meta, impl="xla")
  pad = np.asarray(meta.kind[0]) == KIND_PAD
  assert np.all(np.asarray(out)[0, pad] == 0)
  grads = jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v, meta, meta, impl="xla") ** 2),
                   argnums=(0, 1, 2))(q, k, v)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  assert np.all(np.asarray(grads[0])[0, pad] == 0)


def test_masked_attention_matches_naive_softmax_with_gqa():
  rng = np.random.default_rng(0)
  q = rng.normal(size=(2, 5, 4, 8)).astype(np.float32)
  k = rng.normal(size=(2, 7, 2, 8)).astype(np.float32)
  v = rng.normal(size=(2, 7, 2, 8)).astype(np.float32)
  mask = rng.random((2, 5, 7)) < 0.6
  mask[:, :, 0] = True
  out = np.asarray(masked_attention(q, k, v, mask))
  for b in range(2):
    for h in range(4):
      s = q[b, :, h] @ k[b, :, h // 2].T / np.sqrt(8)
      s = np.where(mask[b], s, -np.inf)
      p = np.exp(s - s.max(-1, keepdims=True))
      p /= p.sum(-1, keepdims=True)
      np.testing.assert_allclose(out[b, :, h], p @ v[b, :, h // 2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed,canvas,window", [(0, 4, 0), (1, 4, 3), (2, 6, 5), (3, 3, 8),
                                                (4, 5, 1)])
def test_token_causal_stream_and_sliding_window_match_brute_force(seed, canvas, window):
  """DiffusionGemma's layout: a token-causal context stream (block = position) and the
  sliding window, against the rule written from positions and canvas starts."""
  meta, positions, start = random_token_causal_meta(np.random.default_rng(seed), 200, canvas)
  expected = brute_force_token_causal_visible(meta, positions, start, window)
  got = staircase_visible(TokenMeta(*map(jnp.asarray, meta)), TokenMeta(*map(jnp.asarray, meta)),
                          window=window)
  np.testing.assert_array_equal(np.asarray(got), expected)
  np.testing.assert_array_equal(staircase_visible(meta, meta, xp=np, window=window), expected)
  assert expected.any() and not expected.all()
  if window:   # the window really cuts: some pair the unwindowed rule keeps is dropped
    assert (brute_force_token_causal_visible(meta, positions, start) & ~expected).any()


@pytest.mark.parametrize("window", [0, 5])
def test_tile_map_and_kernels_with_a_window(window):
  """Tile summaries follow the windowed rule; the XLA reference, splash and the block-sparse
  Pallas kernels (TPU- and GPU-style, interpret mode) agree with the brute-force mask, values
  and gradients (DiffusionGemma's sliding layers)."""
  meta, positions, start = random_token_causal_meta(np.random.default_rng(7), 128, 4)
  dense = brute_force_token_causal_visible(meta, positions, start, window)
  meta_b = TokenMeta(*(jnp.asarray(f)[None] for f in meta))
  any_v, all_v = tile_map.tile_summaries(meta_b, meta_b, 16, 32, window)
  tiles = dense.reshape(8, 16, 4, 32)
  np.testing.assert_array_equal(np.asarray(any_v[0]), tiles.any(axis=(1, 3)))
  np.testing.assert_array_equal(np.asarray(all_v[0]), tiles.all(axis=(1, 3)))
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 128, 2, 16)) for i in range(3))
  d_out = jax.random.normal(jax.random.key(3), q.shape)

  def value_and_grads(fn):
    out, vjp = jax.vjp(fn, q, k, v)
    return (out, *vjp(d_out))

  want = value_and_grads(lambda q, k, v: masked_attention(q, k, v, jnp.asarray(dense)[None]))
  runs = {
      "xla": lambda q, k, v: attention(q, k, v, meta_b, meta_b, impl="xla", window=window),
      "splash": lambda q, k, v: attention(q, k, v, meta_b, meta_b, impl="splash",
                                          window=window),
      "pallas-tpu": lambda q, k, v: tpu.staircase_attention(
          q, k, v, meta_b, meta_b, block_q=16, block_k=32, interpret=True, window=window),
      "pallas-gpu": lambda q, k, v: gpu.staircase_attention(
          q, k, v, meta_b, meta_b, block_q=16, block_k=32, interpret=True, window=window)}
  for name, fn in runs.items():
    for what, g, w in zip(("out", "dq", "dk", "dv"), value_and_grads(fn), want):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-5,
                                 err_msg=f"{name} {what}")
