"""The final-answer rule of every math reward (GSM8K, JSONL answer tasks, the tiny task), read by
an allowlist grammar: what the grammar derives is read, everything else is a wrong answer. Every
math verifier is a `MathAnswerVerifier`, so one response gets one verdict whichever task scores
it. docs/verifier.md ("Math answers: an allowlist grammar") gives the reasons.

  response  = the text: fenced code before the answer dropped, cut at a `Question:` line after
              the first marker; refused: hidden markup anywhere (HTML comments, HTML tags but
              `<think>` and special tokens, markdown reference comments, `\\color`,
              `\\textcolor`, `\\phantom`, ...), and control, format (but the joiners),
              private-use or unassigned code points on the answer's line or after it
  candidate = "####" with a digit on its line | "\\boxed{...}" holding a digit
  answer    = the last candidate; every other candidate holds the same NUMBER, none another
  "####"    : starts its line or follows a full stop; then BODY to the end of the line
  box       : LEAD "\\boxed{" BODY "}" SENTENCE to the end of the line
  after     = only closing lines: blanks, `\\]`, `$$`, `---`, table rules, special tokens
  BODY      = [SIGN] NUMBER [UNIT] ["."]
  SIGN      = one of MINUS_SIGNS                                   (a `$` is read as nothing)
  NUMBER    = DIGITS ["." DIGITS], "," groups of three | \\frac{a}{b} (\\dfrac, \\tfrac) in
              lowest terms, b > 1
  UNIT      = "%" | "°" | one UNIT_WORDS word or word of the problem but HEDGE_WORDS, bare
              or in `\\text{}`/`\\mathrm{}`, after a space, at most an exponent 2 or 3 (`m²`)
  LEAD      = the box's line before it ends in a link (= : | → ⇒ ∴ \\therefore \\Rightarrow
              \\implies), is empty, or ends in a LINK_WORDS, FUNCTION_WORDS or problem word that
              is no COMPARISON_WORDS word; a SIGN may stand between the link and the box
  SENTENCE  = words of the problem, of the working before the box, FUNCTION_WORDS or
              UNIT_WORDS, but never HEDGE_WORDS; numbers of the problem; . , ; ( ) ' " / % ° |

Formatting around a number (`**`, `$`, `\\(`, `\\text{}`, `\\mathbf{}`, `{,}`, `\\,`) is read as
nothing. Every function here accepts any string without raising, in time linear in its length,
except `gold_number`, whose input is data, not a model's output.
"""
from __future__ import annotations

import decimal
import fractions
import functools
import math
import re
import unicodedata
from typing import Sequence

from orl_jax.problem import Problem

MINUS_SIGNS = "-\u2212\u2013\uff0d\ufe63"   # hyphen-minus, minus sign, en dash, full-width, small
UNIT_WORDS = frozenset("""
  dollar dollars cent cents euro euros pound pounds yen rupee rupees hour hours minute minutes
  second seconds day days week weeks month months year years mile miles km kilometer kilometers
  kilometre kilometres meter meters metre metres m cm mm inch inches foot feet ft yard yards kg
  kilogram kilograms g gram grams lb lbs ounce ounces oz liter liters litre litres ml gallon
  gallons cup cups mph kph percent degree degrees point points people person persons
  """.split())
FUNCTION_WORDS = frozenset("""
  a an the in all total each for on at from with that who which this these those it its they
  them their he she his her him we our you your i my me left remaining altogether together
  so then now is are was were be been has have had will would can needs need needed per of
  more less than to by into out up down off away after before during since until between
  without within as there here what when where how many much time times worth old new one two
  three four five six seven eight nine ten dozen hundred thousand s
  """.split())
LINK_WORDS = frozenset("""
  is are was were be been equals equal makes make made has have had gets get got needs need
  needed takes take took costs cost pays paid spends spent earns earned sells sold buys bought
  gives gave saves saved answer total so thus therefore hence
  """.split())
# Right before a box these relate the number to something else instead of stating it.
COMPARISON_WORDS = frozenset("""
  about around approximately approx roughly nearly almost over under above below than least
  most up of by to or nor not no never maybe probably perhaps possibly half twice double
  times x plus minus more less fewer between within
  """.split())

