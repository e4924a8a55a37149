"""What a final answer must be (DESIGN §2.4): one number, read the way a grader reads it.

`read_number(span)` reads the text of a final-answer span (`math_answer` finds the span) and
returns its one number, or None when a grader could read anything else into it. The classes,
with examples and the reasons, are tabled in docs/verifier.md; in short:

* **One value.** A number is ASCII digits with an optional decimal part, exponent and thousands
  separators. The same value may be restated after words or in parentheses (`30. So Tom has
  30`, `30 (30 apples)`); any other value, a number in another script (CJK 三十, circled ㉚,
  Roman Ⅻ or `XXXI`, superscripts, vulgar fractions), a spelled-out number (`thirty`, `twice`,
  `squared`) or a magnitude suffix (`30k`) is a second number. A span written in one other
  decimal script (full-width ３０, Arabic-Indic ٣٠, Devanagari ३०) is read as that number.
* **Signs.** Every dash (category Pd) but the tilde-like wave dashes and every sign named MINUS
  is a minus sign, as are `minus`, `negative`, `neg.` right before the number; `plus`,
  `positive` and the plus signs likewise. A sign anywhere else (`30-`, `x-30`, `- -30`, `minus`
  after the number) and every negation (`not`, `no`, `never`, `isn't`, `except`, `without`,
  `wrong`, ...) make the span unreadable; a hyphen inside a word and a dash set off by spaces
  before words after the number are punctuation.
* **Hedges and operators.** Hedge words (`or`, `about`, `approximately`, `between`, `at least`,
  `than`, `ish`, `rounded`, ...), every math symbol (category Sm: `≈ ~ < ≥ ± × √ ∞ |`, ...) but
  `=` and the signs, every question mark, tilde and ellipsis, `^`, a factorial (`30!`), an
  exponent glued to the number (`30ⁿ`), every LaTeX command but formatting and spacing
  (`\\frac`, `\\sqrt`, `\\approx`, `\\times`), invisible format characters (Cf) and
  combining marks on anything but letters make the span unreadable.
* **Normalised, and nothing else**: thousands separators in valid groups of three (one kind per
  number: comma, apostrophe `'` `’`, or any space: `1,000`, `1 000`, `1'000`; not `1 00`,
  `30,5`), a trailing `.` or `.0`, currency signs, units after the number (`%`, `°`, words,
  `m²`), LaTeX formatting and spacing (`\\text{}`, `\\,`, `{,}`, `\\$`, `\\(`), and
  integer-valued scientific notation (`3e1`, `3.0e1`; not `3e-1`, exponents beyond ±100).

Every function here accepts any string without raising, in time linear in its length.
"""
from __future__ import annotations

import decimal
import re
import unicodedata

_MAX_EXPONENT = 100
_DIGITS = frozenset("0123456789")
# Dashes (category Pd) but the wave dashes, and the characters named MINUS that are signs rather
# than operators (tests/test_math_answers.py re-derives the set from the Unicode database).
MINUS_SIGNS = frozenset(
    "-\u058a\u05be\u1400\u1806\u2010\u2011\u2012\u2013\u2014\u2015\u2e17\u2e1a\u2e3a\u2e3b"
    "\u2e40\u2e5d\u30a0\ufe31\ufe32\ufe58\ufe63\uff0d\U00010ead"
    "\u2212\u2052\u207b\u208b\u02d7\u2796\u2043")
PLUS_SIGNS = frozenset("+\uff0b\ufe62\u207a\u208a\u2795\u02d6")
SIGNS = MINUS_SIGNS | PLUS_SIGNS
# Hedge and operator marks outside category Sm (every Sm character but `=` and the signs is one):
# every question mark, interrobang, tilde and ellipsis (tests/test_math_answers.py surveys them
# by name), the wave dashes, `^`.
_HEDGE_MARKS = frozenset(
    "?¿\u037e\u055e\u061f\u1367\u1945\u2047\u2048\u2049\u2753\u2754\u2cfa\u2cfb\u2e2e"
    "\u2e54\ua60f\ua6f7\ufe16\ufe56\uff1f\U00011143\U0001e95f\U0001fbc4"
    "\u203d\u2e18\U0001f679\U0001f67a\U0001f67b"
    "\u02dc\u02f7\u2368\u236b\u236d\u2371\u2372\u2e1b\u2e1e\u2e1f\u2053"
    "\u1801\u2026\ufe19\u2025\ufe30\u301c\u3030^\uff3e")
