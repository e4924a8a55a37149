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
  UNIT      = "%" | "°" | one UNIT_WORDS word or word of the problem (any of its forms) but a
              RESTRICTED word (unless the problem counts it: `how many million`), bare or in
              `\\text{}`/`\\mathrm{}`, after a space, at most an exponent 2 or 3 (`m²`)
  LEAD      = the box's line before it ends in a link (= : | → ⇒ ∴ \\therefore \\Rightarrow
              \\implies), is empty, or ends in a LINK_WORDS, FUNCTION_WORDS or problem word that
              is no COMPARISON_WORDS word (`of` after a noun: `a profit of`); a SIGN may stand
              between the link and the box; no LEAD_HEDGE_WORDS word or `n't` on the line
              (`Roughly,`, `doesn't`) but in a PHRASE or as the problem's name (`Max`)
  SENTENCE  = words of the problem in any of their forms (`remained`, `brought`), FUNCTION_WORDS
              or UNIT_WORDS; a RESTRICTED word (HEDGE_WORDS, QUANTITY_WORDS) only in a PHRASE,
              or, as what the problem counts (`how many times`) or a comparative, right after
              the number or its noun (`\\boxed{18} more vlogs`); a number of the
              problem or the working that counts the word after it (`in 3 bags`, `to fill 170
              balloons`, `horse #12`); a dash between words; . , ; ( ) ' " / % ° |
  PHRASE    = two adjacent words of the problem, one of them no RESTRICTED word (`are not in`)

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
  gallons cup cups mph kph percent degree degrees point points people person persons cubic
  square sq
  """.split())
FUNCTION_WORDS = frozenset("""
  a an the in all total each for on at from with that who which this these those it its they
  them their he she his her him we our you your i my me us left remaining altogether together
  so then now is are was were be been being am has have had will would can shall do
  does did doing done needs need needed per of to by into onto out down off
  away after before during since until between without within through across along among
  toward towards behind beside as than there here what when where how many much time worth
  old new
  every both another other others whole rest enough still also again already s
  themselves himself herself itself someone everyone everything something anyone
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
  possibly likely ish odd some tops max maximum min minimum least most push guess
  estimate estimated est not no never isn cannot none nothing nobody neither wrong incorrect
  false except unless if either
  plus minus above below under beyond upwards sure unsure rounded rounding approximate
  approximated approximation estimates estimating unlikely circa ca nearest may might could
  """.split())
# The hedge words that hedge a box anywhere before it on its line (`Roughly, Tom has`); the others
# are arithmetic, conditions, alternatives or abilities in the working (`because 200 minus 174
# equals`, `If he sells everything,`, `or 150/5 =`, `before Jerome could open`), refused only
# right before the box.
LEAD_HEDGE_WORDS = HEDGE_WORDS - frozenset("""
  if or nor either except unless plus minus above below under beyond upwards some could
  """.split())
# Words that change the quantity a number states: arithmetic, comparison and magnitude. With the
# hedge words they read after a box only inside a phrase of the problem (`how many more floral
# shirts` -> `\boxed{10} more floral shirts`), never as a unit.
QUANTITY_WORDS = frozenset("""
  times more less fewer over twice double doubles triple thrice half quarter dozen dozens
  hundred hundreds thousand thousands million millions billion billions trillion trillions
  lakh crore grand k mil mill bn tn squared cubed doubled tripled halved x up
  """.split())
# The words before a number inside the sentence after a box: a number there is a place or a
# count of something else (`in 3 bags`, `after 15 days`, `horse #12`), never a second answer.
NUMBER_LEADS = frozenset("""
  in after for of at on from per every each with before the first last next
  """.split())
# A comparative, or a word the problem asks to count (`how many times`), right after the number
# or its noun states what the number counts (`\boxed{18} more vlogs`, `\boxed{5} hours more`,
# `\boxed{22} times`); anywhere else it bounds it (`apples and more`, `dozen dozen`).
COMPARATIVES = frozenset("more less fewer".split())
# Number words, for the numbers of a problem that spells them (`After fifteen days`).
NUMBER_WORDS = {word: str(value) for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update({word: str(10 * tens) for tens, word in enumerate(
    "thirty forty fifty sixty seventy eighty ninety".split(), start=3)})
# Irregular English forms and their base word, so that a restated `drove`, `brought` or `made`
# is the problem's `drive`, `bring` or `make` (regular endings are taken off by `_lemma`).
IRREGULAR_FORMS = dict(pair.split(":") for pair in """
  brought:bring bought:buy made:make took:take taken:take gave:give given:give got:get
  gotten:get went:go gone:go came:come drove:drive driven:drive ate:eat eaten:eat sold:sell
  told:tell paid:pay spent:spend sent:send left:leave kept:keep felt:feel found:find held:hold
  built:build began:begin begun:begin ran:run sang:sing sung:sing wrote:write written:write
  grew:grow grown:grow knew:know known:know threw:throw thrown:throw flew:fly flown:fly
  drank:drink drunk:drink swam:swim rode:ride ridden:ride fell:fall fallen:fall won:win
  lost:lose met:meet saw:see seen:see stood:stand sat:sit led:lead slept:sleep fed:feed
  fought:fight caught:catch taught:teach thought:think wore:wear worn:wear tore:tear
  chose:choose chosen:choose broke:break broken:break spoke:speak froze:freeze hid:hide
  shook:shake forgot:forget dug:dig hung:hang lent:lend bent:bend spun:spin shot:shoot
  lit:light laid:lay men:man women:woman children:child people:person feet:foot teeth:tooth
  mice:mouse geese:goose
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
_SENTENCE_TOKEN = re.compile(r"\s+|[^\W\d_]+(?:['’&-][^\W\d_]+)*|#?[0-9][0-9,.]*|[-–.,;()'’\"/%°|]")
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


