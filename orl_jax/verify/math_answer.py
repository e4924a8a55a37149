"""The strict final-answer rule of every math reward (DESIGN §2.4): GSM8K, user answer tasks, the
tiny task. Every math verifier is a `MathAnswerVerifier` and calls `final_answer`, so one
response gets one verdict whichever task it is scored for. docs/verifier.md has the table.

Where the answer is, read as a grader reads a response:
* **Code is not an answer.** Fenced code blocks are dropped and inline code is read as text
  without its markers, so a `####` or `\\boxed{}` inside code is never a marker.
* **A new problem is not part of the answer.** A line starting with `Question:` after a marker
  starts the next problem (a base model given few-shot examples invents it): the response is cut
  there. Before any marker such a line restates the question and is kept.
* **The last marker that holds a number.** Markers are `####` (its text runs to the next marker)
  and `\\boxed{...}` (braces balanced). The answer is read from the last marker whose text holds
  a digit or another numeric character; a later marker without one (a stray empty `\\boxed{}`, a
  closing `####`, a malformed box) is not an answer, and its text stays part of the span read,
  so `#### 30\\n#### thirty-one` still reads `thirty`. No marker holding a number: wrong.
* **The span.** After `####`: the rest of the response. A box: its inside, then the rest of the
  response after it; the clause right before a box is part of the statement, so a sign there
  signs the box (`-\\boxed{30}`) and a hedge, negation or number word there (`approximately
  \\boxed{30}`, `not \\boxed{30}`) makes it wrong. `math_number.read_number` reads the span.

Nothing before the span is ever read otherwise: there is no fall-back to a number elsewhere.
Every function here accepts any string (empty, non-UTF-8 surrogates, megabytes of digits)
without raising, except `gold_number`, whose input is data, not a model's output.
"""
from __future__ import annotations

import bisect
import decimal
import re
from typing import Sequence

from orl_jax.problem import Problem
from orl_jax.verify.math_number import (
    SIGN_WORD_TAIL, SIGNS, hedges_or_negates, non_ascii, read_number)

_MARKER = re.compile(r"#{4,}|\\boxed(?![A-Za-z])")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_BACKTICKS = re.compile(r"`+")
_QUESTION_LINE = re.compile(r"^[ \t]*Question:", re.MULTILINE)
_CLAUSE_END = re.compile(r"[\n,;:!?=]|\.(?=\s)")
_LATEX_NAME = re.compile(r"\\([A-Za-z]+)")
_LATEX_ANY = re.compile(r"\\[A-Za-z]+|\\.")
_HEDGE_LATEX = frozenset({
    "approx", "approxeq", "sim", "simeq", "thicksim", "thickapprox", "backsim", "cong", "pm",
    "mp", "le", "leq", "leqslant", "ge", "geq", "geqslant", "lt", "gt", "ne", "neq", "neg",
    "lnot", "not", "lesssim", "gtrsim", "ll", "gg", "propto", "nless", "ngtr"})


def _without_code(response: str) -> str:
  """`response` without fenced code blocks (an unclosed fence runs to the end, as in CommonMark)
  and with inline code read as text, its `####` and `\\boxed` removed."""
  parts, pos = [], 0
  for fence in _FENCE.finditer(response):
    line_end = response.find("\n", fence.end())
    info = response[fence.end():line_end if line_end >= 0 else len(response)]
    if fence.start() < pos or (fence.group(1)[0] == "`" and "`" in info):
      continue   # inside the previous block, or inline code (a backtick fence's line has none)
    parts.append(response[pos:fence.start()])
    mark = fence.group(1)
    closing = re.compile(r"^ {0,3}" + re.escape(mark[0]) + "{" + str(len(mark)) + r",}[ \t]*$",
                         re.MULTILINE)
    found = closing.search(response, line_end + 1) if line_end >= 0 else None
    pos = found.end() if found else len(response)
    parts.append("\n")
  parts.append(response[pos:])
  return _inline_code_as_text("".join(parts))


def _inline_code_as_text(text: str) -> str:
  """Each code span (a backtick run closed by the next run of the same length) as plain text
  that holds no marker; an unmatched run is literal."""
  runs = list(_BACKTICKS.finditer(text))
  by_length: dict[int, list[int]] = {}
  for index, run in enumerate(runs):
    by_length.setdefault(len(run.group()), []).append(index)
  parts, pos, index = [], 0, 0
  while index < len(runs):
    run = runs[index]
    same = by_length[len(run.group())]
    after = bisect.bisect_right(same, index)
    if after == len(same):
      index += 1
      continue
    closing = runs[same[after]]
    code = text[run.end():closing.start()]
    parts += [text[pos:run.start()], " ", _MARKER.sub(" ", code), " "]
    pos, index = closing.end(), same[after] + 1
  parts.append(text[pos:])
  return "".join(parts)


def _before_next_question(text: str) -> str:
  first = _MARKER.search(text)
  if first is None:
    return text
  question = _QUESTION_LINE.search(text, first.end())
  return text if question is None else text[:question.start()]


def _brace_pairs(text: str) -> dict[int, int]:
  """Position of each `{` -> position of its matching `}` (one pass)."""
  pairs, stack = {}, []
  for match in re.finditer(r"[{}]", text):
    if match.group() == "{":
      stack.append(match.start())
    elif stack:
      pairs[stack.pop()] = match.start()
  return pairs