# Exclamation marks: glued to a number they are a factorial (`30!`).
_EXCLAMATIONS = ("!\u00a1\u055c\u07f9\u109f\u1944\u203c\u2755\u2757\u2762\u2763\u2e53"
                 "\uaa77\ufe15\ufe57\uff01\U00016e9a\U0001e95e\U0001f199\U0001f51b")
# What may stand between a sign and its number: `-$30`, `-(30)`, `-\\,30`, `-**30**`.
_SIGN_GAP = frozenset("$([{*_")
# Thousands separators by kind (one kind per number): comma, apostrophe, any space (Zs).
_SPACES = (" \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
           "\u202f\u205f\u3000")
_SEPARATOR_KIND = {",": ",", "'": "'", "’": "'", "ʼ": "'", "＇": "'",
                   **dict.fromkeys(_SPACES, " ")}
_PUNCTUATION_MAP = str.maketrans({"，": ",", "．": ".", "٫": ".", "٬": ","})

# A numeral: digit runs joined by single separators or points (validated by `numeral_value`).
_NUMERAL = re.compile(r"(?:[0-9]+|\.[0-9]+)(?:[." + "".join(_SEPARATOR_KIND) + r"][0-9]+)*"
                      r"(?:[eE][-+]?[0-9]+)?")
_WORD = re.compile(r"[^\W\d_]+")
_WORD_AHEAD = re.compile(r"\s*[^\W\d_]")
_COMBINING = frozenset({"Mn", "Mc", "Me"})
_ASIDE = re.compile(r"[,;.]?\s+[(\[]\s*")
_SPECIAL_TOKEN = re.compile(r"<\|[^<>|]{0,40}\|>|</?[A-Za-z_][\w-]{0,20}>")
_LATEX_COMMAND = re.compile(r"\\([A-Za-z]+)")
_LATEX_SPACING = (("{,}", ","), ("\\,", "\u2009"), ("\\!", ""), ("\\;", " "), ("\\:", " "),
                  ("\\ ", " "), ("\\$", "$"), ("\\%", "%"), ("\\(", " "), ("\\)", " "),
                  ("\\[", " "), ("\\]", " "), ("\\{", "{"), ("\\}", "}"), ("\\\\", " "),
                  ("^{\\circ}", "°"), ("^\\circ", "°"))
# A unit's exponent (`m²`, `cm^3`, `\\text{m}^2`): part of the unit, not a second number.
_UNIT_EXPONENT = re.compile(r"(?:(?<=[^\W\d_])|(?<=[^\W\d_]\}))\s*(?:\^\s*\{?\s*[23]\s*\}?|[²³])")
# A factorial, a magnitude suffix (`30k`, `30M`: thousands, millions), an ellipsis.
_POSTFIX = re.compile(r"[0-9][)\]}]*[" + _EXCLAMATIONS + r"]|"
                      r"[0-9](?:k|K|M|B|bn|Bn|mn|mln)(?![^\W\d_])|\.\.\.")
# `isn't`, `up to`, `and up`, `c. 30` (circa).
_REFUSED_PHRASE = re.compile(r"[^\W\d_]n['’]t(?![^\W\d_])|\bup\s*to\b|\band\s+up\b|"
                             r"\bc\.\s*[$0-9]", re.IGNORECASE)
_ROMAN = re.compile(r"M{0,3}(?:CM|CD|D?C{0,3})(?:XC|XL|L?X{0,3})(?:IX|IV|V?I{0,3})")
_SIGN_RUN = re.compile("[" + re.escape("".join(sorted(SIGNS))) + "]+")
_HEDGE_MARK = re.compile("[" + re.escape("".join(sorted(_HEDGE_MARKS))) + "<>|~]")
SIGN_WORD_TAIL = re.compile(r"(?<![^\W\d_])(minus|negative|neg|plus|positive)\.?\s*$",
                             re.IGNORECASE)

# LaTeX commands that only format or space (`\\text{30}` is 30); every other command is refused.
LATEX_FORMATTING = frozenset({
    "text", "textbf", "textit", "textrm", "textsf", "texttt", "textnormal", "textup", "mathrm",
    "mathbf", "mathit", "mathsf", "mathtt", "mathnormal", "mbox", "hbox", "emph", "boxed",
    "fbox", "bm", "boldsymbol", "underline", "displaystyle", "textstyle", "left", "right", "big",
    "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "quad", "qquad", "enspace",
    "thinspace", "space", "circ", "degree", "textdegree", "dollar", "textdollar", "euro",
    "pounds", "yen", "cent", "percent", "textpercent", "large", "Large", "LARGE", "huge", "Huge",
    "small", "normalsize", "color", "textcolor", "ensuremath", "rm", "bf", "it"})
