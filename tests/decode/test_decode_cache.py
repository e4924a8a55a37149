"""Fast-dLLM's prefix and dual caches for bidirectional canvases (`decode.cache`).

The block-start forward of a cached mode is `none`'s first step of the block (same logits);
a later step equals an independent dense reference that takes the K/V of the frozen positions
from the block-start canvas and recomputes the rest; forwards are counted as in `none` (the
block-start forward is the block's first step) and rows finish independently (EOS). Rerun under
other CPU numerics (`numerics`): the decodes against the dense reference and their forward counts;
not the config validation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from orl_jax import residual as residual_lib
from orl_jax.config.build import ConfigError, build
from orl_jax.decode.canvas import Canvas
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import lockstep_decoder
from orl_jax.models.transformer import apply_rope
from orl_jax.residual import Residual
from orl_jax.unmasking import UnmaskRule
from pallas_kernels.staircase_attention import KIND_PAD, KIND_PROMPT, make_meta
from tests.support.helpers import TINY, TINY_RULES, live_adapter, tiny_model

P, B_SIZE, GEN = 8, 4, 12          # prompt, block, response: three blocks
UNUSED_EOS = TINY.vocab_size       # an EOS id outside the vocabulary: no row ever finishes


@pytest.fixture(scope="module")
def model():
  """A random bidirectional model with a live residual adapter (its zero-initialised output
  projection perturbed, so a step's z changes the logits)."""
  return live_adapter(tiny_model(3, attention="bidirectional", residual_mode="adapter"), 0.3, 4)


def _prompts(rows=3):
  tokens = jax.random.randint(jax.random.key(0), (rows, P), 3, TINY.vocab_size)
  valid = jnp.arange(P)[None] >= jnp.array([0, 2, 5][:rows])[:, None]   # left padding
  return tokens, valid


def _decode(model, cache, rule, eos_id=UNUSED_EOS):
  graphdef, state = nnx.split(model)
  cfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=TINY.mask_id, eos_id=eos_id,
                     rule=rule, cache=cache, **TINY_RULES)
  tokens, valid = _prompts()
  return jax.device_get(lockstep_decoder(graphdef, cfg)(state, tokens, valid, jax.random.key(1)))


# ------------------------------------------------------------------ one forward against a reference


def _canvas(model, cache, rows=3):
  """A `Canvas` over prompts + GEN, and a canvas whose block 0 is committed (block 1 active)."""
  cfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=TINY.mask_id, eos_id=2,
                     cache=cache,
                     rule=UnmaskRule(), **TINY_RULES)
  tokens, valid = _prompts(rows)
  width = P + GEN
  canvas_valid = jnp.concatenate([valid, jnp.ones((rows, GEN), bool)], axis=1)
  positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (rows, width))
  meta = make_meta(jnp.where(canvas_valid, KIND_PROMPT, KIND_PAD), 0, segment=0)
  cv = Canvas(model, cfg, rows, P, canvas_valid, positions, meta, model.embedding_table)
  block0 = jax.random.randint(jax.random.key(2), (rows, B_SIZE), 3, TINY.vocab_size)
  masks = jnp.full((rows, GEN - B_SIZE), TINY.mask_id, jnp.int32)
  return cv, jnp.concatenate([tokens, block0, masks], axis=1), canvas_valid


def _later_step_inputs(model, rows=3):
  """A block after some steps: half its positions committed, a random residual on the rest."""
  mcfg = model.cfg
  committed = jax.random.randint(jax.random.key(5), (rows, B_SIZE), 3, TINY.vocab_size)
  still = jnp.arange(B_SIZE)[None] % 2 == 0
  block = jnp.where(still, TINY.mask_id, committed).astype(jnp.int32)
  logits = 3.0 * jax.random.normal(jax.random.key(6), (rows, B_SIZE, mcfg.vocab_size))
  res = residual_lib.residual_from_logits(logits, model.embedding_table,
                                          embed_scale=mcfg.embed_scale, temperature=1.0,
                                          dtype=mcfg.compute_dtype)
  return block, Residual(jnp.where(still[..., None], res.z, 0), jnp.where(still, res.alpha, 0))


def _place(canvas, block, start, z=None, alpha=None):
  """The whole canvas with `block` (and its residual) at `start`; zero residual elsewhere."""
  full = canvas.at[:, start:start + block.shape[1]].set(block)
  zs = jnp.zeros(canvas.shape + (TINY.d_model,))
  alphas = jnp.zeros(canvas.shape)
  if z is not None:
    zs = zs.at[:, start:start + block.shape[1]].set(z)
    alphas = alphas.at[:, start:start + block.shape[1]].set(alpha)
  return full, Residual(zs, alphas)


def _dense_attention(q, k, v, key_valid):
  """Plain softmax attention of every query over the valid keys, GQA by repeating K/V."""
  groups = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  logits = jnp.where(key_valid[:, None, None, :], logits, -jnp.inf)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, axis=-1), v)


