"""Exact-answer verifier of the tiny task (DESIGN §2.4, §5)."""
from __future__ import annotations

import re
from typing import Sequence

from orl_jax.problem import Problem

_ANSWER_MARK = "####"
# The number right after the mark, in decoded text: `WordTokenizer.decode` joins digit tokens into
# whole numbers (`2 7` -> `27`), so `#### 2 7` here would be two numbers and reads as 2.
_ANSWER_PATTERN = re.compile(r"^\s*(-?\d+)")


def extract_answer(response: str) -> str | None:
  """The integer after the last `####` in `response` (canonical form, e.g. "27"), or None."""
  mark = response.rfind(_ANSWER_MARK)
  if mark < 0:
    return None
  match = _ANSWER_PATTERN.match(response[mark + len(_ANSWER_MARK):])
  if match is None:
    return None
  return str(int(match.group(1)))


class TinyVerifier:
  """Scores 1.0 iff the number after the last `####` equals `problem.answer`."""

  def score(self, problem: Problem, response: str) -> float:
    if problem.answer is None:
      raise ValueError(f"Problem {problem.problem_id} has no gold answer; TinyVerifier needs one.")
    predicted = extract_answer(response)
    return float(predicted is not None and predicted == str(int(problem.answer)))

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    if len(problems) != len(responses):
      raise ValueError(f"TinyVerifier.score_batch got {len(problems)} problems but "
                       f"{len(responses)} responses.")
    return [self.score(p, r) for p, r in zip(problems, responses)]
