"""The tiny model. Rerun under other CPU numerics (`numerics`): the exact logits of two different
models (plain vs a zero residual pathway) and the KV-cache decode's token ids and forward counts."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import lockstep_decoder
from orl_jax.residual import Residual, residual_from_logits
from orl_jax.unmasking import UnmaskRule
from pallas_kernels.staircase_attention import KIND_PROMPT, make_meta
from tests.support.helpers import TINY, TINY_RULES, TINY_BLOCK, tiny_model


def _inputs(b=2, t=12, seed=0):
  tokens = jax.random.randint(jax.random.key(seed), (b, t), 2, TINY.vocab_size)
  tokens = tokens.at[:, 5:9].set(TINY.mask_id)
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  meta = make_meta(jnp.full((b, t), KIND_PROMPT), pos // TINY_BLOCK)
  z = jax.random.normal(jax.random.key(seed + 1), (b, t, TINY.d_model))
  alpha = jax.random.uniform(jax.random.key(seed + 2), (b, t))
  return tokens, pos, meta, Residual(z, alpha)


def _same_base(model_a, model_b):
  """Copies model_a's shared parameters into model_b (the adapter keeps its own init)."""
  pa = nnx.state(model_a, nnx.Param).to_pure_dict()
  sb = nnx.state(model_b, nnx.Param)
  pb = sb.to_pure_dict()
  for k in pa:
    pb[k] = pa[k]
  nnx.replace_by_pure_dict(sb, pb)
  nnx.update(model_b, sb)


@pytest.mark.numerics
def test_adapter_model_equals_plain_model_at_init():
  tokens, pos, meta, res = _inputs()
  plain = tiny_model(0)
  adapter = tiny_model(1, residual_mode="adapter")
  _same_base(plain, adapter)
  a = plain(tokens, pos, meta).logits
  b = adapter(tokens, pos, meta, residual=res)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b.logits))
  assert float(b.residual_norm_ratio) == 0.0
  # ... and it is a real pathway: a non-zero output projection changes the masked positions only.
  st = nnx.state(adapter, nnx.Param)
  kernel = st["adapter"]["down_proj"]["kernel"]
  kernel[...] = jnp.ones_like(kernel[...])
  nnx.update(adapter, st)
  c = adapter(tokens, pos, meta, residual=res)
  assert float(c.residual_norm_ratio) > 0
  assert not np.allclose(np.asarray(c.logits), np.asarray(a))


@pytest.mark.numerics
def test_rcd_with_zero_residual_equals_plain_model():
  tokens, pos, meta, res = _inputs()
  plain = tiny_model(0)
  rcd = tiny_model(0, residual_mode="rcd")
  zero = Residual(jnp.zeros_like(res.z), jnp.zeros_like(res.alpha))
  np.testing.assert_array_equal(np.asarray(plain(tokens, pos, meta).logits),
                                np.asarray(rcd(tokens, pos, meta, residual=zero).logits))
  # alpha = 0 with a non-zero z is still the mask embedding; alpha > 0 moves it.
  np.testing.assert_allclose(np.asarray(plain(tokens, pos, meta).logits),
                             np.asarray(rcd(tokens, pos, meta, residual=res._replace(
                                 alpha=jnp.zeros_like(res.alpha))).logits), atol=1e-6)
  assert not np.allclose(np.asarray(plain(tokens, pos, meta).logits),
                         np.asarray(rcd(tokens, pos, meta, residual=res).logits))


def test_rope_is_relative():
  """Shifting every position by a constant leaves the logits unchanged (RoPE, no abs. emb.)."""
  tokens, pos, meta, _ = _inputs()
  m = tiny_model(0)
  np.testing.assert_allclose(np.asarray(m(tokens, pos, meta).logits),
                             np.asarray(m(tokens, pos + 17, meta).logits), atol=2e-5)


def test_residual_soft_embedding_is_probability_weighted_table():
  logits = jax.random.normal(jax.random.key(0), (1, 3, 5))
  table = jax.random.normal(jax.random.key(1), (5, 4))
  r = residual_from_logits(logits, table, embed_scale=2.0, temperature=1.0, dtype=jnp.float32)
  p = np.asarray(jax.nn.softmax(logits, -1))
  np.testing.assert_allclose(np.asarray(r.z), 2.0 * p @ np.asarray(table), rtol=1e-5)
  h = -(p * np.log(p)).sum(-1) / np.log(5)
  np.testing.assert_allclose(np.asarray(r.alpha), h, rtol=1e-5)


