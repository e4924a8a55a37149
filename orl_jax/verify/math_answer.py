"""The strict final-answer rule of every math reward: GSM8K, user answer tasks, the tiny task.
Every math verifier is a `MathAnswerVerifier` and calls `final_answer`, so one response gets one
verdict whichever task it is scored for. docs/verifier.md ("Math answers: one strict rule") has
the grammar, the table of classes and the reasons.

The grammar, read as a grader reads a response (everything outside it is a wrong answer):

  response  = text (code blocks dropped, cut at the next problem)
  MARKER    = "####" BODY | "\\boxed{" BODY "}"        BODY holds a number, braces balanced
  HEADING   = line start, "#### ", a letter, no number on the line     (a markdown heading)
  answer    = the last MARKER that holds a number; a HEADING only when no MARKER holds one
  span      = "####": the rest of the response | box: CLAUSE SIGN, its inside, the rest;
              either way up to the end of the first HEADING line after the answer
  CLAUSE    = what stands before a box on its line since , ; : = → ∴ ! ? or a full stop
  span      = LEAD NUMBER TAIL                          (`math_number.read_number`)

* **Code is not an answer.** Fenced code blocks are dropped and inline code is read as text
  without its markers, so a `####` or `\\boxed{}` inside code is never a marker. A code block
  after the answer that holds a marker with a number (`#### 30` then a block printing `#### 31`)
  is a second answer we cannot read: the response is wrong.
* **A new problem is not part of the answer.** A line starting with `Question:` after a marker
  starts the next problem (a base model given few-shot examples invents it): the response is cut
  there. Before any marker such a line restates the question and is kept; a `Question:` line
  that itself holds a marker with a number is no new problem (a problem is never stated with its
  answer marker) and is read like any other line.
* **The last marker that holds a number.** A `####` marker's text runs to the next marker; a
  later marker without a number (a stray empty `\\boxed{}`, a closing `####`) is not an answer,
  and its text stays part of the span read, so `#### 30\\n#### thirty-one` is wrong.
* **Headings.** A line such as `#### Check` is a markdown heading, not a marker: it ends the
  answer's span, and the section under it is working, not the answer (`\\boxed{30}.\\n#### Check
  \\n12 + 18 = 30` reads 30). The heading line itself is read with the answer, so `#### 30\\n####
  Correction` is wrong. Only when no marker holds a number is a heading read as a `####` marker
  (`#### Final Answer\\nThe total is 30.`).
* **The clause before a box belongs to it**: a sign there signs the box (`-\\boxed{30}`); a
  hedge, negation, modifier, operand or operator there makes it wrong (`approximately
  \\boxed{30}`, `north of \\boxed{30}`, `12 - \\boxed{30}`), as does a box inside the argument
  of a command that is not formatting (`\\sqrt{\\boxed{900}}`, `\\cancel{\\boxed{30}}`).

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
    LATEX_FORMATTING, LINK_SYMBOLS, clause_sign, non_ascii, read_number)

_MARKER = re.compile(r"#{4,}|\\boxed(?![A-Za-z])")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_BACKTICKS = re.compile(r"`+")
_DIGIT = re.compile(r"\d")
_ASCII_DIGIT = re.compile(r"[0-9]")
_QUESTION_LINE = re.compile(r"^[ \t]*Question:", re.MULTILINE)
_HEADING_TEXT = re.compile(r"[ \t]+[*_]*[^\W\d_]")
_CLAUSE_END = re.compile(
    r"[\n,;!?" + LINK_SYMBOLS + r"]|\.(?=\s)|->|=>|"
    r"\\(?:therefore|Rightarrow|Longrightarrow|implies|to|rightarrow|longrightarrow)(?![A-Za-z])")
_COMMAND_BEFORE = re.compile(r"\\([A-Za-z]+)\s*$")
# Where a code block holding a marker with a number was dropped: a noncharacter, which no
# reading accepts, so that the block still counts where it stood.
_CODE_ANSWER = "\uffff"


def _without_code(response: str) -> str:
  """`response` without fenced code blocks (an unclosed fence runs to the end, as in CommonMark)
  and with inline code read as text, its `####` and `\\boxed` removed. A dropped block that
  holds a marker with a number leaves `_CODE_ANSWER` where it stood."""
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
    marker = _MARKER.search(response, fence.end(), pos)
    holds_answer = marker is not None and _DIGIT.search(response, marker.end(), pos)
    parts.append("\n" + _CODE_ANSWER + "\n" if holds_answer else "\n")
  parts.append(response[pos:])
  return _inline_code_as_text("".join(parts))


def _inline_code_as_text(text: str) -> str:
  """Each code span (a backtick run closed by the next run of the same length) as plain text
  that holds no marker; an unmatched run is literal."""
  if "`" not in text:
    return text
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


def _before_next_problem(text: str) -> str:
  """`text` cut at the first `Question:` line after a marker that holds no marker with a
  number itself."""
  first = _MARKER.search(text)
  if first is None:
    return text
  for question in _QUESTION_LINE.finditer(text, first.end()):
    line_end = text.find("\n", question.end())
    line_end = len(text) if line_end < 0 else line_end
    marker = _MARKER.search(text, question.end(), line_end)
    if marker is None or not _DIGIT.search(text, marker.end(), line_end):
      return text[:question.start()]
  return text


def _is_heading(text: str, marker: re.Match) -> bool:
  """Whether a `####` starts a markdown heading: at the start of its line (up to three spaces
  in), then a space and a letter (`#### Check`, `#### **Final Answer**`), and no number on the
  line."""
  if not _HEADING_TEXT.match(text, marker.end()):
    return False
  before = text[max(0, marker.start() - 4):marker.start()]
  newline = before.rfind("\n")
  if newline < 0 and marker.start() > 3:
    return False
  if before[newline + 1:].strip(" "):
    return False   # not at the start of its line (three spaces of indent at most)
  line_end = text.find("\n", marker.end())
  line = text[marker.end():line_end if line_end >= 0 else len(text)]
  return not any(c.isnumeric() for c in line)


def _line_end(text: str, at: int) -> int:
  end = text.find("\n", at)
  return len(text) if end < 0 else end


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


def _inside_an_operator(text: str, at: int, pairs: dict[int, int]) -> bool:
  """Whether position `at` lies inside the argument of a LaTeX command that is not formatting
  (`\\sqrt{...}`, `\\cancel{...}`, the second argument of `\\frac{1}{...}`) or of an exponent
  or subscript (`x^{...}`)."""
  opens_of = {close: open_ for open_, close in pairs.items()}
  stack = []
  for match in re.finditer(r"[{}]", text[:at]):
    if match.group() == "{":
      stack.append(match.start())
    elif stack:
      stack.pop()
  for open_at in stack:
    start = open_at
    while True:   # back over the earlier arguments of the same command
      end = start
      while end > 0 and text[end - 1].isspace():
        end -= 1
      if end > 0 and text[end - 1] == "}" and end - 1 in opens_of:
        start = opens_of[end - 1]
        continue
      break
    command = _COMMAND_BEFORE.search(text, max(0, start - 40), start)
    if command is not None:
      if command.group(1) not in LATEX_FORMATTING:
        return True
    elif end > 0 and text[end - 1] in "^_":
      return True
  return False


def _box_sign(text: str, box_start: int, pairs: dict[int, int]) -> str | None:
  """The sign the clause before the box at `box_start` gives it; None when that clause or an
  enclosing command makes it something other than the stated answer."""
  if _inside_an_operator(text, box_start, pairs):
    return None
  line_start = text.rfind("\n", 0, box_start) + 1
  clause_start = line_start
  for end in _CLAUSE_END.finditer(text, line_start, box_start):
    clause_start = end.end()
  return clause_sign(text[clause_start:box_start])


def _numeric_finder(text: str):
  """holds_number(start, end): whether text[start:end] holds a digit or another numeric
  character. Asked with starts that never increase (markers from the last), the searches cover
  disjoint stretches, so all of them together take time linear in the text."""
  numeric = "".join(c for c in non_ascii(text) if c.isnumeric())
  pattern = re.compile("[0-9" + re.escape(numeric) + "]") if numeric else _ASCII_DIGIT
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
  text = _before_next_problem(_without_code(response))
  markers = list(_MARKER.finditer(text))
  if not markers:
    return None
  pairs = _brace_pairs(text) if any(m.group().startswith("\\") for m in markers) else {}
  holds_number = _numeric_finder(text)
  headings = [m.group().startswith("#") and _is_heading(text, m) for m in markers]

  answer, fallback = None, None   # the last marker holding a number; the last such heading
  for index in range(len(markers) - 1, -1, -1):
    marker = markers[index]
    if marker.group().startswith("#"):
      end = markers[index + 1].start() if index + 1 < len(markers) else len(text)
      if holds_number(marker.end(), end):
        if not headings[index]:
          answer = index
          break
        if fallback is None:
          fallback = index
      continue
    inside = _box_inside(text, marker, pairs)
    if inside is not None and holds_number(*inside):
      answer = index
      break
  if answer is None:
    if fallback is None:
      return None
    answer, headings[fallback] = fallback, False

  marker = markers[answer]
  if _CODE_ANSWER in text[marker.start():]:
    return None   # a code block after the answer holds another marked number
  span_end = len(text)
  for index in range(answer + 1, len(markers)):
    if headings[index]:
      span_end = _line_end(text, markers[index].end())
      break
  if marker.group().startswith("#"):
    return read_number(text[marker.end():span_end])
  inside = _box_inside(text, marker, pairs)
  assert inside is not None, "the answer is a box with a number"
  sign = _box_sign(text, marker.start(), pairs)
  if sign is None:
    return None
  return read_number(sign + text[inside[0]:inside[1] + 1] + text[inside[1] + 1:span_end])


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
