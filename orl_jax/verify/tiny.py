"""Exact-answer verifier of the tiny task (DESIGN §2.4, §5): the strict rule of `math_answer`.

Decoded tiny-task text joins digit tokens into whole numbers (`WordTokenizer.decode`: `2 7` ->
`27`), so `#### 2 7` would read as two numbers and is wrong, as is anything after the answer
that holds another number.
"""
from __future__ import annotations

from typing import Sequence

from orl_jax.problem import Problem
from orl_jax.verify import math_answer


def extract_answer(response: str) -> str | None:
  """The strict final answer of `response` in canonical form (e.g. "27"), or None."""
  value = math_answer.final_answer(response)
  return None if value is None else math_answer.canonical_number(value)


class TinyVerifier:
  """Scores 1.0 iff the strict final answer equals `problem.answer`."""

  def score(self, problem: Problem, response: str) -> float:
    if problem.answer is None:
      raise ValueError(f"Problem {problem.problem_id} has no gold answer; TinyVerifier needs one.")
    predicted = math_answer.final_answer(response)
    return float(predicted is not None and predicted == math_answer.gold_number(problem.answer))

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    if len(problems) != len(responses):
      raise ValueError(f"TinyVerifier.score_batch got {len(problems)} problems but "
                       f"{len(responses)} responses.")
    return [self.score(p, r) for p, r in zip(problems, responses)]