def _qkv(attn, h, positions):
  cfg = attn.cfg
  b, t, _ = h.shape
  q = attn.q_proj(h).reshape(b, t, cfg.n_heads, cfg.head_dim)
  k = attn.k_proj(h).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
  v = attn.v_proj(h).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
  if cfg.qk_norm:
    q, k = attn.q_norm(q), attn.k_norm(k)
  return (apply_rope(q, positions, cfg.rope_theta), apply_rope(k, positions, cfg.rope_theta), v)


def reference_logits(model, start_inputs, now_inputs, recomputed, key_valid, positions):
  """[B, T, V] logits of the canvas `now_inputs` when the K/V of every position outside
  `recomputed` [T] are those of the block-start canvas `start_inputs` (both (tokens,
  Residual)), layer by layer: what Fast-dLLM's caches compute, written without the cache."""
  x_start = model.embed_inputs(start_inputs[0], start_inputs[1])[0]
  x_now = model.embed_inputs(now_inputs[0], now_inputs[1])[0]
  for layer in model.layers:
    attn = layer.attn
    q_s, k_s, v_s = _qkv(attn, layer.input_norm(x_start), positions)
    q_n, k_n, v_n = _qkv(attn, layer.input_norm(x_now), positions)
    keep = recomputed[None, :, None, None]
    k_mix, v_mix = jnp.where(keep, k_n, k_s), jnp.where(keep, v_n, v_s)
    out_s = _dense_attention(q_s, k_s, v_s, key_valid)
    out_n = _dense_attention(q_n, k_mix, v_mix, key_valid)
    b, t = x_now.shape[:2]
    x_start = x_start + attn.o_proj(out_s.reshape(b, t, -1))
    x_now = x_now + attn.o_proj(out_n.reshape(b, t, -1))
    x_start = x_start + layer.mlp(layer.post_attn_norm(x_start))
    x_now = x_now + layer.mlp(layer.post_attn_norm(x_now))
  return model.head(model.final_norm(x_now))


def _close(actual, expected, rel=1e-4):
  scale = float(jnp.max(jnp.abs(expected)))
  err = float(jnp.max(jnp.abs(actual - expected)))
  assert err <= rel * scale, f"max |diff| {err:.3g} > {rel} x max |expected| {scale:.3g}"
  return err, scale


def _jitted(model, fn):
  """`fn(model, *args)` compiled once (the functional NNX style): eager NNX calls are slow."""
  graphdef, state = nnx.split(model)
  run = jax.jit(lambda st, *args: fn(nnx.merge(graphdef, st), *args), static_argnums=(1,))
  return lambda *args: run(state, *args)


def _block_start(model, cache):
  """(block-start logits with the cache written, `none`'s first-step logits, a plain forward's
  block logits, the stored K) of block 1."""
  cv, canvas, _ = _canvas(model, cache)
  start = P + B_SIZE
  block = jnp.full((3, B_SIZE), TINY.mask_id, jnp.int32)
  res0 = residual_lib.zero_residual(3, B_SIZE, TINY.d_model, jnp.float32)
  cached, stored = cv.canvas_logits(canvas, block, start, res0, write_cache=True)
  none = cv.step_logits(canvas, block, start, res0, None)[0]
  direct = model(_place(canvas, block, start)[0], cv.positions, cv.meta).logits
  return cached, none, direct[:, start:start + B_SIZE], stored.k


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_block_start_forward_is_nones_first_step(model, cache):
  """The block-start forward that fills the cache gives exactly the logits `none` computes for
  the block's first step (the whole canvas, the block all [MASK], zero residual)."""
  cached, none, direct, stored_k = _jitted(model, _block_start)(cache)
  np.testing.assert_array_equal(np.asarray(cached), np.asarray(none))
  _close(cached, direct, rel=1e-6)   # and it is the plain forward of the canvas
  assert stored_k.shape == (TINY.n_layers, 3, P + GEN, TINY.n_kv_heads, TINY.head_dim)


def _later_step(model, cache):
  """(cached logits, reference logits, `none` logits) of a later step of block 1."""
  cv, canvas, canvas_valid = _canvas(model, cache)
  start = P + B_SIZE
  masks = jnp.full((3, B_SIZE), TINY.mask_id, jnp.int32)
  res0 = residual_lib.zero_residual(3, B_SIZE, TINY.d_model, jnp.float32)
  _, stored = cv.canvas_logits(canvas, masks, start, res0, write_cache=True)
  block, res = _later_step_inputs(model)
  got = cv.cached_step_logits(canvas, block, start, res, stored)
  idx = jnp.arange(P + GEN)
  recomputed = ((idx >= start) & (idx < start + B_SIZE)) if cache == "dual" else idx >= start
  expected = reference_logits(model, _place(canvas, masks, start),
                              _place(canvas, block, start, res.z, res.alpha), recomputed,
                              canvas_valid, cv.positions)[:, start:start + B_SIZE]
  none = cv.step_logits(canvas, block, start, res, None)[0]
  return got, expected, none


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_later_step_matches_dense_reference(model, cache):
  """A later step of block 1: the block (dual) or the block and the rest (prefix) recomputed,
  the other positions' K/V frozen from the block-start forward, against `reference_logits`.
  The same step without the cache (`none`) differs by far more than the tolerance, so the
  comparison can tell the modes apart."""
  got, expected, none = _jitted(model, _later_step)(cache)
  err, scale = _close(got, expected)
  assert float(jnp.max(jnp.abs(none - expected))) > 100 * max(err, 1e-6 * scale)


