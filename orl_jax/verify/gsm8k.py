"""GSM8K-style answer verification: the strict final-answer rule of `math_answer` (DESIGN §2.4).

A response scores 1 only when the number in its final-answer span (after the last `####`, or in
the last `\\boxed{}`) is the gold number; hedges, several numbers and missing markers score 0.
The response is first cut at `\\nQuestion:`, where a base model prompted with few-shot examples
starts inventing the next problem (lm-evaluation-harness stops GSM8K generation there too).
"""
from __future__ import annotations

from typing import Sequence

from orl_jax.problem import Problem, truncate_completion
from orl_jax.verify import math_answer

STOP_SEQUENCES = ("\nQuestion:",)


class GSM8KVerifier:
  """Exact match of the strict final answer against `Problem.answer` (1.0 / 0.0)."""

  def __init__(self, stop_sequences: Sequence[str] = STOP_SEQUENCES):
    self.stop_sequences = tuple(stop_sequences)

  def score(self, problem: Problem, response: str) -> float:
    if problem.answer is None:
      raise ValueError(f"Problem {problem.problem_id!r} has no gold answer (Problem.answer is "
                       "None); GSM8KVerifier needs one.")
    try:
      gold = math_answer.gold_number(problem.answer)
    except ValueError as error:
      raise ValueError(f"Problem {problem.problem_id!r}: {error}; answer tasks need a numeric "
                       "'answer'.") from None
    predicted = math_answer.final_answer(truncate_completion(response, self.stop_sequences))
    return 1.0 if predicted is not None and predicted == gold else 0.0

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    if len(problems) != len(responses):
      raise ValueError(f"score_batch got {len(problems)} problems but {len(responses)} responses.")
    return [self.score(p, r) for p, r in zip(problems, responses)]
