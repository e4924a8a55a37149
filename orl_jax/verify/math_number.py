"""What a final answer must be: one number, read the way a grader reads it. The grammar and the
table of classes, with examples and reasons, are in docs/verifier.md ("Math answers: one strict
rule"); `math_answer` finds the span, this module reads it.

`read_number(span)` reads a span as LEAD NUMBER TAIL and returns its one number, or None when
the span is outside the grammar (a grader could read anything else into it):

* **LEAD** (what stands before the number): blanks, formatting, a currency sign or code
  (`$`, `USD`), one sign (`-`, `minus`), and a statement that ends in a link (`=`, `:`, `→`,
  `∴`, `is`) or in any other word but a modifier: a preposition or conjunction of comparison,
  approximation or arithmetic (`north of 30`, `over 30`, `x 30`, `and 30`; `of` after a quantity
  noun, `a total of 30`, and `to`/`by` after a verb of change, `rose to 30`, are links). A word
  glued to the number is refused unless it is a currency code (`ー30`, `x30`; `USD30` reads).
* **NUMBER**: ASCII digits with an optional decimal part, exponent and thousands separators, or
  the digits of one other decimal script (full-width ３０, Arabic-Indic ٣٠, Devanagari ३०).
* **TAIL**: units, words, punctuation, check marks, markdown rules, and restatements of the same
  value after a word (`30. So Tom has 30`, `30 (30 apples)`).
* **Void anywhere in the span**: a second value, a number in another script or spelled out, a
  magnitude (`30k`, `30 mil`, `30 Mio.`, `$30tn`, `30 lac`), a hedge (`or`, `about`, `est.`,
  `and change`, `?`, `~`, `…`), a negation (`not`, `isn't`, `❌`), a retraction (`correction`,
  `wait`), an operator (every math symbol but `=`, the signs and, in the lead, the links; `^`,
  a factorial `30!` or `\\boxed{30}!`, an exponent glued to the number, every LaTeX command but
  formatting, spacing and links), a sign anywhere but before its number, a dash look-alike
  (`─30`, `ー30`, `ㅡ30`), an invisible format character (but the joiners and directional marks of
  Persian and Hebrew text away from the number), private-use and unassigned code points, and a
  combining mark on anything but a letter (a variation selector may follow a symbol: `✔️`).
* **Normalised, and nothing else**: thousands separators in valid groups of three (one kind per
  number: comma, apostrophe `'` `’`, or a space: `1,000`, `1 000`, `1'000`; not `1 00`, `30,5`),
  a trailing `.` or `.0`, currency signs, units after the number (`%`, `°`, words, `m²`), LaTeX
  formatting and spacing (`\\text{}`, `\\,`, `{,}`, `\\$`, `\\(`), special tokens (`<|im_end|>`,
  `</think>`: their names are read as words, so `<not>` negates), and integer-valued scientific
  notation (`3e1`, `3.0e1`; not `3e-1`, exponents beyond ±100).

Every function here accepts any string without raising, in time linear in its length.
"""
from __future__ import annotations

import decimal
import re
import unicodedata

_MAX_EXPONENT = 100
_DIGITS = frozenset("0123456789")
# Dashes (category Pd) but the wave dashes, and the characters named MINUS that are signs rather
# than operators (tests/verify/test_math_answers.py re-derives the set from the Unicode database).
MINUS_SIGNS = frozenset(
    "-\u058a\u05be\u1400\u1806\u2010\u2011\u2012\u2013\u2014\u2015\u2e17\u2e1a\u2e3a\u2e3b"
    "\u2e40\u2e5d\u30a0\ufe31\ufe32\ufe58\ufe63\uff0d\U00010ead"
    "\u2212\u2052\u207b\u208b\u02d7\u2796\u2043")