def _body(body: str, problem_text: str) -> Number | None:
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
  if word is not None and not all(_unit_word(w.lower(), problem_text) for w in word.split("/")):
    return None
  return _value(sign, fraction, digits)


def _unit_word(word: str, problem_text: str) -> bool:
  """Whether `word` (lowercase) is a UNIT: listed, the problem's and no restricted word, or
  what the problem counts (`million` for `How many million people ...?`)."""
  if word in UNIT_WORDS:
    return True
  words, _, pairs, _ = _problem_words(problem_text)
  lemma = _lemma(word)
  return _asked_for(lemma, pairs) if _restricted(word) else lemma in words


def _asked_for(lemma: str, pairs: frozenset[tuple[str, str]]) -> bool:
  """Whether the problem asks to count the word (`how many times`, `how much more`)."""
  return ("many", lemma) in pairs or ("much", lemma) in pairs


@functools.lru_cache(maxsize=4096)
def _lemma(word: str) -> str:
  """A lowercase word's base form, the same for its regular and listed irregular forms
  (`remained`, `remaining` -> `remain`; `quizzes`, `quiz` -> `quiz`; `made`, `makes` -> `mak`),
  so that a restatement may inflect the problem's words."""
  word = IRREGULAR_FORMS.get(word, word)
  if len(word) > 4 and word.endswith(("ies", "ied")):
    word = word[:-3] + "y"
  elif len(word) > 4 and word.endswith("es") and word[-3] in "sxzh":
    word = word[:-2]
  elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
    word = word[:-1]
  elif len(word) > 3 and word.endswith("ed") and not word.endswith("eed"):
    word = word[:-2]
  elif len(word) > 5 and word.endswith("ing"):
    word = word[:-3]
  if len(word) > 2 and word.endswith("e"):
    word = word[:-1]
  if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "aeiou":
    word = word[:-1]   # `stopped` -> `stop`, `quizz` -> `quiz`
  return word


RESTRICTED_WORDS = HEDGE_WORDS | QUANTITY_WORDS


def _restricted(word: str) -> bool:
  """Whether a lowercase word hedges, negates, bounds or changes a quantity. The listed forms
  only: by lemma, `tops` would take `top` and `mines` `min`; an unlisted form is no word of the
  problem's but when the problem uses it."""
  return word in RESTRICTED_WORDS


_WORD = r"[^\W\d_]+(?:['’&-][^\W\d_]+)*"   # `M&M's`, `already-stamped`, `Helena’s`
_PHRASE_TOKEN = re.compile(_WORD + r"|[0-9]+|[^\w\s]")