SIGN_WORDS = {"minus": -1, "negative": -1, "neg": -1, "plus": 1, "positive": 1}
HEDGE_WORDS = frozenset({
    "or", "either", "maybe", "perhaps", "possibly", "possible", "probably", "probable", "likely",
    "unlikely", "about", "around", "approximately", "approximate", "approx", "approximation",
    "roughly", "nearly", "almost", "close", "near", "nearest", "between", "circa", "ca",
    "estimate", "estimated", "estimation", "guess", "ish", "odd", "some", "something",
    "somewhere", "several", "few", "couple", "range", "ranging", "rounded", "rounding", "round",
    "over", "under", "above", "below", "beyond", "exceed", "exceeds", "exceeding", "least", "most",
    "max", "maximum", "minimum", "than", "less", "fewer", "greater", "upto", "within",
    "might", "may", "could", "unsure", "uncertain", "unknown", "unclear", "undefined",
    "indeterminate", "infinity", "infinite", "inf", "nan", "if", "unless", "assuming", "depends",
    "depending", "whether", "else", "otherwise", "alternatively", "instead", "rather", "lower",
    "upper", "bound", "ballpark", "tops", "thereabouts", "higher", "larger", "bigger", "smaller",
    "upward", "upwards", "onward", "onwards"})
NEGATION_WORDS = frozenset({
    "not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "cannot",
    "cant", "isnt", "arent", "wasnt", "werent", "dont", "doesnt", "didnt", "wont", "wouldnt",
    "couldnt", "shouldnt", "without", "except", "excluding", "excluded", "besides", "non",
    "wrong", "incorrect", "false", "untrue", "invalid", "impossible", "nope", "nah", "opposite",
    "reciprocal", "inverse", "negated", "negation", "absolute", "magnitude", "modulus"})
NUMBER_WORDS = frozenset({
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    "hundred", "thousand", "million", "billion", "trillion", "hundreds", "thousands", "millions",
    "billions", "trillions", "zillion", "dozen", "dozens", "half", "halves", "twice", "thrice",
    "third", "thirds", "quarter", "quarters", "fourth", "fifth", "sixth", "seventh", "eighth",
    "ninth", "tenth", "eleventh", "twelfth", "twentieth", "thirtieth", "fortieth", "fiftieth",
    "hundredth", "thousandth", "millionth", "doubled", "tripled", "quadrupled", "halved",
    "squared", "cubed", "factorial", "sqrt", "root", "power", "grand", "lakh", "lakhs", "crore",
    "crores", "bn", "mn", "mln", "k", "nil", "nought", "naught"})
_REFUSED_WORDS = HEDGE_WORDS | NEGATION_WORDS | NUMBER_WORDS
# Words that join two numbers into an expression (`30 x 30`, `30 by 30`): a restatement of the
# answer needs some other word between the two.
_OPERATOR_WORDS = frozenset({"x", "times", "by", "of", "and", "to", "per", "plus", "minus",
                             "over", "divided", "multiplied", "mod", "modulo", "into", "from"})


def _plain_text(span: str) -> str | None:
  """The span as plain text: special tokens dropped, LaTeX spacing and formatting commands made
  plain, unit exponents dropped, digits of one other decimal script made ASCII. None when the
  span uses another LaTeX command or digits of two scripts."""
  span = _SPECIAL_TOKEN.sub(" ", span).translate(_PUNCTUATION_MAP)
  for before, after in _LATEX_SPACING:
    span = span.replace(before, after)
  span = _UNIT_EXPONENT.sub(" ", span)
  if any(name not in LATEX_FORMATTING for name in _LATEX_COMMAND.findall(span)):
    return None
  span = _LATEX_COMMAND.sub(" ", span)
  return _ascii_digits(span)


def _ascii_digits(text: str) -> str | None:
  """`text` with the digits of one non-ASCII decimal script made ASCII; None when digits of two
  scripts meet (`30 (٣٠)`, `３0`)."""
  zeros, table = set(), {}
  if re.search(r"[0-9]", text):
    zeros.add(ord("0"))
  for char in non_ascii(text):
    if char.isdecimal():
      digit = unicodedata.decimal(char)
      zeros.add(ord(char) - digit)
      table[ord(char)] = str(digit)
  if len(zeros) > 1:
    return None
  return text.translate(table) if table else text