PLUS_SIGNS = frozenset("+\uff0b\ufe62\u207a\u208a\u2795\u02d6")
SIGNS = MINUS_SIGNS | PLUS_SIGNS
# Characters a reader takes for a minus sign that are neither dashes nor signs: box-drawing and
# scan lines, the katakana long-vowel mark, the Hangul vowel EU, CJK stroke H and radical one,
# the Ogham space mark (a space that is drawn as a line). Refused unless they follow a letter
# (`コーヒー`): `─30`, `ー30` and `ㅡ30` look like -30 and would read +30.
DASH_LOOKALIKES = frozenset(
    "\u2500\u2501\u2504\u2505\u2508\u2509\u254c\u254d\u2550\u2574\u2576\u2578\u257a\u257c"
    "\u257e\u23ba\u23bb\u23bc\u23bd\u30fc\uff70\u3161\uffda\u1173\u1428\u31d0\u2f00\u1680")
# Hedge and operator marks outside category Sm (every Sm character but `=` and the signs is one):
# every question mark, interrobang, tilde and ellipsis (tests/verify/test_math_answers.py surveys
# them by name), the wave dashes, `^`.
_HEDGE_MARKS = frozenset(
    "?¿\u037e\u055e\u061f\u1367\u1945\u2047\u2048\u2049\u2753\u2754\u2cfa\u2cfb\u2e2e"
    "\u2e54\ua60f\ua6f7\ufe16\ufe56\uff1f\U00011143\U0001e95f\U0001fbc4"
    "\u203d\u2e18\U0001f679\U0001f67a\U0001f67b"
    "\u02dc\u02f7\u2368\u236b\u236d\u2371\u2372\u2e1b\u2e1e\u2e1f\u2053"
    "\u1801\u2026\ufe19\u2025\ufe30\u301c\u3030^\uff3e")
# Symbols that negate or hedge what stands beside them: crosses, no-entry signs, thumbs down,
# the no-good gesture, the thinking face and the shrug (`#### 30 ❌`).
_REFUSED_SYMBOLS = frozenset(
    "\u274c\u274e\u2717\u2718\u2715\u2716\u26d4\U0001f5d9\U0001f5f4\U0001f5f6\U0001f6ab"
    "\U0001f44e\U0001f645\U0001f914\U0001f937")
# Invisible characters that Persian, Arabic and Hebrew text needs (the zero-width non-joiner and
# joiner, the directional marks): allowed where they touch no digit, sign or separator.
_TEXT_JOINERS = frozenset("\u200c\u200d\u200e\u200f\u061c")
_VARIATION_SELECTORS = frozenset(
    [chr(c) for c in range(0xfe00, 0xfe10)] + [chr(c) for c in range(0xe0100, 0xe01f0)])
# Exclamation marks: after a number or what closes it they are a factorial (`30!`, `\\boxed{30}!`).
_EXCLAMATIONS = ("!\u00a1\u055c\u07f9\u109f\u1944\u203c\u2755\u2757\u2762\u2763\u2e53"
                 "\uaa77\ufe15\ufe57\uff01\U00016e9a\U0001e95e\U0001f199\U0001f51b")
# What may stand between a sign and its number: `-$30`, `-(30)`, `-\\,30`, `-**30**`.
_SIGN_GAP = frozenset("$([{*_")
# Thousands separators by kind (one kind per number): comma, apostrophe, any space (Zs) but the
# Ogham space mark, which is drawn as a line.
_SPACES = (" \u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
           "\u202f\u205f\u3000")
_SEPARATOR_KIND = {",": ",", "'": "'", "’": "'", "ʼ": "'", "＇": "'",
                   **dict.fromkeys(_SPACES, " ")}