# Words that hedge, negate or bound a number: never part of the sentence after a box, even where
# the problem or the working uses them.
HEDGE_WORDS = frozenset("""
  or nor about around approximately approx roughly rough nearly almost maybe probably perhaps
  possibly likely ish odd some give take tops max maximum min minimum least most push guess
  estimate estimated est not no never isn wrong incorrect false except unless if either
  plus minus above below under beyond upwards sure unsure
  """.split())

_MARKER = re.compile(r"#{4,}|\\boxed\s*\{")
_DIGIT = re.compile(r"[0-9]")
_NUMBER = re.compile(r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?![0-9])")
_FRACTION = re.compile(r"\\[dt]?frac\s*\{\s*([0-9]+)\s*\}\s*\{\s*([0-9]+)\s*\}")
_BODY = re.compile(r"[ \t\r\n]*([" + MINUS_SIGNS + r"]?)[ \t\r\n]*(?:(\x01[0-9]+/[0-9]+\x01)|("
                   + _NUMBER.pattern + r"))(.*)", re.DOTALL)
_FORMATTING = re.compile(r"\\(?:text|textbf|textrm|textit|mathbf|mathrm|mathit|mbox|boldsymbol)"
                         r"(?![A-Za-z])|\*\*|\$|\\[()\[\]]|[{}]")
_LATEX_SYMBOLS = (("{,}", ","), ("\\$", "$"), ("\\%", "%"), ("^\\circ", "°"), ("^{\\circ}", "°"),
                  ("\\,", " "), ("\\;", " "), ("\\ ", " "), ("\\!", ""))
_UNIT = re.compile(r"[ \t\r\n]*(?:([%°])|[ \t\r\n]([^\W\d_]+(?:/[^\W\d_]+)?)(?: *\^ *[23])?)?"
                   r"[ \t\r\n]*\.?[ \t\r\n]*")   # a unit's exponent: `m^2`, `cm³`
_SENTENCE_TOKEN = re.compile(r"\s+|[^\W\d_]+(?:['’-][^\W\d_]+)*|[0-9][0-9,.]*|[.,;()'’\"/%°|]")
_LETTER = re.compile(r"[^\W\d_]")
_LINK_END = re.compile(r"(?:^|[=:|\u2192\u21d2\u2234]|\\(?:therefore|Rightarrow|implies|"
                       r"Longrightarrow)|(?<![^\W\d_'’])([^\W\d_]+(?:['’][^\W\d_]+)*))\s*$")
