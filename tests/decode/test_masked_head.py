"""The vocabulary head at the masked positions only (`DecodeConfig.masked_head`).

A step gathers each row's masked positions into the smallest of b, b/2, ..., 1 slots, runs the
head and the proposal there and scatters the results back. It must propose what the whole-block
head proposes at every masked position (greedy and sampled: the same Gumbel noise), and whole
decodes must not change. Rerun under other CPU numerics (`numerics`): all but the head widths
(integers)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode import compile_options, lockstep
from orl_jax.decode.canvas import Canvas
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.step import head_widths, propose_masked, propose_step
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import TINY, TINY_RULES, live_adapter, tiny_model

P, B_SIZE, GEN = 8, 8, 16


def test_head_widths():
  assert head_widths(8) == (8, 4, 2, 1)
  assert head_widths(6) == (6, 3, 2, 1)
  assert head_widths(1) == (1,)


@pytest.mark.numerics
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("counts", [(8, 5, 1, 0), (3, 1, 0, 2), (1, 0, 1, 0), (0, 0, 0, 0)])
def test_masked_proposal_equals_the_whole_block_head(counts, temperature):
  """Rows with these many masked positions (scattered over the block): candidate, probability,
  entropy and the next residual at every masked position equal the whole-block head's."""
  model = live_adapter(tiny_model(1, residual_mode="adapter"), 0.3, 4)
  rows = len(counts)
  rng = np.random.default_rng(sum(counts))
  masked = np.zeros((rows, B_SIZE), bool)
  for r, n in enumerate(counts):
    masked[r, rng.choice(B_SIZE, n, replace=False)] = True
  masked = jnp.asarray(masked)
  hidden = jax.random.normal(jax.random.key(2), (rows, B_SIZE, TINY.d_model)) * 3.0
  base = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=TINY.mask_id, eos_id=2,
                      temperature=temperature,
                      rule=UnmaskRule(), **TINY_RULES)
  cv = lambda cfg: Canvas(model, cfg, rows, P, None, None, None, model.embedding_table)
  key = jax.random.key(7)
  got = propose_masked(cv(base), hidden, masked, key)
  full = propose_step(cv(dataclasses.replace(base, masked_head=False)), hidden,
                       masked, key)
  m = np.asarray(masked)
  np.testing.assert_array_equal(np.asarray(got.cand)[m], np.asarray(full.cand)[m])
  pairs = ((got.conf, full.conf), (got.entropy, full.entropy), (got.soft.alpha, full.soft.alpha))
  for a, b in pairs:
    np.testing.assert_allclose(np.asarray(a)[m], np.asarray(b)[m], rtol=1e-5, atol=1e-6)
  z, zf = np.asarray(got.soft.z)[m], np.asarray(full.soft.z)[m]
  np.testing.assert_allclose(z, zf, rtol=0, atol=1e-5 * max(np.abs(zf).max(initial=0), 1e-6))


def _decode(model, masked_head, temperature, cache="none"):
  graphdef, state = nnx.split(model)
  cfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=TINY.mask_id, eos_id=2,
                     rule=UnmaskRule("threshold", 0.3), temperature=temperature, cache=cache,
                     masked_head=masked_head, **TINY_RULES)
  tokens = jax.random.randint(jax.random.key(0), (3, P), 3, TINY.vocab_size)
  valid = jnp.arange(P)[None] >= jnp.array([0, 2, 5])[:, None]
  run = lockstep.lockstep_decoder(graphdef, cfg)
  return jax.device_get(run(state, tokens, valid, jax.random.key(1)))


_SLOW = pytest.mark.slow   # ~17 s each: the default run keeps one greedy and one sampled case


@pytest.mark.numerics
@pytest.mark.parametrize("attention,cache,temperature", [
    ("bidirectional", "dual", 0.0), ("block_causal", "none", 1.0),
    pytest.param("block_causal", "none", 0.0, marks=_SLOW),
    pytest.param("bidirectional", "none", 0.0, marks=_SLOW),
    pytest.param("bidirectional", "none", 1.0, marks=_SLOW),
    pytest.param("bidirectional", "dual", 1.0, marks=_SLOW)])
def test_decodes_do_not_change(attention, cache, temperature):
  model = live_adapter(tiny_model(3, attention=attention, residual_mode="adapter"), 0.3, 4)
  on, off = (_decode(model, flag, temperature, cache) for flag in (True, False))
  np.testing.assert_array_equal(on.tokens, off.tokens)
  np.testing.assert_array_equal(on.nfe, off.nfe)
  assert on.tokens.shape == (3, GEN)


@pytest.mark.numerics
def test_the_decoder_switches_between_head_widths():
  """The compiled step holds one head per width (so narrower heads really run), and none when
  every position's logits are read (capture)."""
  model = tiny_model(3)
  graphdef, state = nnx.split(model)
  tokens = jnp.zeros((2, P), jnp.int32)
  valid = jnp.ones((2, P), bool)

  def head_shapes(**kw):
    cfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=TINY.mask_id, eos_id=2,
                       rule=UnmaskRule(), **TINY_RULES, **kw)
    text = str(jax.make_jaxpr(lockstep.lockstep_decoder(graphdef, cfg))(
        state, tokens, valid, jax.random.key(0)))
    return {w for w in head_widths(B_SIZE) if f"f32[2,{w},{TINY.vocab_size}]" in text}

  assert head_shapes() == set(head_widths(B_SIZE))
  assert head_shapes(capture_states=8) == {B_SIZE}


@pytest.mark.numerics
def test_small_decode_steps_compile_without_ynnpack_fusions_on_cpu():
  """`lockstep_decoder` compiles a batch whose steps forward <= SMALL_STEP_TOKENS tokens with
  XLA:CPU's YNNPACK fusions off, a larger one with XLA's defaults; both decode alike."""
  if jax.default_backend() != "cpu":
    pytest.skip("a CPU compiler option")
  assert not compile_options.cpu_accepts("xla_cpu_no_such_option_for_this_test")
  assert compile_options.step_compiler_options(compile_options.SMALL_STEP_TOKENS) is not None
  assert compile_options.step_compiler_options(compile_options.SMALL_STEP_TOKENS + 1) is None
  model = tiny_model(3)
  graphdef, state = nnx.split(model)
  cfg = DecodeConfig(gen_length=GEN, block_size=B_SIZE, mask_id=TINY.mask_id, eos_id=2,
                     rule=UnmaskRule(), **TINY_RULES)
  run = lockstep.lockstep_decoder(graphdef, cfg)
  rows = compile_options.SMALL_STEP_TOKENS // B_SIZE + 1            # just above the threshold
  tokens = jax.random.randint(jax.random.key(0), (rows, P), 3, TINY.vocab_size)
  valid = jnp.ones((rows, P), bool)
  big = run(state, tokens, valid, jax.random.key(1))
  small = run(state, tokens[:2], valid[:2], jax.random.key(1))
  assert run.jitted(2) is not run.jitted(rows)
  np.testing.assert_array_equal(small.tokens, big.tokens[:2])