_PUNCTUATION_MAP = str.maketrans({"，": ",", "．": ".", "٫": ".", "٬": ","})
# Links: what may end the statement before a number (`x = 30`, `Total → 30`, `∴ 30`). In the
# lead they read as `=`; anywhere else they are operators like every other math symbol.
LINK_SYMBOLS = "=:\u2192\u21d2\u2234\u27f9\u27f6\u2794\u279c\u27a1\u21e8"
_LINKS_AS_EQUALS = str.maketrans(dict.fromkeys(LINK_SYMBOLS, "="))
_ASCII_LINKS = re.compile(r"->|=>")
_LINK = re.compile("[" + LINK_SYMBOLS + ">]")
_LATEX_LINK = re.compile(
    r"\\(therefore|Rightarrow|Longrightarrow|implies|to|rightarrow|longrightarrow)(?![A-Za-z])")

# A numeral: digit runs joined by single separators or points (validated by `numeral_value`).
# A point right after a letter ends an abbreviation (`Rs.30`, `No.5`), it is no decimal point.
_NUMERAL = re.compile(r"(?:[0-9]+|(?<![^\W\d_])\.[0-9]+)(?:[." + "".join(_SEPARATOR_KIND)
                      + r"][0-9]+)*"
                      r"(?:[eE][-+]?[0-9]+)?")
_WORD = re.compile(r"[^\W\d_]+")
_WORD_AHEAD = re.compile(r"\s*[^\W\d_]")
_RULE_END = re.compile(r"[ \t]*(?:\n|$)")
_COMBINING = frozenset({"Mn", "Mc", "Me"})
_ASIDE = re.compile(r"[,;.]?\s+[(\[]\s*")
_SPECIAL_TOKEN = re.compile(r"<\|[^<>|]{0,40}\|>|</?[A-Za-z_][\w-]{0,20}>")
_LATEX_COMMAND = re.compile(r"\\([A-Za-z]+)")
_LATEX_ANY = re.compile(r"\\[A-Za-z]+|\\.")
# Closing math delimiters read as `$`, so that what follows is still glued to the number
# (`\\(30\\)!` is a factorial) and two formulas never join into one number (`\\(3\\)\\(0\\)`).
_LATEX_SPACING = (("{,}", ","), ("\\,", "\u2009"), ("\\!", ""), ("\\;", " "), ("\\:", " "),
                  ("\\ ", " "), ("\\$", "$"), ("\\%", "%"), ("\\(", " "), ("\\)", "$"),
                  ("\\[", " "), ("\\]", "$"), ("\\{", "{"), ("\\}", "}"), ("\\\\", " "),
                  ("^{\\circ}", "°"), ("^\\circ", "°"))
# A unit's exponent (`m²`, `cm^3`, `\\text{m}^2`): part of the unit, not a second number.
_UNIT_EXPONENT = re.compile(r"(?:(?<=[^\W\d_])|(?<=[^\W\d_]\}))\s*(?:\^\s*\{?\s*[23]\s*\}?|[²³])")
# A factorial (after the number or what closes it: `30!`, `(30)!`, `\\boxed{30}!`, `$30$!`), a
# magnitude suffix (`30k`, `30M`: thousands, millions), an ellipsis.
_POSTFIX = re.compile(r"[0-9][)\]}$*_]*[" + _EXCLAMATIONS + r"]|"
                      r"[0-9](?:k|K|M|B|bn|Bn|mn|mln)(?![^\W\d_])|\.\.\.")
# `isn't`, `up to`, `and up`, `c. 30` (circa), `and change`, `as many as`.
_REFUSED_PHRASE = re.compile(r"[^\W\d_]n['’]t(?![^\W\d_])|\bup\s*to\b|\band\s+up\b|"
                             r"\bc\.\s*[$0-9]|\band\s+change\b|"
                             r"\bas\s+(?:much|many|few|little|high|low|large|small|great|long|"
                             r"far|big|often)\s+as\b", re.IGNORECASE)
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
# LaTeX commands that hedge, negate or compare: refused in the clause before a box too.
HEDGE_LATEX = frozenset({
    "approx", "approxeq", "sim", "simeq", "thicksim", "thickapprox", "backsim", "cong", "pm",
    "mp", "le", "leq", "leqslant", "ge", "geq", "geqslant", "lt", "gt", "ne", "neq", "neg",
    "lnot", "not", "lesssim", "gtrsim", "ll", "gg", "propto", "nless", "ngtr", "cancel",
    "bcancel", "xcancel", "sout", "st"})
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
    "upward", "upwards", "onward", "onwards", "est", "estd", "abt", "appx", "apx", "barely",
    "scarcely", "easily", "alternative", "alternatives", "alternate", "possibility",
    "possibilities"})