@functools.lru_cache(maxsize=256)
def _problem_words(problem_text: str) -> tuple[frozenset[str], frozenset[str],
                                               frozenset[tuple[str, str]], frozenset[str]]:
  """(the lemmas of the words, the numbers, the phrases: pairs of adjacent tokens as lemmas
  ("" for a number or a mark), the words capitalised inside a sentence: names) of a problem's
  text (one prompt scores many responses)."""
  words, numbers = _words(problem_text)
  tokens = _PHRASE_TOKEN.findall(problem_text)
  lower = [t.lower() for t in tokens]
  lemmas = [_lemma(t) if t[0].isalpha() else "" for t in lower]
  pairs = frozenset(zip(lemmas, lemmas[1:]))
  names = frozenset(t for before, t in zip(["."] + tokens, tokens)
                    if t[0].isupper() and before not in (".", "?", "!", ":"))   # mid-sentence
  return words, numbers, pairs, names


def _words(text: str) -> tuple[frozenset[str], frozenset[str]]:
  """(the lemmas of the words, the numbers without `,`, spelled ones too) of a text."""
  found = re.findall(_WORD, text.lower())
  words = frozenset(_lemma(p) for w in found for p in re.split(r"['’&-]", w) if p)
  numbers = frozenset([n.replace(",", "") for n in _NUMBER.findall(text)]
                      + [NUMBER_WORDS[w] for w in found if w in NUMBER_WORDS])
  return words, numbers


def _in_problem_phrase(words: Sequence[str], at: int,
                       phrases: frozenset[tuple[str, str]]) -> bool:
  """Whether the restricted word `words[at]` stands in a phrase of the problem with a word
  beside it (`girls are not in` for `How many girls are not in the girl scout?`, `\\boxed{75}
  if he sells`) that is no restricted word (`maybe more` twice is no phrase)."""
  left, right = (words[n] if 0 <= n < len(words) and words[n][0].isalpha() else ""
                 for n in (at - 1, at + 1))
  if not (left or right) or _restricted(left) or _restricted(right):
    return False
  word = _lemma(words[at])
  return (bool(left) and (_lemma(left), word) in phrases
          or bool(right) and (word, _lemma(right)) in phrases)


def _sentence_tokens(sentence: str) -> list[str] | None:
  """The tokens of the sentence after a box, lowercase, blanks dropped; None for a character
  outside SENTENCE's alphabet."""
  tokens, pos = [], 0
  while pos < len(sentence):
    token = _SENTENCE_TOKEN.match(sentence, pos)
    if token is None:
      return None
    pos = token.end()
    if not token.group().isspace():
      tokens.append(token.group().lower())
  return tokens


def _sentence_allowed(sentence: str, problem_text: str, working: str) -> bool:
  """Whether what follows a box on its line is SENTENCE: words of the problem (in any of their
  forms) and listed function and unit words; a restricted word only inside a phrase of the
  problem; a number of the problem or the working that counts something else; a dash between
  words; plain punctuation. The working's words are not read: a response could plant a hedge
  there (`12 + 18 = 30 environ.` ... `\\boxed{30} apples environ.`)."""
  tokens = _sentence_tokens(sentence)
  if tokens is None:
    return False
  words, numbers, pairs, _ = _problem_words(problem_text)
  if any(_is_number(t) for t in tokens):
    numbers = numbers | _words(working)[1]
  first_number = next((at for at, t in enumerate(tokens) if _is_number(t)), len(tokens))
  return all(_token_allowed(tokens, at, words, numbers, pairs, first_number)
             for at in range(len(tokens)))


