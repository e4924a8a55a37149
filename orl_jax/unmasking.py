"""Unmasking rules (step 3 of docs/decoding.md#one-denoising-step): which masked positions a
denoising step commits.

Shared by evaluation decoding and rollouts. All functions are pure and batched over rows.
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Literal

import jax.numpy as jnp

RuleName = Literal["threshold", "entropy_budget", "fixed_steps"]
RULES: tuple[str, ...] = typing.get_args(RuleName)
# How the threshold rule compares a candidate's probability with tau: ">=" (Fast-dLLM, LLaDA-8B;
# our tiny model) or ">" (LLaDA2.x, SDAR: `confidence > threshold` in their `generate`).
COMMIT_COMPARES = (">=", ">")


@dataclasses.dataclass(frozen=True)
class UnmaskRule:
  name: str = "threshold"   # threshold | entropy_budget | fixed_steps
  value: float = 0.9        # tau, gamma, or k

  def __post_init__(self):
    if self.name not in RULES:
      raise ValueError(f"decode.rule must be one of {RULES}, got {self.name!r}")

  @property
  def label(self) -> str:
    """Results key, e.g. 'threshold_0.9', 'entropy_budget_0.5', 'fixed_steps_1'."""
    v = int(self.value) if self.name == "fixed_steps" else self.value
    return f"{self.name}_{v}"

  @classmethod
  def parse(cls, label: str, block_size: int | None = None) -> "UnmaskRule":
    """The rule a label names, its value in the rule's range (`check_range`); ValueError with
    one sentence otherwise. `block_size`: fixed_steps' k at most this (None: unchecked)."""
    for name in RULES:
      if isinstance(label, str) and label.startswith(name + "_"):
        text = label[len(name) + 1:]
        if not _NUMBER.fullmatch(text):
          raise ValueError(f"decoder setting {label!r}: {text!r} is not a number")
        rule = cls(name, float(text))
        rule.check_range(block_size, label)
        return rule
    raise ValueError(f"cannot parse decoder setting {label!r}; expected e.g. 'threshold_0.9', "
                     f"'entropy_budget_0.5' or 'fixed_steps_1'")

  def check_range(self, block_size: int | None = None, label: str = "") -> None:
    """ValueError unless the value means something for the rule: tau in (0, 1], gamma >= 0 and
    finite, k a whole number >= 1 (and <= `block_size` when given)."""
    v, where = self.value, f"decoder setting {label or self.name!r}"
    if self.name == "threshold" and not 0 < v <= 1:
      raise ValueError(f"{where}: threshold takes tau in (0, 1], got {v}")
    if self.name == "entropy_budget" and not 0 <= v < math.inf:
      raise ValueError(f"{where}: entropy_budget takes a finite gamma >= 0, got {v}")
    if self.name == "fixed_steps":
      top = block_size if block_size is not None else math.inf
      if not (math.isfinite(v) and v == int(v) and 1 <= v <= top):
        limit = f" up to the block size of {block_size}" if block_size is not None else ""
        raise ValueError(f"{where}: fixed_steps takes a whole number k >= 1{limit}, got {v}")


# a decimal number as the labels write it (no '_' digit groups, no spaces, no hex); 'inf' and
# 'nan' pass here and are refused by the range checks with a sentence naming the rule
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|infinity|nan)",
                     re.IGNORECASE)


def _ranked(masked, score):
  """(rank [B, b] of each position by `score`, best first, masked positions only; the order
  [B, b] of positions, best first)."""
  score = jnp.where(masked, score, -jnp.inf)
  order = jnp.argsort(-score, axis=-1, stable=True)          # best first
  return jnp.argsort(order, axis=-1, stable=True), order     # rank of each position


def _threshold_take(masked, confidence, tau, compare: str):
  """[B] how many masked positions clear tau (`compare`)."""
  above = confidence > tau if compare == ">" else confidence >= tau
  return jnp.sum(masked & above, axis=-1)