NEGATION_WORDS = frozenset({
    "not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "cannot",
    "cant", "isnt", "arent", "wasnt", "werent", "dont", "doesnt", "didnt", "wont", "wouldnt",
    "couldnt", "shouldnt", "without", "except", "excluding", "excluded", "besides", "non",
    "wrong", "incorrect", "false", "untrue", "invalid", "impossible", "nope", "nah", "opposite",
    "reciprocal", "inverse", "negated", "negation", "absolute", "magnitude", "modulus", "hardly"})
# Words that take an answer back: after the answer they say it is not the final one.
RETRACTION_WORDS = frozenset({
    "correction", "corrections", "corrected", "correcting", "mistake", "mistakes", "mistaken",
    "error", "errors", "erroneous", "oops", "typo", "erratum", "errata", "retract", "retracted",
    "retraction", "revised", "revision", "update", "updated", "wait", "scratch", "redo",
    "recalculate", "recalculated", "recalculating", "recheck", "rechecking"})
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
    "crores", "bn", "mn", "mln", "k", "nil", "nought", "naught",
    # magnitudes as written in finance and other languages: `30 mil`, `30 Mio.`, `$30tn`
    "thou", "mil", "mio", "mrd", "bil", "bln", "tn", "trn", "tsd", "lac", "lacs", "cr"})
_REFUSED_WORDS = HEDGE_WORDS | NEGATION_WORDS | NUMBER_WORDS | RETRACTION_WORDS
_CLAUSE_REFUSED_WORDS = HEDGE_WORDS | NEGATION_WORDS | RETRACTION_WORDS
# Words that join two numbers into an expression (`30 x 30`, `30 by 30`): a restatement of the
# answer needs some other word between the two.
_OPERATOR_WORDS = frozenset({"x", "times", "by", "of", "and", "to", "per", "plus", "minus",
                             "over", "divided", "multiplied", "mod", "modulo", "into", "from"})
# Words that, right before a number, relate it to something else rather than state it: the
# prepositions and conjunctions of comparison, approximation and arithmetic (`north of 30`,
# `30 x 30`, `and 30`). A closed class: any other word may end the statement (`Tom has 30`).
MODIFIER_WORDS = frozenset({
    "of", "to", "by", "than", "over", "under", "above", "below", "beyond", "past", "around",
    "round", "about", "near", "within", "between", "among", "amongst", "upwards", "upward",
    "off", "like", "unlike", "vs", "versus", "besides", "except", "without", "into", "up", "down",
    "per", "times", "x", "and", "but", "nor", "or", "from", "toward", "towards", "every", "each",
    "shy", "short", "north", "south", "excess", "less", "more", "fewer"})
# `of` after a quantity noun states the quantity (`a total of 30`, `a cost of $30`).
QUANTITY_NOUNS = frozenset({
    "total", "sum", "value", "cost", "costs", "price", "amount", "balance", "profit", "revenue",
    "income", "loss", "gain", "difference", "result", "answer", "average", "mean", "median",
    "count", "distance", "length", "width", "height", "depth", "area", "perimeter", "volume",
    "weight", "mass", "speed", "age", "score", "rate", "fee", "charge", "salary", "wage",
    "budget", "savings", "debt", "tip", "tax", "bonus", "deposit", "payment", "temperature",
    "time", "duration", "capacity", "population", "size", "product", "quotient", "remainder",
    "earnings", "expense", "expenses", "sales", "tally", "output"})
