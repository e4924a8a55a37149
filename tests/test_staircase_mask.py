import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.staircase_attention import (KIND_PAD, TokenMeta, attention, masked_attention,
                                                staircase_visible)
from tests.helpers import brute_force_visible, random_packed_meta


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