def non_ascii(text: str) -> set[str]:
  """The distinct non-ASCII characters of `text`."""
  return {c for c in set(text) if not c.isascii()}


def _hedge_or_operator(text: str) -> bool:
  """Whether `text` holds a hedge or operator sign: `? ~ < > | ^ …`, or any math symbol
  (category Sm) but `=` and the signs."""
  if _HEDGE_MARK.search(text):
    return True
  return any(unicodedata.category(c) == "Sm" and c not in SIGNS for c in non_ascii(text))


def _refused_marks(text: str) -> bool:
  """A hedge or operator sign, a postfix operator, a number in another script, an invisible
  format character, or a combining mark on anything but a letter (`3̶0`, a struck-out digit):
  what a reader sees would differ from what is read."""
  if _hedge_or_operator(text) or _POSTFIX.search(text):
    return True
  placed = []   # marks whose meaning depends on what they are glued to
  for char in non_ascii(text):
    category = unicodedata.category(char)
    if char.isnumeric() or category == "Cf":
      return True
    if category in _COMBINING or unicodedata.decomposition(char).startswith(("<super>", "<sub>")):
      placed.append(char)
  if placed:
    for match in re.finditer("[" + re.escape("".join(placed)) + "]", text):
      at = match.start()
      if _exponent_on_a_number(text, at) or (unicodedata.category(match.group()) in _COMBINING
                                             and not _on_a_letter(text, at)):
        return True
  return False


def _exponent_on_a_number(text: str, at: int) -> bool:
  """Whether a superscript or subscript (`30ⁿ`, `30ˣ`, `(30)ₖ`) is glued to a number; the
  ordinal indicators and trade marks (`º ª ™ ℠`) are not exponents."""
  if at == 0 or text[at] in "ºª™℠":
    return False
  return (unicodedata.decomposition(text[at]).startswith(("<super>", "<sub>"))
          and (text[at - 1].isdigit() or text[at - 1] in ")]}"))


def _on_a_letter(text: str, at: int) -> bool:
  """Whether the combining mark at `at` sits on a letter (after any other marks on it)."""
  i = at - 1
  while i >= 0 and unicodedata.category(text[i]) in _COMBINING and at - i < 16:
    i -= 1
  return i >= 0 and text[i].isalpha()


def hedges_or_negates(text: str) -> bool:
  """Whether `text` holds a hedge, negation, number or sign word, or a hedge or operator sign:
  what may not stand in the clause right before a boxed answer (`approximately \\boxed{30}`)."""
  return _hedge_or_operator(text) or _sign_words_unless_refused(text) != []


def _sign_words_unless_refused(text: str) -> list[int] | None:
  """Where the sign words of `text` start; None when it holds a hedge, a negation, a number
  word or a Roman numeral in Latin letters (`XXXI`)."""
  if _REFUSED_PHRASE.search(text):
    return None
  sign_words = []
  for match in _WORD.finditer(text):
    word = match.group()
    lower = word.lower()
    if lower in _REFUSED_WORDS or len(word) > 1 and word.isupper() and _ROMAN.fullmatch(word):
      return None
    if lower in SIGN_WORDS:
      sign_words.append(match.start())
  return sign_words


def _numeral_value(numeral: str) -> decimal.Decimal | None:
  """The exact value of one `_NUMERAL` match; None for invalid thousands groups (`30,5`, `1 00`,
  `1,000 000`), two decimal points, or an exponent that is too large or gives a fraction."""
  mantissa, exponent = numeral, None
  for mark in "eE":
    if mark in numeral:
      mantissa, exponent = numeral.split(mark)
  integer, _, fraction = mantissa.partition(".")
  if "." in fraction or not fraction.isdigit() and fraction:
    return None
  separators = set(integer) - _DIGITS
  if separators:
    if len({_SEPARATOR_KIND[c] for c in separators}) > 1:
      return None
    groups = re.split("[" + re.escape("".join(separators)) + "]", integer)
    if not 1 <= len(groups[0]) <= 3 or any(len(g) != 3 for g in groups[1:]):
      return None
    integer = "".join(groups)
  if exponent is not None and (len(exponent.lstrip("+-")) > 3
                               or abs(int(exponent)) > _MAX_EXPONENT):
    return None
  value = decimal.Decimal(f"{integer or '0'}.{fraction or '0'}e{exponent or 0}")
  if exponent is not None and not _is_integral(value):
    return None
  return value


