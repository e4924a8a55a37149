import jax.numpy as jnp
import numpy as np
import pytest

from orl_jax.unmasking import UnmaskRule, select_commits

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
