"""The unmasking rules. Rerun under other CPU numerics (`numerics`): the entropy budget's sums
against gamma, the proposal's argmax against numpy's and the per-row rules against the batch
rules (two programs); not the rules on literal scores and the parsing."""
import re

import jax.numpy as jnp
import numpy as np
import pytest

from orl_jax.unmasking import RULES, UnmaskRule, select_commits, select_commits_per_row

MASKED = jnp.array([[True, True, True, False, True]])
CONF = jnp.array([[0.95, 0.5, 0.92, 0.99, 0.3]])
ENT = jnp.array([[0.10, 0.30, 0.05, 0.0, 0.40]])


def _commit(rule):
  return np.asarray(select_commits(rule, MASKED, CONF, ENT))[0].tolist()


def test_threshold_commits_all_confident_masked_positions():
  assert _commit(UnmaskRule("threshold", 0.9)) == [True, False, True, False, False]


def test_threshold_commits_at_least_the_most_confident():
  assert _commit(UnmaskRule("threshold", 0.999)) == [True, False, False, False, False]


def test_fixed_steps_commits_top_k():
  assert _commit(UnmaskRule("fixed_steps", 2)) == [True, False, True, False, False]
  assert _commit(UnmaskRule("fixed_steps", 9)) == [True, True, True, False, True]


@pytest.mark.numerics
@pytest.mark.parametrize("gamma,expected", [
    # sorted entropies of masked positions: 0.05 (2), 0.10 (0), 0.30 (1), 0.40 (4)
    # cumsum - current: 0, 0.05, 0.15, 0.45
    (0.0, [False, False, True, False, False]),
    (0.06, [True, False, True, False, False]),
    (0.2, [True, True, True, False, False]),
    (1.0, [True, True, True, False, True]),
])
def test_entropy_budget_prefix(gamma, expected):
  assert _commit(UnmaskRule("entropy_budget", gamma)) == expected


def test_rows_without_masks_commit_nothing():
  masked = jnp.zeros((1, 5), bool)
  for rule in (UnmaskRule("threshold", 0.5), UnmaskRule("fixed_steps", 2),
               UnmaskRule("entropy_budget", 1.0)):
    assert not np.asarray(select_commits(rule, masked, CONF, ENT)).any()


def test_labels_round_trip_and_errors():
  for label in ("threshold_0.9", "entropy_budget_0.5", "fixed_steps_1"):
    assert UnmaskRule.parse(label).label == label
  with pytest.raises(ValueError, match="cannot parse"):
    UnmaskRule.parse("topk_3")
  with pytest.raises(ValueError, match="decode.rule"):
    UnmaskRule("greedy", 1)


def _propose_reference(logits, temperature):
  """float64 numpy: softmax of logits / T, its entropy / log V."""
  x = np.asarray(logits, np.float64) / (temperature or 1.0)
  p = np.exp(x - x.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1) / np.log(x.shape[-1])
  return p, h


@pytest.mark.numerics
@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_propose_matches_a_float64_softmax(temperature):
  """The fused two-pass proposal: greedy picks the argmax; the candidate's probability and the
  normalized entropy equal a float64 softmax's (peaked, flat and one-hot-like rows)."""
  import jax
  from orl_jax.decode.step import propose
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 97)) * np.array([0.1, 3.0, 40.0])[:, None, None]
  cand, conf, ent = propose(jnp.asarray(logits, jnp.float32), jax.random.key(1), temperature)
  p, h = _propose_reference(logits, temperature)
  cand = np.asarray(cand)
  if temperature == 0:
    np.testing.assert_array_equal(cand, logits.argmax(-1))
  np.testing.assert_allclose(conf, np.take_along_axis(p, cand[..., None], -1)[..., 0],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ent, h, rtol=1e-4, atol=1e-6)   # h in [0, 1]