def _is_integral(value: decimal.Decimal) -> bool:
  _, digits, exponent = value.as_tuple()
  assert isinstance(exponent, int), "a finite number (read from digits)"
  return exponent >= 0 or not any(digits[exponent:])


def _sign_before(text: str, start: int) -> tuple[int, int | None, int | None] | None:
  """(sign, where a sign character is, where a sign word starts) of the number at `start`; None
  when what stands before it is an operator or a second sign (`x-30`, `30 - 30`, `--30`)."""
  i = start
  while i > 0 and (text[i - 1].isspace() or text[i - 1] in _SIGN_GAP
                   or unicodedata.category(text[i - 1]) == "Sc"):
    i -= 1
  if i > 0 and text[i - 1] in SIGNS:
    at = i - 1
    glued = text[at - 1] if at > 0 else " "
    if glued.isalnum() or glued in "._" or glued in SIGNS:
      return None
    k = at
    while k > 0 and text[k - 1].isspace():
      k -= 1
    if k > 0 and (text[k - 1].isdigit() or text[k - 1] in ")]}" or text[k - 1] in SIGNS):
      return None
    return (-1 if text[at] in MINUS_SIGNS else 1), at, None
  low = max(0, i - 12)
  word = SIGN_WORD_TAIL.search(text[low:i])
  if word is None:
    return 1, None, None
  return SIGN_WORDS[word.group(1).lower()], None, low + word.start(1)


def _stray_signs(text: str, used: set[int]) -> bool:
  """Whether a sign that is no number's own stands where it changes the reading. Allowed: a
  hyphen inside a word (`30-year`, `well-known`) and a dash set off by spaces (`30 — total`)."""
  for match in _SIGN_RUN.finditer(text):
    run = match.group()
    if len(run) == 1 and match.start() in used:
      continue
    if any(c in PLUS_SIGNS for c in run):
      return True   # `30+`, `30 + 1`: a plus is only ever a number's sign
    before = text[match.start() - 1] if match.start() > 0 else " "
    after = text[match.end()] if match.end() < len(text) else " "
    if len(run) == 1 and before.isalnum() and after.isalpha():
      continue
    if not (before.isspace() and after.isspace()):
      return True
    if not (_WORD_AHEAD.match(text, match.end())
            or len(run) >= 3 and text.startswith("\n", match.end())):
      return True   # `30 -`: a dash that sets off nothing; `---` is a markdown rule
  return False


def _restated(text: str, numerals: list[re.Match]) -> bool:
  """Whether every number after the first is a restatement of it: some word that is not an
  operator stands between each pair, or a parenthesis set off by a space (`30. So Tom has 30`,
  `30 (30 apples)`; not `30 x 30`, `30(30)`, `30 = 30`)."""
  for left, right in zip(numerals, numerals[1:]):
    words = [w.lower() for w in _WORD.findall(text, left.end(), right.start())]
    if not (any(w not in _OPERATOR_WORDS for w in words)
            or _ASIDE.fullmatch(text, left.end(), right.start())):
      return False
  return True


def read_number(span: str) -> decimal.Decimal | None:
  """The one number of a final-answer span, exactly; None when the span holds no number, two
  values, a number in another script, a sign or negation it cannot be read with, a hedge, an
  operator, or a number that is not readable (module docstring)."""
  text = _plain_text(span)
  if text is None:
    return None
  sign_words = None if _refused_marks(text) else _sign_words_unless_refused(text)
  if sign_words is None:
    return None
  numerals = list(_NUMERAL.finditer(text))
  if not numerals or not _restated(text, numerals):
    return None
  values: list[decimal.Decimal] = []
  used_signs: set[int] = set()   # where the numbers' own sign characters are
  used_words: list[int | None] = []
  for numeral in numerals:
    value, sign = _numeral_value(numeral.group()), _sign_before(text, numeral.start())
    if value is None or sign is None:
      return None
    factor, sign_at, word_at = sign
    if sign_at is not None:   # a number without a sign character
      used_signs.add(sign_at)
    used_words.append(word_at)
    values.append(value if factor > 0 else value.copy_negate())   # exact, any length
    exponent_sign = re.search(r"[eE]([-+])", numeral.group())
    if exponent_sign:
      used_signs.add(numeral.start() + exponent_sign.start(1))
  if any(v != values[0] for v in values) or _stray_signs(text, used_signs):
    return None
  if sorted(w for w in used_words if w is not None) != sign_words:
    return None   # `30 minus`, `minus -30`: a sign word that is no number's sign
  return values[0]