# `to` and `by` after a verb of change or equality state the result (`comes to 30`, `rose by 30`).
CHANGE_VERBS = frozenset({
    "equal", "equals", "equaled", "equalled", "come", "comes", "came", "amount", "amounts",
    "amounted", "add", "adds", "added", "increase", "increases", "increased", "decrease",
    "decreases", "decreased", "rise", "rises", "rose", "risen", "fall", "falls", "fell", "fallen",
    "drop", "drops", "dropped", "grow", "grows", "grew", "grown", "go", "goes", "went", "gone",
    "change", "changes", "changed", "reduce", "reduces", "reduced", "raise", "raises", "raised",
    "climb", "climbs", "climbed", "jump", "jumps", "jumped", "total", "totals", "totaled",
    "totalled", "sum", "sums", "summed", "set", "sets", "bring", "brings", "brought", "shrink",
    "shrinks", "shrank", "cut", "cuts", "lowered", "lowers"})
# Currency codes that may be glued to a number (`USD30`, `R30`; `US$30` is glued to `$`).
CURRENCY_CODES = frozenset({
    "USD", "EUR", "GBP", "JPY", "CNY", "RMB", "INR", "CAD", "AUD", "NZD", "CHF", "HKD", "SGD",
    "KRW", "MXN", "BRL", "ZAR", "RUB", "SEK", "NOK", "DKK", "PLN", "TRY", "Rs", "rs", "Rp", "R"})


def _plain_text(span: str) -> str | None:
  """The span as plain text: special tokens read as their names' words, LaTeX links made
  symbols, LaTeX spacing and formatting commands made plain, unit exponents dropped, digits of
  one other decimal script made ASCII. None when the span uses another LaTeX command or digits
  of two scripts."""
  if "<" in span:
    span = _SPECIAL_TOKEN.sub(_token_words, span)
  span = span.translate(_PUNCTUATION_MAP)
  if "\\" in span or "{" in span:
    span = _LATEX_LINK.sub(lambda m: "\u2234" if m.group(1) == "therefore" else "\u2192", span)
    for before, after in _LATEX_SPACING:
      span = span.replace(before, after)
  if "^" in span or "²" in span or "³" in span:
    span = _UNIT_EXPONENT.sub(" ", span)
  if "\\" in span:
    if any(name not in LATEX_FORMATTING for name in _LATEX_COMMAND.findall(span)):
      return None
    span = _LATEX_COMMAND.sub(" ", span)
  return _ascii_digits(span)


def _token_words(token: re.Match) -> str:
  """A special token (`<|im_end|>`, `</think>`) as the words of its name: a separator that
  still says what it says (`<not>` is `not`)."""
  return " " + " ".join(_WORD.findall(token.group())) + " "


def _ascii_digits(text: str) -> str | None:
  """`text` with the digits of one non-ASCII decimal script made ASCII; None when digits of two
  scripts meet (`30 (٣٠)`, `３0`)."""
  if text.isascii():
    return text
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
  return set() if text.isascii() else {c for c in set(text) if not c.isascii()}


def _hedge_or_operator(text: str, chars: set[str]) -> bool:
  """Whether `text` (whose non-ASCII characters are `chars`) holds a hedge or operator sign:
  `? ~ < > | ^ …`, or any math symbol (category Sm) but `=` and the signs."""
  if _HEDGE_MARK.search(text):
    return True
  return any(unicodedata.category(c) == "Sm" and c not in SIGNS for c in chars)