@pytest.mark.numerics
@pytest.mark.parametrize("compare", [">=", ">"])
def test_each_rows_own_rule_commits_what_that_rule_commits(compare):
  """`select_commits_per_row` (the serving engine: every request its own rule) equals
  `select_commits` row by row, for every rule, including ties at the threshold."""
  rng = np.random.default_rng(0)
  rules = [UnmaskRule("threshold", 0.5), UnmaskRule("threshold", 0.25), UnmaskRule(
      "entropy_budget", 0.3), UnmaskRule("entropy_budget", 0.0), UnmaskRule("fixed_steps", 2),
           UnmaskRule("fixed_steps", 9)]
  b_rows, b = len(rules), 8
  masked = jnp.asarray(rng.random((b_rows, b)) < 0.7).at[0].set(True)
  confidence = jnp.asarray(rng.choice([0.1, 0.25, 0.5, 0.9], (b_rows, b)), jnp.float32)
  entropy = jnp.asarray(rng.random((b_rows, b)), jnp.float32)
  index = jnp.asarray([RULES.index(r.name) for r in rules], jnp.int32)
  value = jnp.asarray([r.value for r in rules], jnp.float32)
  per_row = select_commits_per_row(index, value, masked, confidence, entropy, compare)
  for i, rule in enumerate(rules):
    alone = select_commits(rule, masked[i:i + 1], confidence[i:i + 1], entropy[i:i + 1],
                           compare)
    np.testing.assert_array_equal(per_row[i], alone[0], err_msg=rule.label)


@pytest.mark.parametrize("label,words", [
    ("threshold_0", "tau in (0, 1]"), ("threshold_1.5", "tau in (0, 1]"),
    ("threshold_nan", "tau in (0, 1]"), ("entropy_budget_inf", "finite gamma >= 0"),
    ("entropy_budget_-0.1", "finite gamma >= 0"), ("fixed_steps_0", "whole number k >= 1"),
    ("fixed_steps_2.5", "whole number k >= 1"), ("fixed_steps_1e400", "whole number k >= 1"),
    ("fixed_steps_33", "up to the block size of 32"), ("threshold_1_0", "is not a number"),
    ("threshold_0x1", "is not a number"), ("greedy_1", "cannot parse")])
def test_a_setting_outside_its_rules_range_is_refused_with_one_sentence(label, words):
  with pytest.raises(ValueError, match=re.escape(words)):
    UnmaskRule.parse(label, block_size=32)


def test_settings_at_the_ends_of_their_ranges_parse():
  assert UnmaskRule.parse("threshold_1", 32) == UnmaskRule("threshold", 1.0)
  assert UnmaskRule.parse("entropy_budget_0", 32) == UnmaskRule("entropy_budget", 0.0)
  assert UnmaskRule.parse("fixed_steps_32", 32) == UnmaskRule("fixed_steps", 32.0)
  assert UnmaskRule.parse("fixed_steps_33") == UnmaskRule("fixed_steps", 33.0)   # no block


def test_eval_settings_are_held_to_the_same_ranges():
  from configs import tiny
  from orl_jax.config import build as run_config
  from orl_jax.config.derive import validate
  from orl_jax.config.sections import ConfigError
  config = tiny.get_config("smoke").to_dict()
  config["eval"]["settings"] = ("threshold_0.9", "threshold_1.5")
  with pytest.raises(ConfigError, match=r"eval\.settings: .*'threshold_1\.5'.*tau in \(0, 1\]"):
    validate(run_config.convert(config))



@pytest.mark.parametrize("rule,value,words", [
    ("threshold", 1.5, "threshold takes tau in (0, 1], got 1.5"),
    ("entropy_budget", -0.5, "entropy_budget takes a finite gamma >= 0, got -0.5"),
    ("fixed_steps", 2.5, "fixed_steps takes a whole number k >= 1 up to the block size of 8, "
                         "got 2.5"),
    ("fixed_steps", 9, "fixed_steps takes a whole number k >= 1 up to the block size of 8, "
                       "got 9.0"),
])
def test_the_configs_own_rule_value_is_held_to_the_same_ranges(rule, value, words):
  """decode.rule_value goes through the parser of a request's decoder (one sentence naming
  the fields); the ends of each range pass."""
  from configs import tiny
  from orl_jax.config import build as run_config
  from orl_jax.config.derive import validate
  from orl_jax.config.sections import ConfigError
  config = tiny.get_config("smoke").to_dict()
  assert config["decode"]["block_size"] == 8
  config["decode"]["rule"], config["decode"]["rule_value"] = rule, value
  with pytest.raises(ConfigError) as e:
    validate(run_config.convert(config))
  assert str(e.value) == (f"invalid config: decode.rule_value={value} for decode.rule={rule!r}: "
                          f"{words}")
  config["decode"]["rule_value"] = {"threshold": 1.0, "entropy_budget": 0.0,
                                    "fixed_steps": 8}[rule]      # the ends of the ranges
  validate(run_config.convert(config))