@pytest.mark.numerics
@pytest.mark.parametrize("mode,rule,temperature", [
    ("none", UnmaskRule("threshold", 0.3), 0.0),
    ("adapter", UnmaskRule("entropy_budget", 0.4), 1.0),
    ("rcd", UnmaskRule("fixed_steps", 2), 0.7),
])
def test_kv_cache_decoding_equals_full_recompute(mode, rule, temperature):
  model = tiny_model(3, residual_mode=mode)
  if mode == "adapter":  # make the pathway non-trivial
    st = nnx.state(model, nnx.Param)
    k = st["adapter"]["down_proj"]["kernel"]
    k[...] = 0.05 * jax.random.normal(jax.random.key(9), k[...].shape)
    nnx.update(model, st)
  graphdef, params = nnx.split(model)
  cfg = DecodeConfig(gen_length=12, block_size=4, mask_id=TINY.mask_id, eos_id=2, rule=rule,
                     temperature=temperature, capture_states=40,
                     **TINY_RULES)
  prompts = jax.random.randint(jax.random.key(0), (3, 8), 3, TINY.vocab_size)
  valid = jnp.arange(8)[None] >= jnp.array([0, 3, 6])[:, None]
  key = jax.random.key(4)
  cached = lockstep_decoder(graphdef, cfg)(params, prompts, valid, key)
  no_cache = dataclasses.replace(cfg, kv_cache=False)
  full = lockstep_decoder(graphdef, no_cache)(params, prompts, valid, key)
  np.testing.assert_array_equal(np.asarray(cached.tokens), np.asarray(full.tokens))
  np.testing.assert_array_equal(np.asarray(cached.nfe), np.asarray(full.nfe))
  np.testing.assert_allclose(np.asarray(cached.capture.topk_logprobs),
                             np.asarray(full.capture.topk_logprobs), atol=1e-4)
  # every block takes >= 1 step; commit forwards only where a later block needs the cache
  assert np.all(np.asarray(cached.nfe) >= 3)


@pytest.mark.parametrize("kind", ["block_causal", "bidirectional", "moe"])
@pytest.mark.parametrize("per_row", [False, True])
def test_keep_equals_slicing_the_whole_forward(kind, per_row):
  """hidden_states(keep=(start, n)): the last layer's queries, output projection and MLP only
  at those positions (dense), or the whole forward then a slice (an MoE last layer), equal
  the whole forward's hidden states there; a cache written alongside is unchanged."""
  from orl_jax.models.moe import MoEConfig
  from orl_jax.models.transformer import init_cache
  kw = dict(attention="bidirectional" if kind == "bidirectional" else "block_causal")
  if kind == "moe":
    kw.update(moe=MoEConfig(n_experts=4, top_k=2, expert_dim=8, n_group=2, topk_group=1,
                            n_shared=1, impl="dense"), first_k_dense=1)
  model = tiny_model(2, **kw)
  tokens, pos, meta, res = _inputs(b=3, t=12)
  start = jnp.array([0, 4, 8]) if per_row else jnp.int32(4)
  full, full_cache, _ = model.hidden_states(tokens, pos, meta, residual=res,
                                            cache=init_cache(model.cfg, 3, 12), cache_mode="write")
  kept, kept_cache, _ = model.hidden_states(tokens, pos, meta, residual=res, keep=(start, 4),
                                            cache=init_cache(model.cfg, 3, 12), cache_mode="write")
  starts = np.broadcast_to(np.asarray(start), (3,))
  want = np.stack([np.asarray(full)[r, s:s + 4] for r, s in enumerate(starts)])
  assert kept.shape == (3, 4, TINY.d_model)
  np.testing.assert_allclose(kept, want, rtol=0, atol=1e-5 * np.abs(want).max())
  for a, b in zip(jax.tree.leaves(kept_cache), jax.tree.leaves(full_cache)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(np.abs(np.asarray(b)).max(), 1))


def test_per_layer_remat_gives_the_same_values_and_gradients():
  """`model.remat` recomputes each layer in the backward pass: same loss and gradients (to
  float rounding) as keeping every activation."""
  tokens, pos, meta, res = _inputs()
  plain = tiny_model(0, residual_mode="adapter")
  remat = tiny_model(0, residual_mode="adapter", remat=True)
  _same_base(plain, remat)
  graph_p, params = nnx.split(plain, nnx.Param)
  graph_r, _ = nnx.split(remat, nnx.Param)

  def loss(graph, p):
    out = nnx.merge(graph, p)(tokens, pos, meta, residual=res)
    return jnp.mean(jax.nn.log_softmax(out.logits)[..., 3])

  (la, ga), (lb, gb) = (jax.value_and_grad(functools.partial(loss, g))(params)
                        for g in (graph_p, graph_r))
  np.testing.assert_allclose(float(la), float(lb), rtol=1e-6)
  scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(ga))
  for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5 * scale)