def _box_inside(text: str, marker: re.Match, pairs: dict[int, int]) -> tuple[int, int] | None:
  """(start, end) of the inside of the box at `marker`; None if it has no balanced braces."""
  i = marker.end()
  while i < len(text) and text[i].isspace():
    i += 1
  if i >= len(text) or text[i] != "{" or i not in pairs:
    return None
  return i + 1, pairs[i]


def _clause_sign(text: str, box_start: int) -> str | None:
  """The sign written right before a box ("" for none); None when the clause before it hedges,
  negates, holds a number word or an operator (`approximately \\boxed{30}`, `not \\boxed{30}`,
  `12 - \\boxed{30}`)."""
  line_start = text.rfind("\n", 0, box_start) + 1
  ends = list(_CLAUSE_END.finditer(text, line_start, box_start))
  clause = text[ends[-1].end() if ends else line_start:box_start]
  if any(name in _HEDGE_LATEX for name in _LATEX_NAME.findall(clause)):
    return None
  clause = _LATEX_ANY.sub(" ", clause).rstrip(" \t$([{*_")
  sign = ""
  word = SIGN_WORD_TAIL.search(clause)
  if word is not None:
    sign, clause = word.group(1) + " ", clause[:word.start(1)]
  elif clause[-1:] in SIGNS:
    sign, clause = clause[-1], clause[:-1]
    before = clause.rstrip()[-1:]
    if before and (before.isdigit() or before in ")]}" or before in SIGNS):
      return None
  return None if hedges_or_negates(clause) else sign


def _numeric_finder(text: str):
  """holds_number(start, end): whether text[start:end] holds a digit or another numeric
  character. Asked with starts that never increase (markers from the last), the searches cover
  disjoint stretches, so all of them together take time linear in the text."""
  numeric = "".join(c for c in non_ascii(text) if c.isnumeric())
  pattern = re.compile("[0-9" + re.escape(numeric) + "]")
  searched_from, first = len(text), len(text)   # `first`: the first numeric at/after searched_from

  def holds_number(start: int, end: int) -> bool:
    nonlocal searched_from, first
    if start > searched_from:
      searched_from, first = len(text), len(text)
    found = pattern.search(text, start, searched_from)
    if found:
      first = found.start()
    searched_from = min(searched_from, start)
    return first < end

  return holds_number


def final_answer(response: str) -> decimal.Decimal | None:
  """The response's final answer under the strict rule; None when it has none (a wrong answer)."""
  text = _before_next_question(_without_code(response))
  markers = list(_MARKER.finditer(text))
  if not markers:
    return None
  pairs = _brace_pairs(text) if any(m.group().startswith("\\") for m in markers) else {}
  holds_number = _numeric_finder(text)

  for index in range(len(markers) - 1, -1, -1):
    marker = markers[index]
    if marker.group().startswith("#"):
      end = markers[index + 1].start() if index + 1 < len(markers) else len(text)
      if holds_number(marker.end(), end):
        return read_number(text[marker.end():])
      continue
    inside = _box_inside(text, marker, pairs)
    if inside is None or not holds_number(*inside):
      continue
    sign = _clause_sign(text, marker.start())
    if sign is None:
      return None
    return read_number(sign + text[inside[0]:inside[1]] + "\n" + text[inside[1] + 1:])
  return None


def gold_number(answer: str) -> decimal.Decimal:
  """A gold answer (data, e.g. `Problem.answer`) as its one number; ValueError if it is not one."""
  value = read_number(str(answer))
  if value is None:
    raise ValueError(f"the gold answer {str(answer)[:80]!r} is not a single number")
  return value


def canonical_number(value: decimal.Decimal) -> str:
  """`Decimal('3.50')` -> '3.5', `Decimal('1E+3')` -> '1000', `-0` -> '0' (exact, any size)."""
  if value == 0:
    return "0"
  text = format(value, "f")
  if "." in text:
    text = text.rstrip("0").rstrip(".")
  return text


def answers_match(response: str, gold: str) -> bool:
  """True when the response's strict final answer equals the gold number exactly."""
  predicted = final_answer(response)
  return predicted is not None and predicted == gold_number(gold)


class MathAnswerVerifier:
  """Scores 1.0 iff the strict final answer equals the gold number of `Problem.answer`, else 0.0.
  Every math task scores with this one class, so the rule cannot differ between tasks."""

  def score(self, problem: Problem, response: str) -> float:
    name = type(self).__name__
    if problem.answer is None:
      raise ValueError(f"Problem {problem.problem_id!r} has no gold answer (Problem.answer is "
                       f"None); {name} needs one.")
    try:
      gold = gold_number(problem.answer)
    except ValueError as error:
      raise ValueError(f"Problem {problem.problem_id!r}: {error}; answer tasks need a numeric "
                       "'answer'.") from None
    predicted = final_answer(response)
    return 1.0 if predicted is not None and predicted == gold else 0.0

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    if len(problems) != len(responses):
      raise ValueError(f"{type(self).__name__}.score_batch got {len(problems)} problems but "
                       f"{len(responses)} responses.")
    return [self.score(p, r) for p, r in zip(problems, responses)]
