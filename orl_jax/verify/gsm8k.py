"""GSM8K answer extraction and exact numeric match (DESIGN §2.4).

The final answer of a response is, in order of preference:
1. the first number after the last `####` (the GSM8K gold format and our prompts' format);
2. the last number inside the last `\\boxed{...}` (what many instruct models write);
3. the last number anywhere in the response.

Numbers may carry thousands separators (`1,234`), decimals (`3.50`), a sign (`-3`, `−3`), a
currency sign (`$12`, `-$5`) and trailing units (`12 dollars`, `5%`): only the number is kept.
Two answers match when they are numerically equal (`3.50` == `3.5`, `1,000` == `1000`).
"""
from __future__ import annotations

import decimal
import re
from typing import Sequence

from orl_jax.problem import Problem

# A sign counts only when it is not glued to a preceding word or digit, so `16-3` reads as 16, 3.
_NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<sign>[-−–]\s?)?\$?\s?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?")
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER_MARK = "####"


def parse_numbers(text: str) -> list[decimal.Decimal]:
  """Every number in `text`, in order, as exact decimals."""
  numbers = []
  for match in _NUMBER_RE.finditer(text):
    digits = match.group("int").replace(",", "") + (match.group("frac") or "")
    value = decimal.Decimal(digits)
    numbers.append(-value if match.group("sign") and value != 0 else value)
  return numbers


def extract_number(response: str) -> decimal.Decimal | None:
  """The response's final answer as a number (rules in the module docstring); None if none."""
  if _ANSWER_MARK in response:
    after_mark = parse_numbers(response.rsplit(_ANSWER_MARK, 1)[1])
    if after_mark:
      return after_mark[0]
  boxed = _BOXED_RE.findall(response)
  if boxed:
    inside = parse_numbers(boxed[-1])
    if inside:
      return inside[-1]
  numbers = parse_numbers(response)
  return numbers[-1] if numbers else None


def canonical_number(value: decimal.Decimal) -> str:
  """`Decimal('3.50')` → '3.5', `Decimal('1E+3')` → '1000', `-0` → '0'."""
  if value == 0:
    return "0"
  return format(value.normalize(), "f")


def extract_answer(response: str) -> str | None:
  """The response's final answer as a canonical number string, or None."""
  value = extract_number(response)
  return None if value is None else canonical_number(value)


def answers_match(response: str, gold: str) -> bool:
  """True when the response's final answer equals the gold answer numerically."""
  predicted = extract_number(response)
  gold_numbers = parse_numbers(gold)
  if predicted is None or len(gold_numbers) != 1:
    return False
  return predicted == gold_numbers[0]


class GSM8KVerifier:
  """Exact numeric match of the final answer against `Problem.answer` (1.0 / 0.0)."""

  def score(self, problem: Problem, response: str) -> float:
    if problem.answer is None:
      raise ValueError(f"Problem {problem.problem_id!r} has no gold answer (Problem.answer is "
                       "None); GSM8KVerifier needs one.")
    return 1.0 if answers_match(response, problem.answer) else 0.0

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    if len(problems) != len(responses):
      raise ValueError(f"score_batch got {len(problems)} problems but {len(responses)} responses.")
    return [self.score(p, r) for p, r in zip(problems, responses)]
