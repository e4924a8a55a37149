"""LLaDA2.1 token editing (docs/models.md#llada21-token-editing, issue 13): the edit rule on
hand-built probabilities, the decoder's editing steps driven by a scripted model (which tokens
change, the post-edit step limit, TPF), default-off decoding equal to the decoder before editing
existed, rollout capture of edit steps replaying exactly, and the config checks. Rerun under other
CPU numerics (`numerics`): the edits, steps and replays; not the config validation."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import tiny as tiny_config
from orl_jax.config import build as run_config
from orl_jax.config import derive as config_lib
from orl_jax.decode import from_run
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import decode, lockstep_decoder
from orl_jax.decode.step import propose
from orl_jax.models.moe import MoEConfig
from orl_jax.models.transformer import ForwardOutput
from orl_jax.unmasking import UnmaskRule, select_edits
from tests.support.helpers import TINY, TINY_RULES, tiny_model

M, EOS, V = TINY.mask_id, 2, TINY.vocab_size


# ----------------------------------------------------------------------------- the edit rule


def _logits_for(candidates, probs):
  """[1, b, V] logits whose softmax puts `probs[i]` on `candidates[i]`, the rest uniform."""
  candidates, probs = np.asarray(candidates), np.asarray(probs, np.float64)
  p = np.tile(((1 - probs) / (V - 1))[:, None], (1, V))
  p[np.arange(len(candidates)), candidates] = probs
  return jnp.asarray(np.log(p)[None], jnp.float32)


@pytest.mark.numerics
def test_edit_rule_on_hand_built_logits():
  # positions:       0 masked, 1 same token, 2 differs & confident, 3 differs, not confident,
  #                  4 differs at exactly the threshold (strict >), 5 prompt (not editable)
  tokens = jnp.asarray([[M, 7, 8, 9, 10, 11]])
  probs = [0.99, 0.99, 0.95, 0.6, 0.75, 0.99]
  cand, conf, _ = propose(_logits_for([5, 7, 20, 21, 22, 23], probs), None, 0.0)
  np.testing.assert_array_equal(np.asarray(cand), [[5, 7, 20, 21, 22, 23]])
  np.testing.assert_allclose(np.asarray(conf), [probs], atol=1e-6)
  masked = tokens == M
  editable = jnp.asarray([[True] * 5 + [False]])
  edits = select_edits(0.75, tokens, masked, cand, jnp.asarray([probs]), editable)
  assert np.asarray(edits)[0].tolist() == [False, False, True, False, False, False]
  # threshold 0 (SGLang): every committed editable token whose candidate differs
  assert np.asarray(select_edits(0.0, tokens, masked, cand, conf, editable))[0].tolist() == [
      False, False, True, True, True, False]
  # threshold 1 (off): nothing, even at probability 1
  assert not np.asarray(select_edits(1.0, tokens, masked, cand, jnp.ones_like(conf))).any()


# ----------------------------------------------------------------------------- scripted decoder


@dataclasses.dataclass
class ScriptedModel:
  """A stand-in for the transformer whose prediction at a position depends only on the token
  there: a mask predicts FILL, a committed token t predicts `step_of(t)`, with probability
  `prob`. It keeps the KV-cache protocol (the cache passes through unchanged)."""
  prob: float
  shift: int                     # committed token t predicts t + shift (0: the block is stable)
  cfg = TINY
  FILL = 10

  @property
  def embedding_table(self):
    return jnp.zeros((V, TINY.d_model), jnp.float32)

  def hidden_states_and_routing(self, tokens, positions, meta, *, residual=None, cache=None,
                                cache_mode=None, cache_offset=0, routes=None):
    """Its "hidden states" are the logits themselves (`head` is the identity)."""
    target = jnp.where(tokens == M, self.FILL, tokens + self.shift)
    rest = jnp.log((1 - self.prob) / (V - 1))
    logits = jnp.where(jax.nn.one_hot(target, V) > 0, jnp.log(self.prob), rest)
    return logits.astype(jnp.float32), cache, jnp.zeros(()), None

  def head(self, hidden):
    return hidden

  def __call__(self, tokens, positions, meta, **kw):
    return ForwardOutput(*self.hidden_states_and_routing(tokens, positions, meta, **kw))


def _scripted(model, rule=UnmaskRule("threshold", 0.9), **edit):
  cfg = DecodeConfig(gen_length=8, block_size=4, mask_id=M, eos_id=EOS, rule=rule,
                     capture_states=32, **TINY_RULES, **edit)
  prompts, valid = jnp.full((2, 4), 5, jnp.int32), jnp.ones((2, 4), bool)
  return jax.jit(lambda p, v: decode(model, p, v, jax.random.key(0), cfg))(prompts, valid)


@pytest.mark.numerics
def test_editing_steps_stop_at_the_post_edit_limit():
  """A model that always wants to change every committed token: each block commits all masks
  in one step, then edits every token in each of its `max_post_edit_steps` extra steps."""
  out = _scripted(ScriptedModel(prob=0.99, shift=1), edit_threshold=0.5, max_post_edit_steps=3)
  f = ScriptedModel.FILL
  np.testing.assert_array_equal(np.asarray(out.tokens), [[f + 3] * 8] * 2)
  # 2 blocks x (1 unmasking + 3 editing steps) + 1 commit forward per block (paper count)
  np.testing.assert_array_equal(np.asarray(out.nfe), [10, 10])
  np.testing.assert_array_equal(np.asarray(out.nfe_engine), [9, 9])   # no commit after the last
  cap = jax.device_get(out.capture)
  np.testing.assert_array_equal(cap.n_states, [8, 8])               # every step is a state
  np.testing.assert_array_equal(cap.step[0, :8], [0, 1, 2, 3] * 2)
  # the edit steps consumed filled blocks (canvas tokens that were about to change)
  np.testing.assert_array_equal(cap.block_tokens[0, :4, 0], [M, f, f + 1, f + 2])
  assert cap.commit[0, :8].all()


@pytest.mark.numerics
def test_editing_stops_once_a_step_edits_nothing():
  stable = _scripted(ScriptedModel(prob=0.99, shift=0), edit_threshold=0.5,
                     max_post_edit_steps=16)
  np.testing.assert_array_equal(np.asarray(stable.tokens), [[ScriptedModel.FILL] * 8] * 2)
  np.testing.assert_array_equal(np.asarray(stable.nfe), [2 * 2 + 2] * 2)  # 1 check step a block
  assert not np.asarray(stable.capture.commit)[0, [1, 3]].any()          # the checks wrote none
  # candidates that differ but are not confident enough (0.8 <= 0.9) are not edits either
  unsure = _scripted(ScriptedModel(prob=0.8, shift=1), rule=UnmaskRule("threshold", 0.5),
                     edit_threshold=0.9, max_post_edit_steps=16)
  np.testing.assert_array_equal(np.asarray(unsure.tokens), [[ScriptedModel.FILL] * 8] * 2)
  np.testing.assert_array_equal(np.asarray(unsure.nfe), [6, 6])
  # editing off: one step per block, no check step
  off = _scripted(ScriptedModel(prob=0.99, shift=1))
  np.testing.assert_array_equal(np.asarray(off.nfe), [2 * 1 + 2] * 2)


@pytest.mark.numerics
def test_edits_during_unmasking_without_post_edit_steps():
  """One commit a step (fixed_steps 1): every earlier commit of the block is edited at each
  later step; with max_post_edit_steps=0 the block ends when its last mask is filled."""
  out = _scripted(ScriptedModel(prob=0.99, shift=1), rule=UnmaskRule("fixed_steps", 1),
                  edit_threshold=0.5)
  f = ScriptedModel.FILL
  np.testing.assert_array_equal(np.asarray(out.tokens)[0], [f + 3, f + 2, f + 1, f] * 2)
  np.testing.assert_array_equal(np.asarray(out.nfe), [2 * 4 + 2] * 2)


# ----------------------------------------------------------------------------- real models


# Outputs of the decoder before token editing existed (same model seeds, prompts, keys),
# recorded once; editing off must reproduce them bit for bit.
BEFORE_EDITING = {
    "dense_threshold": dict(
        tokens=[[39, 7, 7, 7, 21, 39, 21, 39, 28, 8, 21, 38],
                [28, 28, 28, 28, 28, 38, 19, 28, 34, 28, 19, 19],
                [34, 36, 15, 34, 21, 21, 19, 19, 19, 19, 21, 19]],
        nfe=[15, 15, 15], nfe_engine=[14, 14, 14], n_states=[12, 12, 12]),
    "moe_entropy_budget": dict(
        tokens=[[3, 29, 36, 9, 18, 15, 13, 4, 32, 2, 2, 2],
                [3, 29, 17, 32, 11, 16, 34, 38, 38, 15, 9, 39],
                [2] * 12],
        nfe=[15, 15, 5], nfe_engine=[14, 14, 4], n_states=[12, 12, 4]),
}


@pytest.mark.numerics
@pytest.mark.parametrize("name", sorted(BEFORE_EDITING))
def test_default_off_decoding_is_unchanged(name):
  if name.startswith("dense"):
    model, rule, temperature = tiny_model(3, residual_mode="adapter"), ("threshold", 0.3), 0.0
  else:
    moe = MoEConfig(n_experts=8, top_k=2, expert_dim=12, n_group=4, topk_group=2, n_shared=1,
                    routed_scaling_factor=2.5, impl="dense")
    model = tiny_model(5, moe=moe, first_k_dense=1)
    rule, temperature = ("entropy_budget", 0.4), 1.0
  graphdef, params = nnx.split(model)
  cfg = DecodeConfig(gen_length=12, block_size=4, mask_id=M, eos_id=EOS, rule=UnmaskRule(*rule),
                     temperature=temperature, capture_states=40,
                     **TINY_RULES)
  assert not cfg.editing and cfg.steps_bound == 4
  prompts = jax.random.randint(jax.random.key(0), (3, 8), 3, V)
  valid = jnp.arange(8)[None] >= jnp.array([0, 3, 6])[:, None]
  out = lockstep_decoder(graphdef, cfg)(params, prompts, valid, jax.random.key(4))
  want = BEFORE_EDITING[name]
  for field in ("tokens", "nfe", "nfe_engine"):
    np.testing.assert_array_equal(np.asarray(getattr(out, field)), want[field], err_msg=field)
  np.testing.assert_array_equal(np.asarray(out.capture.n_states), want["n_states"])


@pytest.mark.numerics
def test_rollout_with_editing_replays_exactly():
  """Edit steps are captured states (their canvas holds committed tokens that may still
  change) and replay like any other: f32 log-probs within 1e-4 of the largest logit, on the
  MoE model with and without route capture."""
  from tests.support.moe_replay import moe_rollout, replay_batch, replay_error
  for capture_routes in (False, True):
    graphdef, params, traj, valid, dcfg = moe_rollout("float32", capture_routes, 0.0, 2)
    assert dcfg.steps_bound == 4 + 2
    cap = jax.device_get(traj.capture)
    assert not cap.overflow.any()
    masked = cap.block_tokens == M
    filled = cap.valid & ~masked.any(-1)                    # editing steps on a filled block
    edited = cap.valid[..., None] & cap.commit & ~masked    # committed tokens rewritten
    assert filled.any() and edited.any()
    batch, plan = replay_batch(traj, valid)
    err, _ = replay_error(graphdef, params, batch, plan, with_routes=capture_routes)
    assert err <= 1e-4, err


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("overrides,field", [
    (dict(max_post_edit_steps=16), "decode.edit_threshold"),     # steps that can never edit
    (dict(edit_threshold=1.5), "decode.edit_threshold"),
    (dict(edit_threshold=0.9, max_post_edit_steps=-1), "decode.max_post_edit_steps"),
])
def test_validate_rejects_inconsistent_editing(overrides, field):
  config = tiny_config.get_config("smoke")
  config.decode.update(overrides)
  with pytest.raises(config_lib.ConfigError, match=field.replace(".", r"\.")):
    run_config.build(config)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    DecodeConfig(gen_length=8, block_size=4, mask_id=M, eos_id=EOS,
                 edit_threshold=config.decode.edit_threshold,
                 max_post_edit_steps=config.decode.max_post_edit_steps,
                 rule=UnmaskRule(), **TINY_RULES)


def test_validate_accepts_the_presets_and_rejects_routes_without_block_causal():
  for rule_value, edit_threshold, post in ((0.95, 0.9, 16), (0.5, 0.0, 16)):   # dllm, SGLang
    config = tiny_config.get_config("smoke")
    config.decode.rule_value = rule_value
    config.decode.edit_threshold, config.decode.max_post_edit_steps = edit_threshold, post
    run_config.build(config)
    dcfg = from_run.decode_config(run_config.convert(config), mask_id=M, eos_id=EOS)
    assert dcfg.editing and dcfg.steps_bound == config.decode.block_size + post
  config = tiny_config.get_config("smoke")
  config.orl.capture_routes = True
  run_config.build(config)
  config.model.attention = "bidirectional"
  with pytest.raises(config_lib.ConfigError, match=r"orl\.capture_routes"):
    run_config.build(config)