def _refused_marks(text: str, chars: set[str]) -> bool:
  """A hedge or operator sign, a postfix operator, a number in another script, a negating
  symbol, a dash look-alike, an invisible format character (but text joiners away from the
  number), a private-use or unassigned code point, or a combining mark on anything but a
  letter (`3̶0`, a struck-out digit): what a reader sees would differ from what is read."""
  if _hedge_or_operator(text, chars) or _POSTFIX.search(text):
    return True
  placed = []   # marks whose meaning depends on what they stand beside
  for char in chars:
    category = unicodedata.category(char)
    if (char.isnumeric() or char in _REFUSED_SYMBOLS or category in ("Co", "Cn", "Cs")
        or category == "Cf" and char not in _TEXT_JOINERS):
      return True
    if (char in _TEXT_JOINERS or char in DASH_LOOKALIKES or category in _COMBINING
        or unicodedata.decomposition(char).startswith(("<super>", "<sub>"))):
      placed.append(char)
  if placed:
    for match in re.finditer("[" + re.escape("".join(placed)) + "]", text):
      if _misplaced(text, match.start()):
        return True
  return False


def _misplaced(text: str, at: int) -> bool:
  """Whether the mark at `at` changes what a reader sees: a text joiner touching a digit, sign
  or separator, a dash look-alike that does not follow a letter, a variation selector on
  anything but an emoji symbol or a letter, an exponent glued to a number, another combining
  mark on anything but a letter."""
  char = text[at]
  if char in _TEXT_JOINERS:
    return any(0 <= i < len(text) and (text[i].isdigit() or text[i] in SIGNS or text[i] in ".,'")
               for i in (at - 1, at + 1))
  if char in DASH_LOOKALIKES:
    return not (at > 0 and text[at - 1].isalpha())
  if _exponent_on_a_number(text, at):
    return True
  if unicodedata.category(char) not in _COMBINING:
    return False
  if char in _VARIATION_SELECTORS and at > 0 and unicodedata.category(text[at - 1]) in ("So",
                                                                                       "Sk"):
    return False   # an emoji's presentation (`✔️`); after a sign or `$` it would hide it
  return not _on_a_letter(text, at)


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


def _sign_words_unless_refused(text: str) -> list[int] | None:
  """Where the sign words of `text` start; None when it holds a hedge, a negation, a
  retraction, a number word or a Roman numeral in Latin letters (`XXXI`)."""
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


def _skip_gap(text: str, end: int) -> int:
  """`end` moved back over blanks, formatting and currency signs (`$`, `(`, `**`)."""
  while end > 0 and (text[end - 1].isspace() or text[end - 1] in _SIGN_GAP
                     or text[end - 1] in "\"'`" or unicodedata.category(text[end - 1]) == "Sc"):
    end -= 1
  return end


def _word_before(text: str, end: int) -> tuple[int, str] | None:
  """(start, lowercase word) of the word that ends at `end`, an abbreviation point allowed
  (`neg.`, `Rs.`); None when no letter stands there. Scans back, so it costs the word only."""
  i = end - 1 if end > 0 and text[end - 1] == "." else end
  start = i
  while start > 0 and text[start - 1].isalpha():
    start -= 1
  return (start, text[start:i]) if start < i else None


def modified_lead(lead: str) -> bool:
  """Whether what stands right before a number (`lead`, ending where the number starts) makes
  it something other than the stated answer: a word glued to it that is no currency code
  (`ー30`, `x30`), or, after any sign, a modifier (`north of 30`, `over 30`, `and 30`; `a total
  of 30` and `rose to 30` are statements), a number, hedge or negation word (`half \\boxed{60}`)
  or a digit (`1\\boxed{0}`). A link (`=`, `:`, `→`) or any other word states the number."""
  if lead and lead[-1].isalpha():
    glued = _word_before(lead, len(lead))
    return glued is None or glued[1] not in CURRENCY_CODES
  end = _skip_gap(lead, len(lead))
  if end and lead[end - 1] in SIGNS:
    end = _skip_gap(lead, end - 1)
  word = _word_before(lead, end)
  if word is not None and word[1].lower() in SIGN_WORDS:
    end = _skip_gap(lead, word[0])
    word = _word_before(lead, end)
  if word is None:
    return end > 0 and lead[end - 1].isdigit()
  lower = word[1].lower()
  if lower in MODIFIER_WORDS:
    before = _word_before(lead, _skip_gap(lead, word[0]))
    head = before[1].lower() if before else ""
    return not (lower == "of" and head in QUANTITY_NOUNS
                or lower in ("to", "by") and head in CHANGE_VERBS)
  return lower in _REFUSED_WORDS