# ------------------------------------------------------------------ whole decodes


@pytest.mark.numerics
def test_one_step_blocks_decode_exactly_like_none(model):
  """fixed_steps(b) commits a whole block per step: every step is a block-start forward, so
  the cached modes must decode exactly what `none` decodes, with the same counts."""
  rule = UnmaskRule("fixed_steps", B_SIZE)
  runs = {c: _decode(model, c, rule) for c in ("none", "prefix", "dual")}
  for cache in ("prefix", "dual"):
    for field in ("tokens", "nfe", "nfe_engine", "n_generated", "finished"):
      np.testing.assert_array_equal(getattr(runs[cache], field), getattr(runs["none"], field),
                                    err_msg=f"{cache}: {field}")
  np.testing.assert_array_equal(runs["none"].nfe, GEN // B_SIZE)


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_forwards_are_counted_as_steps(model, cache, per_step=2):
  """fixed_steps(k) takes b/k steps per block in every mode (the first being the block-start
  forward); bidirectional decoding has no commit forward, so nfe = nfe_engine = steps."""
  out = _decode(model, cache, UnmaskRule("fixed_steps", per_step))
  assert not out.finished.any()
  np.testing.assert_array_equal(out.nfe, GEN // per_step)
  np.testing.assert_array_equal(out.nfe_engine, out.nfe)
  assert (out.tokens != TINY.mask_id).all()


@pytest.mark.numerics
def test_rows_finish_independently(model, cache="dual"):
  """Making a token row 0 writes in its first block the EOS: row 0 stops after that block
  (fewer forwards, EOS-filled after its first EOS) while the other rows decode as before."""
  rule = UnmaskRule("threshold", 0.3)
  before = _decode(model, cache, rule)
  others = set(before.tokens[1:].ravel().tolist())
  candidates = [t for t in before.tokens[0, :B_SIZE].tolist() if t not in others]
  assert candidates, "no token of row 0's first block is absent from the other rows"
  eos = candidates[0]
  after = _decode(model, cache, rule, eos_id=eos)
  first = before.tokens[0].tolist().index(eos)
  assert after.finished[0] and not after.finished[1:].any()
  assert after.n_generated[0] == first + 1
  np.testing.assert_array_equal(after.tokens[0, :first + 1], before.tokens[0, :first + 1])
  assert (after.tokens[0, first + 1:] == eos).all()
  assert after.nfe[0] < before.nfe[0]
  np.testing.assert_array_equal(after.tokens[1:], before.tokens[1:])
  np.testing.assert_array_equal(after.nfe[1:], before.nfe[1:])


# ------------------------------------------------------------------ configuration


def _bidirectional_config(cache, mode="eval"):
  c = tiny.get_config("smoke")
  c.model.attention, c.decode.cache, c.train.mode = "bidirectional", cache, mode
  return c


def test_validate_accepts_caches_for_bidirectional_evaluation():
  for cache in ("none", "prefix", "dual"):
    build(_bidirectional_config(cache))


@pytest.mark.parametrize("change, field", [
    (dict(attention="block_causal"), "model.attention='block_causal'"),
    (dict(mode="orl"), "train.mode='orl'"),
    (dict(cache="full"), "must be one of"),
])
def test_validate_rejects_cache_misuse(change, field):
  c = _bidirectional_config(change.get("cache", "dual"), change.get("mode", "eval"))
  c.model.attention = change.get("attention", "bidirectional")
  with pytest.raises(ConfigError, match="decode.cache") as e:
    build(c)
  assert field in str(e.value)


def test_decoder_rejects_cache_with_capture_or_block_causal_model():
  with pytest.raises(ValueError, match="decode.cache='dual' is approximate"):
    DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=1, eos_id=2, cache="dual",
                 capture_states=8,
                 rule=UnmaskRule(), **TINY_RULES)
  graphdef, state = nnx.split(tiny_model(0))
  cfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=1, eos_id=2, cache="prefix",
                     rule=UnmaskRule(), **TINY_RULES)
  tokens, valid = _prompts()
  with pytest.raises(ValueError, match="model.attention='block_causal'"):
    lockstep_decoder(graphdef, cfg)(state, tokens, valid, jax.random.key(0))
