"""The decoder's FLOP count (benchmarks/_roofline.py), which `make bench` divides by the measured
matmul peak: a hand-computed forward, the masked head's positions, and one denoising step of a
block-causal (KV cache) and a bidirectional (dual cache) decode against XLA's cost analysis of
the compiled step."""
import dataclasses

import jax
import pytest
from flax import nnx

from benchmarks import _roofline
from orl_jax.decode import lockstep
from orl_jax.decode.config import DecodeConfig
from orl_jax.models.transformer import ModelConfig, Transformer
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import TINY_RULES

# wide enough that matmuls dominate XLA's count (it also counts elementwise work)
MODEL = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                    mlp_dim=192, mask_id=1, qk_norm=True)
PROMPT, GEN, BLOCK, ROWS = 16, 16, 8, 4


def test_forward_flops_by_hand():
  """d 4, one layer, one head of 4, MLP 8, vocabulary 10: 2 tokens against 3 keys, head at 1."""
  m = ModelConfig(vocab_size=10, d_model=4, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=4,
                  mlp_dim=8, mask_id=1, qk_norm=False)
  projections = 2 * 2 * (4 * 4 * 4 + 3 * 4 * 8)         # q, k, v, o and the SwiGLU MLP
  attention = 2 * 2 * 2 * 3 * 4                          # scores and values, 2 x 3 pairs of 4
  head = 2 * 1 * 4 * 10
  assert _roofline.forward_flops(m, 2, 3, 1) == projections + attention + head
  # the last (only) layer's queries, output and MLP at one token; keys and values at both
  kept = 2 * 2 * (2 * 4 * 4) + 2 * 1 * (2 * 4 * 4 + 3 * 4 * 8) + 2 * 2 * 1 * 3 * 4 + head
  assert _roofline.forward_flops(m, 2, 3, 1, n_last=1) == kept


def test_masked_positions_of_one_token_a_step():
  """A block of 8 decoded one token a step: 8 + 7 + ... + 1 masked positions reach the head."""
  assert _roofline.masked_positions(8, steps=8, blocks=1) == 36
  assert _roofline.masked_positions(8, steps=1, blocks=1) == 8     # all in one step


@pytest.mark.parametrize("attention,cache", [("block_causal", "none"), ("bidirectional", "dual")])
def test_a_step_counts_what_xla_counts(attention, cache):
  """One compiled denoising step (`lockstep.denoising_step`, the head's `switch` counted by XLA
  at its widest branch, the whole block): XLA's FLOPs are the count's within 10% (XLA adds the
  elementwise work: norms, softmax, RoPE)."""
  m = dataclasses.replace(MODEL, attention=attention)
  graphdef, params = nnx.split(Transformer(m, rngs=nnx.Rngs(0)))
  cfg = DecodeConfig(gen_length=GEN, block_size=BLOCK, mask_id=1, eos_id=2, cache=cache,
                     rule=UnmaskRule("threshold", 0.9), **TINY_RULES)
  ids = jax.random.randint(jax.random.key(0), (ROWS, PROMPT), 3, m.vocab_size)
  valid = ids > 0

  def step(state, ids, valid):
    model = nnx.merge(graphdef, state)
    kv, carry = lockstep.denoising_step_inputs(model, ids, valid, cfg)
    return lockstep.denoising_step(model, ids, valid, jax.random.key(0), cfg, kv, carry)

  xla = _roofline.xla_flops(jax.jit(step).lower(params, ids, valid).compile())
  width = PROMPT + GEN
  n_keys = width + BLOCK if cache == "dual" else width
  counted = ROWS * _roofline.forward_flops(m, BLOCK, n_keys, BLOCK)
  assert 1.0 <= xla / counted < 1.1, (xla, counted)
