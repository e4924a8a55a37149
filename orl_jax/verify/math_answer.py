"""The strict final-answer rule of every math reward (DESIGN §2.4): GSM8K, user answer tasks, the
tiny task.

The final answer is read from the *final-answer span*: the text after the last `####` to the end
of the response, or the inside of the last `\\boxed{...}` (braces balanced), whichever marker
comes last; the text after that box may hold words and punctuation but no number and no hedge.
The final answer therefore ends the response. Nothing before the span is ever read: no marker, or
an empty or unreadable span, is a wrong answer (no fall-back to a number elsewhere in the text).

The span is right only when it holds exactly one number and no hedge:
* a number is a run of digits with an optional sign, decimal part and exponent; every other run
  of digits in the span, and every spelled-out number word (`one`, `thirty`, `dozen`, ...), is a
  second number, so `30 or 31`, `29, 30`, `30-31`, `30–31`, `30 (thirty-one)` are wrong;
* hedges: the words `or`, `either`, `maybe`, `perhaps`, `possibly`, `probably`, `about`,
  `around`, `approximately`, `approx`, `roughly`, `nearly`, `almost`, `between`, the signs
  `? ~ ≈ ± ∓ < > ≤ ≥` and the LaTeX `\\approx \\sim \\pm \\mp \\le \\ge \\lt \\gt \\ne` (and
  variants): `#### 30 or so`, `#### ~30`, `\\boxed{\\approx 30}` are wrong;
* any other text may surround the number (units, currency, `hmm.`): `#### 30 dollars`, `#### $30`,
  `#### 30 hmm.` read as 30.

Normalised, and nothing else: thousands separators (only valid groups of three: `1,234`; `30,5`
is unreadable), a trailing `.` or `.0`, a leading `$` (also `-$5`, `$-5`), `%` and other units
after the number, LaTeX spacing and wrappers inside boxes (`\\text{}`, `\\mathrm{}`, `{,}`,
`\\,`, `\\$`, `\\%`), and scientific notation whose value is an integer (`3e1` == 30; `3e-1` is
unreadable; exponents beyond ±100 are unreadable). Answers are compared as exact decimals
(`3.50` == `3.5`, `-0` == `0`), with no precision limit. Fractions (`\\frac{1}{2}`, `1/2`) hold
two numbers and are wrong: the gold answers these rewards are used with are single decimals.

Every function here accepts any string (empty, non-UTF-8 surrogates, megabytes of digits)
without raising, except `gold_number`, whose input is data, not a model's output.
"""
from __future__ import annotations

import decimal
import re

ANSWER_MARK = "####"
_BOXED = "\\boxed"
_MAX_EXPONENT = 100
# A number: digits (commas between digits), a decimal part, an exponent glued to it.
_NUMBER = re.compile(r"(?P<mantissa>\d+(?:,\d+)*(?:\.\d+)?|\.\d+)(?:[eE](?P<exponent>[-+]?\d+))?")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+")
_WORD = re.compile(r"[^\W\d_]+")
_LATEX_COMMAND = re.compile(r"\\([A-Za-z]+)")
_LATEX_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_LATEX_SPACING = (("{,}", ","), ("\\,", ","), ("\\!", ""), ("\\;", " "), ("\\:", " "),
                  ("\\ ", " "), ("\\quad", " "), ("\\$", "$"), ("\\%", "%"))
_HEDGE_WORDS = frozenset({
    "or", "either", "maybe", "perhaps", "possibly", "probably", "about", "around",
    "approximately", "approx", "roughly", "nearly", "almost", "between"})
_HEDGE_LATEX = frozenset({
    "approx", "sim", "simeq", "pm", "mp", "le", "leq", "leqslant", "ge", "geq", "geqslant",
    "lt", "gt", "ne", "neq", "lesssim", "gtrsim"})
_HEDGE_SIGNS = frozenset("?~≈±∓<>≤≥")
# Special tokens a detokenizer may leave (`<|im_end|>`, `</s>`): not a `<` or `>` hedge.
_SPECIAL_TOKEN = re.compile(r"<\|[^<>|]{0,40}\|>|</?[A-Za-z_][\w-]{0,20}>")
_NUMBER_WORDS = frozenset({
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    "hundred", "thousand", "million", "billion", "trillion", "dozen", "half", "twice"})
_SIGNS = "-−–+"


