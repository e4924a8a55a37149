"""Large-vocabulary losses in chunks of tokens give the same values and gradients."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode.capture import masked_positions
from orl_jax.data.pipeline import SftExample
from orl_jax.decode.config import DecodeConfig
from orl_jax.config.sections import Loss
from orl_jax.losses import LossConfig, orl_loss
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.decode.trajectories import make_trajectories
from orl_jax.losses import sft_loss
from orl_jax.unmasking import UnmaskRule
from orl_jax.vocab_chunks import token_stats
from tests.support.helpers import TINY, TINY_RULES, tiny_model


def _close_trees(a, b, rtol):
  """Leaf by leaf, equal up to rounding relative to the leaf's largest magnitude (the chunked
  and whole computations sum in different orders)."""
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    scale = max(np.abs(x).max(initial=0), np.abs(y).max(initial=0), 1e-30)
    np.testing.assert_allclose(x, y, atol=rtol * scale, rtol=0,
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("tied", [False, True])
def test_token_stats_chunked_equals_whole(tied):
  model = tiny_model(1, tie_embeddings=tied, vocab_size=300)
  h = jax.random.normal(jax.random.key(0), (3, 7, TINY.d_model))
  tgt = jax.random.randint(jax.random.key(1), (3, 7), 0, 300)
  ids = jax.random.randint(jax.random.key(2), (3, 7, 5), 0, 300)
  whole = token_stats(model.head, h, tgt, ids, chunk=0)
  for chunk in (4, 8, 21):   # 21 = exactly the tokens, 4 and 8 need padding
    part = token_stats(model.head, h, tgt, ids, chunk=chunk)
    _close_trees(part, whole, 1e-5)


@pytest.fixture(scope="module")
def replay_batch():
  model = tiny_model(7, residual_mode="adapter")
  st = nnx.state(model, nnx.Param)
  k = st["adapter"]["down_proj"]["kernel"]
  k[...] = 0.1 * jax.random.normal(jax.random.key(3), k[...].shape)
  nnx.update(model, st)
  graphdef, params = nnx.split(model)
  cfg = DecodeConfig(gen_length=8, block_size=4, mask_id=TINY.mask_id, eos_id=2,
                     rule=UnmaskRule("threshold", 0.2), temperature=1.0, capture_states=8,
                     **TINY_RULES)
  prompts = jax.random.randint(jax.random.key(0), (2, 8), 3, TINY.vocab_size)
  valid = jnp.arange(8)[None] >= jnp.array([1, 4])[:, None]
  traj = make_trajectories(graphdef, cfg, 2)(params, prompts, valid, jax.random.key(5), 0)
  # a frozen reference the policy has moved away from, so the anchor is a live term
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(11), len(leaves))
  reference = jax.tree.unflatten(treedef, [x + 0.05 * jnp.std(x) * jax.random.normal(k, x.shape)
                                           for x, k in zip(leaves, keys)])
  cap = jax.device_get(traj.capture)
  plan, _ = build_plan(prompt_valid=np.asarray(valid), capture_valid=cap.valid,
                       capture_block=cap.block, eligible=np.ones(4, bool), group_size=2,
                       cfg=ReplayConfig(row_len=64, n_rows=6, max_states=32, max_responses=4,
                                        block_size=4, states_per_response=0,
                                        layout="packed", micro_batches=1),
                       rng=np.random.default_rng(0))
  return (graphdef, params, reference,
          gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions))


@pytest.mark.parametrize("kl_reference", ["initial", "rollout"])
def test_orl_loss_chunked_equals_unchunked_values_and_grads(replay_batch, kl_reference):
  graphdef, params, reference, batch = replay_batch
  base = LossConfig.from_section(Loss(gate_entropy=0.0, conf_entropy=0.99,
                                     kl_reference=kl_reference))

  def run(chunk):
    cfg = dataclasses.replace(base, vocab_chunk=chunk)
    f = lambda p: orl_loss(nnx.merge(graphdef, p), batch, cfg,
                           reference=nnx.merge(graphdef, reference))
    return jax.jit(jax.value_and_grad(f, has_aux=True))(params)

  (loss0, m0), g0 = run(0)
  if kl_reference == "initial":   # a live anchor (vs "rollout": zero up to rounding)
    assert float(m0["loss_rkl"]) > 1e-4
  for chunk in (16, 50):
    (loss, m), g = run(chunk)
    np.testing.assert_allclose(float(loss), float(loss0), rtol=1e-5)
    for key in ("loss_ce", "loss_aec", "loss_rkl", "replay_entropy", "replay_token_acc"):
      # each term to rounding of the loss's magnitude (a term can be ~0 in exact arithmetic)
      np.testing.assert_allclose(float(m[key]), float(m0[key]), rtol=1e-5,
                                 atol=1e-6 * max(abs(float(loss0)), 1.0), err_msg=key)
    _close_trees(g, g0, 1e-4)


def test_sft_loss_chunked_equals_unchunked_values_and_grads():
  model = tiny_model(3, vocab_size=200)
  graphdef, params = nnx.split(model, nnx.Param)
  rng = np.random.default_rng(0)
  batch = SftExample(prompt_tokens=jnp.asarray(rng.integers(3, 200, (2, 8)), jnp.int32),
                     prompt_valid=jnp.ones((2, 8), bool),
                     response=jnp.asarray(rng.integers(3, 200, (2, 8)), jnp.int32))

  def run(chunk):
    f = lambda p: sft_loss(nnx.merge(graphdef, p), batch, jax.random.key(0), block_size=4,
                           mask_id=TINY.mask_id, vocab_chunk=chunk)
    return jax.jit(jax.value_and_grad(f, has_aux=True))(params)

  (loss0, m0), g0 = run(0)
  (loss, m), g = run(10)
  np.testing.assert_allclose(float(loss), float(loss0), rtol=1e-5)
  np.testing.assert_allclose(float(m["masked_acc"]), float(m0["masked_acc"]))
  _close_trees(g, g0, 1e-4)
