"""Exact-answer verifier of the tiny task (docs/verifier.md): the strict rule of `math_answer`,
the same class and meaning as GSM8K's.

Decoded tiny-task text joins digit tokens into whole numbers (`WordTokenizer.decode`: `2 7` ->
`27`), so `#### 2 7` would read as two numbers and is wrong, as is anything after the answer
that holds another number.
"""
from __future__ import annotations

from orl_jax.verify import math_answer


def extract_answer(response: str) -> str | None:
  """The strict final answer of `response` in canonical form (e.g. "27"), or None."""
  value = math_answer.final_answer(response)
  return None if value is None else math_answer.canonical_number(value)


class TinyVerifier(math_answer.MathAnswerVerifier):
  """Scores 1.0 iff the strict final answer equals `problem.answer`."""