_CLOSING_LINES = re.compile(r"[\s$|*:\\\]\)-]*")
_SPECIAL_TOKEN = re.compile(r"<\|[^<>|\n]{0,40}\|>|</?think>")
_HIDDEN_MARKUP = re.compile(
    r"<!--|</?[A-Za-z][\w-]*(?:\s[^<>]*)?/?>|^ {0,3}\[[^\]\n]*\]:|"
    r"\\(?:color|textcolor|colorbox|fcolorbox|pagecolor|phantom|hphantom|vphantom|hidden|"
    r"iffalse|begin\s*\{comment\})(?![A-Za-z])", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(`{3,}+|~{3,}+)[^\n]*\n(?:.*?\n)? {0,3}\1[`~]*[ \t]*(?:\n|$)|"
                    r"^ {0,3}(?:`{3,}+|~{3,}+).*", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_QUESTION_LINE = re.compile(r"^[ \t]*Question:", re.MULTILINE)
_CODE = "\x02"   # where code stood: a control character, which no closing line or tail accepts
_ALLOWED_CONTROLS = frozenset("\n\r\t" + _CODE)   # code is refused by place, not here
_JOINERS = frozenset("\u200c\u200d")   # scripts and emoji need them; they are no answer's part


def _hidden_markup(response: str) -> bool:
  """Whether the response holds markup that hides text from a reader: HTML comments and tags,
  markdown reference comments, LaTeX colour and phantom commands."""
  return _HIDDEN_MARKUP.search(_SPECIAL_TOKEN.sub(" ", response)) is not None


def _hidden_chars(response: str) -> bool:
  """Whether the text holds control, format (but the joiners), private-use, surrogate or
  unassigned code points."""
  if response.isascii():
    return any(c < " " and c not in _ALLOWED_CONTROLS for c in set(response))
  for char in set(response):
    category = unicodedata.category(char)
    if (category in ("Cc", "Co", "Cs", "Cn") and char not in _ALLOWED_CONTROLS
        or category == "Cf" and char not in _JOINERS):
      return True
  return False


def _readable_text(response: str) -> str:
  """Special tokens as line breaks, code replaced by `_CODE`, cut at the invented next problem
  (a `Question:` line after the first marker that holds no marker with a digit)."""
  text = _SPECIAL_TOKEN.sub("\n", response)
  if "`" in text or "~~~" in text:
    text = _INLINE_CODE.sub(" " + _CODE + " ", _FENCE.sub("\n" + _CODE + "\n", text))
  first = _MARKER.search(text)
  if first is not None:
    for question in _QUESTION_LINE.finditer(text, first.end()):
      line = text[question.end():_line_end(text, question.end())]
      if not (_MARKER.search(line) and _DIGIT.search(line)):
        return text[:question.start()]
  return text


def _line_end(text: str, at: int) -> int:
  end = text.find("\n", at)
  return len(text) if end < 0 else end


def _brace_pairs(text: str) -> dict[int, int]:
  """Position of each `{` -> position of the `}` that closes it (one pass)."""
  pairs, stack = {}, []
  for match in re.finditer(r"[{}]", text):
    if match.group() == "{":
      stack.append(match.start())
    elif stack:
      pairs[stack.pop()] = match.start()
  return pairs


def _plain(text: str) -> str:
  """`text` with LaTeX symbols made plain, fractions made `\\x01a/b\\x01` and formatting read as
  nothing; any other LaTeX command is left, for the grammar to refuse."""
  if "\\" in text or "{" in text:
    for before, after in _LATEX_SYMBOLS:
      text = text.replace(before, after)
    text = _FRACTION.sub(lambda m: f"\x01{m.group(1)}/{m.group(2)}\x01", text)
  return _FORMATTING.sub(" ", text)


Number = decimal.Decimal | fractions.Fraction   # a Decimal and a Fraction compare exactly


def _value(sign: str, fraction: str | None, digits: str | None) -> Number | None:
  """The exact value of a NUMBER; None for a fraction that is not in lowest terms."""
  value: Number
  if fraction is not None:
    parts = fraction.strip("\x01").split("/")
    if max(len(part) for part in parts) > 1000:
      return None   # beyond any answer, and beyond what `int` reads in linear time
    numerator, denominator = int(parts[0]), int(parts[1])
    if denominator < 2 or math.gcd(numerator, denominator) != 1:
      return None   # `\\frac{60}{2}`, `\\frac{3}{1}`: an expression, not a number in lowest terms
    value = fractions.Fraction(numerator, denominator)
  else:
    assert digits is not None, "the body matched a number"
    value = decimal.Decimal(digits.replace(",", ""))
  return -value if sign else value


def _body(body: str, vocabulary: frozenset[str]) -> Number | None:
  """The NUMBER of a BODY (plain text): SIGN NUMBER UNIT "."; None outside the grammar."""
  match = _BODY.fullmatch(body)
  if match is None:
    return None
  sign, fraction, digits, tail = match.groups()
  if tail[:1].isalnum() or tail[:1] == "." and tail[1:2].isdigit():
    return None   # `3O`, `30k`, `30.5.3`: letters or digits glued to the number
  unit = _UNIT.fullmatch(tail)
  if unit is None:
    return None
  word = unit.group(2)
  if word is not None and word[-1] in "²³":
    word = word[:-1]   # a unit's exponent (`m²`), one
  if word is not None and not all(w.lower() in UNIT_WORDS or _stem(w.lower()) in vocabulary
                                  and w.lower() not in HEDGE_WORDS for w in word.split("/")):
    return None
  return _value(sign, fraction, digits)


def _stem(word: str) -> str:
  """A lowercase word without a plural `s` or `es` (`farmers`, `farmer`; `boxes`, `box`)."""
  if len(word) > 4 and word.endswith("es") and word[-3] in "sxzho":
    return word[:-2]
  return word[:-1] if len(word) > 3 and word.endswith("s") else word


@functools.lru_cache(maxsize=256)
def _problem_words(problem_text: str) -> tuple[frozenset[str], frozenset[str]]:
  """(the stems of the words, the numbers) of a problem's text (one prompt scores many
  responses)."""
  return _words(problem_text)


def _words(problem_text: str) -> tuple[frozenset[str], frozenset[str]]:
  words = frozenset(_stem(w.lower()) for w in re.findall(r"[^\W\d_]+", problem_text))
  numbers = frozenset(n.replace(",", "") for n in _NUMBER.findall(problem_text))
  return words, numbers


def _sentence_allowed(sentence: str, problem_text: str, working: str) -> bool:
  """Whether what follows a box on its line is SENTENCE: words of the problem or of the working
  before the box, the listed function and unit words (never a HEDGE_WORDS word), the problem's
  numbers, and plain punctuation."""
  words, numbers = _problem_words(problem_text)
  if _LETTER.search(sentence):
    words = words | _words(working)[0]
  pos = 0
  while pos < len(sentence):
    token = _SENTENCE_TOKEN.match(sentence, pos)
    if token is None:
      return False
    text, pos = token.group(), token.end()
    if text[0].isdigit():
      if text.rstrip(".,").replace(",", "") not in numbers:
        return False
    elif text[0].isalpha():
      if not all(p not in HEDGE_WORDS and (_stem(p) in words or p in FUNCTION_WORDS
                                           or p in UNIT_WORDS)
                 for p in re.split(r"['’-]", text.lower())):
        return False
  return True


def _without_gap(lead: str) -> str:
  """`lead` without the blanks and math delimiters that end it (`$`, `**`, `\\(`, `\\[`)."""
  while True:
    lead = lead.rstrip()
    if lead.endswith(("**", "\\(", "\\[")):
      lead = lead[:-2]
    elif lead.endswith("$"):
      lead = lead[:-1]
    else:
      return lead


def _lead_sign(lead: str, problem_text: str) -> str | None:
  """The sign the box's LEAD gives it ("" or "-"); None when the lead does not end in a link."""
  sign, lead = "", _without_gap(lead)
  if lead[-1:] and lead[-1] in MINUS_SIGNS:
    sign, lead = "-", _without_gap(lead[:-1])
  link = _LINK_END.search(lead)
  if link is None:
    return None
  word = link.group(1)
  if word is not None:
    lower = word.lower()
    if lower in COMPARISON_WORDS or not (lower in LINK_WORDS or lower in FUNCTION_WORDS
                                         or _stem(lower) in _problem_words(problem_text)[0]):
      return None
  return sign


def _candidates(text: str) -> list[tuple[int, int, int]]:
  """(marker start, body start, body end) of every candidate: a `####` with a digit on its line,
  a box holding a digit. Markers come in order, so the digit searches take linear time."""
  found = []
  pairs = _brace_pairs(text) if "\\boxed" in text else {}
  next_digit = -1

  def holds_digit(start: int, end: int) -> bool:
    nonlocal next_digit
    if next_digit < start:
      digit = _DIGIT.search(text, start)
      next_digit = digit.start() if digit else len(text)
    return next_digit < end

  for marker in _MARKER.finditer(text):
    if marker.group().startswith("#"):
      end = _line_end(text, marker.end())
    else:
      end = pairs.get(marker.end() - 1, -1)
    if holds_digit(marker.end(), end):
      found.append((marker.start(), marker.end(), end))
  return found


def _hash_placed(text: str, start: int) -> bool:
  """Whether a `####` starts its line or follows a full stop (`27 . #### 27`)."""
  before = text[text.rfind("\n", 0, start) + 1:start].rstrip()
  return not before or before.endswith(".")


def final_answer(response: str, problem_text: str = "") -> Number | None:
  """The response's final answer under the grammar; None when it has none (a wrong answer).
  `problem_text` (the prompt) supplies the words and numbers a box's sentence may use."""
  if _hidden_markup(response):
    return None
  text = _readable_text(response)
  candidates = _candidates(text)
  if not candidates:
    return None
  vocabulary: frozenset[str] = frozenset()
  values = []
  for _, body_start, body_end in candidates:
    if _MARKER.search(text, body_start, body_end):
      return None   # a candidate inside a candidate
    body = _plain(text[body_start:body_end])
    if _LETTER.search(body):
      vocabulary = _problem_words(problem_text)[0]
    values.append(_body(body, vocabulary))
  answer = values[-1]
  if answer is None or any(v != answer for v in values):
    return None   # an unreadable answer, or a second candidate answer
  start, _, body_end = candidates[-1]
  line_end = _line_end(text, body_end)
  line_start = text.rfind("\n", 0, start) + 1
  if _hidden_chars(text[line_start:]):
    return None   # invisible characters on the answer's line or after it
  if not _CLOSING_LINES.fullmatch(text, line_end):
    return None   # text after the answer's line
  if text[start] == "#":
    return answer if _hash_placed(text, start) else None
  sign = _lead_sign(_plain_lead(text[line_start:start]), problem_text)
  sentence = _plain(text[body_end + 1:line_end])
  if sign is None or not _sentence_allowed(sentence, problem_text, text[:start]):
    return None
  return -answer if sign else answer


def _plain_lead(lead: str) -> str:
  """A box's lead with `{,}`, `\\$` and the like made plain, math delimiters kept (`$`, `\\(`)."""
  for before, after in _LATEX_SYMBOLS:
    lead = lead.replace(before, after)
  return lead


def read_number(text: str) -> Number | None:
  """A whole string as one NUMBER with its sign (`-3.5`, `1,200`, `\\frac{1}{2}`); None if it is
  not exactly one."""
  match = _BODY.fullmatch(_plain(text))
  if match is None or match.group(4).strip():
    return None
  return _value(*match.groups()[:3])


def gold_number(answer: str) -> Number:
  """A gold answer (data, e.g. `Problem.answer`) as its one number; ValueError if it is not one."""
  value = read_number(str(answer))
  if value is None:
    raise ValueError(f"the gold answer {str(answer)[:80]!r} is not a single number")
  return value


def canonical_number(value: Number) -> str:
  """`3.50` -> '3.5', `Decimal('1E+3')` -> '1000', `-0` -> '0', `Fraction(1, 3)` -> '1/3'."""
  if value == 0:
    return "0"
  if isinstance(value, fractions.Fraction):
    if value.denominator != 2 ** _power(value.denominator, 2) * 5 ** _power(value.denominator, 5):
      return f"{value.numerator}/{value.denominator}"
    places = max(_power(value.denominator, 2), _power(value.denominator, 5))
    scaled = value.numerator * (10 ** places // value.denominator)
    value = decimal.Decimal(scaled).scaleb(-places, decimal.Context(prec=decimal.MAX_PREC))
  text = format(value, "f")
  if "." in text:
    text = text.rstrip("0").rstrip(".")
  return text


def _power(n: int, prime: int) -> int:
  """The exponent of `prime` in `n`."""
  count = 0
  while n % prime == 0:
    n, count = n // prime, count + 1
  return count


def answers_match(response: str, gold: str, problem_text: str = "") -> bool:
  """True when the response's final answer equals the gold number exactly."""
  predicted = final_answer(response, problem_text)
  return predicted is not None and predicted == gold_number(gold)


class MathAnswerVerifier:
  """Scores 1.0 iff the final answer equals the gold number of `Problem.answer`, else 0.0. Every
  math task scores with this one class, so the rule cannot differ between tasks."""

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
    predicted = final_answer(response, problem.prompt)
    return 1.0 if predicted is not None and predicted == gold else 0.0

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    if len(problems) != len(responses):
      raise ValueError(f"{type(self).__name__}.score_batch got {len(problems)} problems but "
                       f"{len(responses)} responses.")
    return [self.score(p, r) for p, r in zip(problems, responses)]