def _boxed(response: str, start: int) -> tuple[str, str] | None:
  """(inside, text after) of the `\\boxed{...}` at `start` (braces balanced); None if malformed."""
  i = start + len(_BOXED)
  while i < len(response) and response[i].isspace():
    i += 1
  if i >= len(response) or response[i] != "{":
    return None
  depth = 0
  for j in range(i, len(response)):
    if response[j] == "{":
      depth += 1
    elif response[j] == "}":
      depth -= 1
      if depth == 0:
        return response[i + 1:j], response[j + 1:]
  return None


def _is_hedged(span: str) -> bool:
  if any(c in _HEDGE_SIGNS for c in _SPECIAL_TOKEN.sub(" ", span)):
    return True
  if any(name in _HEDGE_LATEX for name in _LATEX_COMMAND.findall(span)):
    return True
  return False


def _plain_text(span: str) -> str:
  """The span without LaTeX wrappers and spacing commands (their content kept)."""
  for before, after in _LATEX_SPACING:
    span = span.replace(before, after)
  for _ in range(4):   # nested wrappers: \text{\textbf{30}}
    unwrapped = _LATEX_WRAPPER.sub(r" \1 ", span)
    if unwrapped == span:
      break
    span = unwrapped
  return _LATEX_COMMAND.sub(" ", span)


def _is_negative(text: str, start: int) -> bool:
  """Whether the number starting at `start` carries a minus sign (`-5`, `−5`, `-$5`, `$-5`,
  `- 5`): a sign glued to a word or a digit (`16-3`) is not one."""
  i = start
  while i > 0 and text[i - 1] in " $":
    i -= 1
  if i == 0 or text[i - 1] not in _SIGNS:
    return False
  before = text[i - 2] if i >= 2 else " "
  return text[i - 1] != "+" and not (before.isalnum() or before in "._")


def _is_integral(value: decimal.Decimal) -> bool:
  _, digits, exponent = value.as_tuple()
  return exponent >= 0 or not any(digits[exponent:])


def _numbers_unless_hedged(span: str) -> tuple[str, list[re.Match]] | None:
  """(plain text, its number matches) of a span; None if it hedges or spells out a number."""
  if _is_hedged(span):
    return None
  text = _plain_text(span)
  words = [w.lower() for w in _WORD.findall(text)]
  if any(w in _HEDGE_WORDS or w in _NUMBER_WORDS for w in words):
    return None
  return text, list(_NUMBER.finditer(text))


def read_number(span: str) -> decimal.Decimal | None:
  """The one number of a final-answer span, exactly; None when the span holds no number, more
  than one, a hedge, or a number that is not readable (module docstring)."""
  found = _numbers_unless_hedged(span)
  if found is None or len(found[1]) != 1:
    return None
  text, (match,) = found
  mantissa, exponent = match.group("mantissa"), match.group("exponent")
  integer = mantissa.split(".")[0]
  if "," in integer and not _THOUSANDS.fullmatch(integer):
    return None
  if exponent is not None and (len(exponent.lstrip("+-")) > 3
                               or abs(int(exponent)) > _MAX_EXPONENT):
    return None
  value = decimal.Decimal(f"{mantissa.replace(',', '')}e{exponent or 0}")
  if exponent is not None and not _is_integral(value):
    return None
  return -value if _is_negative(text, match.start()) else value


def final_answer(response: str) -> decimal.Decimal | None:
  """The response's final answer under the strict rule; None when it has none (a wrong answer)."""
  mark = response.rfind(ANSWER_MARK)
  box = response.rfind(_BOXED)
  if box > mark:
    boxed = _boxed(response, box)
    if boxed is None:
      return None
    inside, after = boxed
    if _numbers_unless_hedged(after) != (_plain_text(after), []):
      return None   # a number or a hedge after the box: `\\boxed{30} or 31`
    return read_number(inside)
  if mark < 0:
    return None
  return read_number(response[mark + len(ANSWER_MARK):])


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