def clause_sign(clause: str) -> str | None:
  """The sign that the clause right before a box gives it ("" for none): `$-\\boxed{30}$` is
  -30. None when the clause hedges, negates or retracts (`approximately \\boxed{30}`, `It is not
  \\boxed{30}`), holds an operator or a refused mark, or ends in a modifier, a number, a number
  word or an operand (`north of \\boxed{30}`, `half \\boxed{60}`, `12 - \\boxed{30}`, `\\times
  \\boxed{30}`). Numbers and number words before the link are the statement's subject (`Half of
  60 is \\boxed{30}`)."""
  if "\\" in clause:
    names = _LATEX_COMMAND.findall(clause)
    if any(name in HEDGE_LATEX for name in names):
      return None
    last = re.search(r"\\([A-Za-z]+)[\s{}$*_([]*$", clause)
    if last is not None and last.group(1) not in LATEX_FORMATTING:
      return None
    clause = _LATEX_ANY.sub(" ", clause)
  if "<" in clause:
    clause = _SPECIAL_TOKEN.sub(_token_words, clause)
  clause = clause.replace("{", " ").replace("}", " ").rstrip(" \t$([*_")
  chars = non_ascii(clause)
  if _refused_marks(clause, chars) or _REFUSED_PHRASE.search(clause):
    return None
  if any(w.lower() in _CLAUSE_REFUSED_WORDS for w in _WORD.findall(clause)):
    return None
  sign = ""
  word = SIGN_WORD_TAIL.search(clause)
  if word is not None:
    sign, clause = word.group(1) + " ", clause[:word.start(1)]
  elif clause[-1:] in SIGNS:
    sign, clause = clause[-1], clause[:-1]
    before = clause.rstrip()[-1:]
    if before and (before.isdigit() or before in ")]}" or before in SIGNS):
      return None
  return None if modified_lead(clause + " ") else sign


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
  hyphen inside a word (`30-year`, `well-known`), a dash set off by spaces (`30 — total`) and a
  markdown rule (`---` ending its line)."""
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
            or len(run) >= 3 and _RULE_END.match(text, match.end())):
      return True   # `30 -`: a dash that sets off nothing
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
  """The one number of a final-answer span, exactly; None when the span is outside the grammar
  (module docstring): no number, two values, a number in another script, a sign or negation it
  cannot be read with, a modifier before it, a hedge, an operator, or a number that is not
  readable."""
  text = _plain_text(span)
  if text is None:
    return None
  numerals = list(_NUMERAL.finditer(text))
  if not numerals:
    return None
  lead_end = numerals[0].start()
  if _LINK.search(text, 0, lead_end):   # links read as `=` in the lead (lengths kept)
    lead = _ASCII_LINKS.sub("= ", text[:lead_end]).translate(_LINKS_AS_EQUALS)
    text = lead + text[lead_end:]
  if _refused_marks(text, non_ascii(text)):
    return None
  sign_words = _sign_words_unless_refused(text)
  if sign_words is None or not _restated(text, numerals):
    return None
  values: list[decimal.Decimal] = []
  used_signs: set[int] = set()   # where the numbers' own sign characters are
  used_words: list[int | None] = []
  previous_end = 0
  for numeral in numerals:
    value, sign = _numeral_value(numeral.group()), _sign_before(text, numeral.start())
    if value is None or sign is None or modified_lead(text[previous_end:numeral.start()]):
      return None
    previous_end = numeral.end()
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