def _token_allowed(tokens: Sequence[str], at: int, words: frozenset[str],
                   numbers: frozenset[str], pairs: frozenset[tuple[str, str]],
                   first_number: int) -> bool:
  """Whether `tokens[at]`, in the sentence after a box, is one that SENTENCE allows
  (`first_number`: where the sentence's first number stands)."""
  token = tokens[at]
  before = tokens[at - 1] if at else ""
  after = tokens[at + 1] if at + 1 < len(tokens) else ""
  if _is_number(token):
    number = NUMBER_WORDS.get(token) or token.lstrip("#").rstrip(".,").replace(",", "")
    return number in numbers and _counts_something_else(tokens, at, first_number)
  if token in "-–":
    return before[:1].isalpha() and after[:1].isalpha()
  if not token[0].isalpha():
    return True   # the listed punctuation
  if _restricted(token):
    counted = not (after[:1].isdigit() or after in NUMBER_WORDS)
    return (token == "times" and not after[:1].isalnum()   # a count: `rang \boxed{22} times.`
            or token == "up" and at > 1 and before not in ("and", "or")   # `to save up`
            and before[0].isalpha() and not _restricted(before)
            or (token in COMPARATIVES or _asked_for(_lemma(token), pairs)) and counted
            and (at == 0 or at == 1 and before[0].isalpha() and not _restricted(before))
            or _in_problem_phrase(tokens, at, pairs))
  return all(p in FUNCTION_WORDS or p in UNIT_WORDS or _lemma(p) in words and not _restricted(p)
             for p in re.split(r"['’&-]", token) if p)


def _is_number(token: str) -> bool:
  return token[0] in "#0123456789" or token in NUMBER_WORDS


def _counts_something_else(tokens: Sequence[str], at: int, first_number: int) -> bool:
  """Whether the number `tokens[at]` in the sentence after a box counts something else: after a
  NUMBER_LEADS word (`in 3 bags`, `horse #12`), after an infinitive's verb (`to fill 170
  balloons`) or after `and` in a list of counts (`for 5 apples and 5 oranges`), and then a
  word. Never right after the box, a unit or a restricted word (`and 31`, `times 2`)."""
  before = tokens[at - 1] if at else ""
  after = tokens[at + 1] if at + 1 < len(tokens) else ""
  if not after[:1].isalpha():
    return False   # `out of 50`, `by 30`: a count of nothing is a second value
  if before in NUMBER_LEADS or tokens[at][0] == "#" and before[:1].isalpha():
    return True
  if before == "and":
    return first_number < at - 1
  return (at >= 2 and tokens[at - 2] == "to" and before.isalpha() and not _restricted(before)
          and before not in FUNCTION_WORDS)


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
  """The sign the box's LEAD gives it ("" or "-"); None when the lead does not end in a link,
  or holds a hedge word outside a phrase of the problem (`Roughly, Tom has \\boxed{30}`)."""
  sign, lead = "", _without_gap(lead)
  if lead[-1:] and lead[-1] in MINUS_SIGNS:
    sign, lead = "-", _without_gap(lead[:-1])
  link = _LINK_END.search(lead)
  if link is None:
    return None
  words, _, pairs, names = _problem_words(problem_text)
  written = _PHRASE_TOKEN.findall(lead)
  tokens = [t.lower() for t in written]
  if any(_lead_hedge(t) and written[at] not in names
         and not _in_problem_phrase(tokens, at, pairs) for at, t in enumerate(tokens)):
    return None   # a hedge word but as the problem's name (`Max`) or phrase
  word = link.group(1)
  if word is not None and not _link_word(word.lower(), tokens[-3:-1], words):
    return None
  return sign


def _lead_hedge(token: str) -> bool:
  """Whether a lowercase token of a box's line hedges or negates it (`roughly`, `doesn't`)."""
  return token in LEAD_HEDGE_WORDS or token.endswith(("n't", "n’t"))


def _link_word(word: str, before: list[str], words: frozenset[str]) -> bool:
  """Whether the last word before a box links it (`is`, `has`, a word of the problem, `of`
  after a noun: `a profit of`), rather than relating it to something else (`about`, `half
  of`, `more than`)."""
  if word == "of":
    noun = before[-1] if before else ""
    return (noun.isalpha() and not _restricted(noun) and noun not in COMPARISON_WORDS
            and (noun in LINK_WORDS or noun not in FUNCTION_WORDS and _lemma(noun) in words))
  return word not in COMPARISON_WORDS and (word in LINK_WORDS or word in FUNCTION_WORDS
                                           or _lemma(word) in words)


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
  values = []
  for _, body_start, body_end in candidates:
    if _MARKER.search(text, body_start, body_end):
      return None   # a candidate inside a candidate
    values.append(_body(_plain(text[body_start:body_end]), problem_text))
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