def _budget_take(masked, entropy, order, gamma):
  """[B] the longest ascending-entropy prefix with cumsum(H) - max(H) <= gamma."""
  n_masked = jnp.sum(masked, axis=-1)
  h_sorted = jnp.take_along_axis(jnp.where(masked, entropy, jnp.inf), order, axis=-1)
  h_sorted = jnp.where(jnp.isfinite(h_sorted), h_sorted, 0.0)
  in_prefix = (jnp.cumsum(h_sorted, axis=-1) - h_sorted) <= gamma
  valid = jnp.arange(masked.shape[-1])[None, :] < n_masked[:, None]
  return jnp.sum(jnp.cumprod(in_prefix & valid, axis=-1), axis=-1)


def _commit_top(masked, rank, n_take):
  """The `n_take` [B] best masked positions, at least one where any is masked."""
  n_masked = jnp.sum(masked, axis=-1)
  n_take = jnp.clip(n_take, jnp.minimum(1, n_masked), n_masked)
  return masked & (rank < n_take[:, None])


def _check_compare(compare: str) -> None:
  if compare not in COMMIT_COMPARES:
    raise ValueError(f"decode.commit_compare={compare!r} must be one of {COMMIT_COMPARES}")


def select_commits(rule: UnmaskRule, masked, confidence, entropy, compare: str = ">="):
  """Boolean [B, b]: positions to commit this step.

  masked: [B, b] bool, still-masked positions; confidence: [B, b] probability of each position's
  candidate token; entropy: [B, b] normalized entropy of each position's distribution;
  compare: the threshold rule's comparison (`COMMIT_COMPARES`).
  Every row with at least one masked position commits at least one (the most confident, or
  for entropy_budget the lowest-entropy one).
  """
  _check_compare(compare)
  score = -entropy if rule.name == "entropy_budget" else confidence
  rank, order = _ranked(masked, score)
  if rule.name == "threshold":
    n_take = _threshold_take(masked, confidence, rule.value, compare)
  elif rule.name == "fixed_steps":
    n_take = jnp.minimum(jnp.int32(rule.value), jnp.sum(masked, axis=-1))
  else:  # entropy_budget: longest ascending-entropy prefix with cumsum(H) - max(H) <= gamma
    n_take = _budget_take(masked, entropy, order, rule.value)
  return _commit_top(masked, rank, n_take)


def select_commits_per_row(rule_index, value, masked, confidence, entropy,
                           compare: str = ">="):
  """`select_commits` with each row's own rule: `rule_index` [B] int32 (an index of RULES)
  and `value` [B] f32 (its tau, gamma or k). Row r commits what `select_commits` with
  UnmaskRule(RULES[rule_index[r]], value[r]) commits (the same operations, chosen per row)."""
  _check_compare(compare)
  budget = rule_index == RULES.index("entropy_budget")
  score = jnp.where(budget[:, None], -entropy, confidence)
  rank, order = _ranked(masked, score)
  n_take = jnp.select(
      [rule_index == RULES.index("threshold"), rule_index == RULES.index("fixed_steps")],
      [_threshold_take(masked, confidence, value[:, None], compare),
       jnp.minimum(value.astype(jnp.int32), jnp.sum(masked, axis=-1))],
      _budget_take(masked, entropy, order, value[:, None]))
  return _commit_top(masked, rank, n_take)


def select_edits(edit_threshold: float, tokens, masked, candidate, confidence, editable=None):
  """Boolean [B, b]: committed positions a step rewrites (LLaDA2.1 token-to-token editing,
  docs/models.md#llada21-token-editing): not masked, the step's candidate differs from the token
  there, and the candidate's probability is strictly above `edit_threshold` (the official `>`).

  tokens: [B, b] the block before the step; masked: [B, b] bool (masked positions are the
  unmasking rule's, never edited); candidate / confidence: [B, b] the step's proposal and its
  probability; editable: [B, b] bool positions that may change at all (False for prompt
  tokens), None = every committed position. An edit threshold of 1.0 never edits.
  """
  edit = ~masked & (candidate != tokens) & (confidence > edit_threshold)
  return edit if editable is None else edit & editable
