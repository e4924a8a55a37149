"""The strict final-answer rule of the math rewards (docs/verifier.md), case by case, beside the
extractors users know.

Each row records our verdict and what three reference graders give on the same response:
* `strict`: lm-evaluation-harness GSM8K `strict-match` (regex `#### (\\-?[0-9\\.\\,]+)`, first
  match, then `exact_match` ignoring case, `,`, `$`, everything up to `#### ` and a final `.`);
* `flex`: its `flexible-extract` (regex `(-?[$0-9.,]{2,})|(-?[0-9]+)`, last match, same match);
  both after cutting the generation at `Question:` as its `until` list does;
* `minerva`: the Minerva/MATH normaliser (Lewkowycz et al. 2022, appendix D) on the last
  `\\boxed{}`, compared as strings (lm-evaluation-harness then also tries sympy's LaTeX parser,
  which needs antlr4; no row here depends on it).
The references are written here from their published regexes and normaliser, so that the table
shows where the strict rule differs from them and why (see the `why` of each row).
"""
import decimal
import re
import unicodedata

import pytest

from orl_jax.problem import Problem
from orl_jax.verify import math_answer, math_number
from orl_jax.verify.math_answer import canonical_number
from orl_jax.verify.gsm8k import GSM8KVerifier
from orl_jax.verify.tiny import TinyVerifier

# --------------------------------------------------------------------------- reference graders

_LM_EVAL_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


def _lm_eval_exact_match(prediction: str, gold: str) -> bool:
  for pattern in _LM_EVAL_IGNORE:
    prediction, gold = re.sub(pattern, "", prediction), re.sub(pattern, "", gold)
  return prediction.lower() == gold.lower()


def _lm_eval_generation(response: str) -> str:
  return response.split("Question:")[0]   # GSM8K's `until` stop sequence


def lm_eval_strict(response: str, gold: str) -> int:
  found = re.findall(r"#### (\-?[0-9\.\,]+)", _lm_eval_generation(response))
  return int(_lm_eval_exact_match(found[0].strip() if found else "[invalid]", gold))


def lm_eval_flexible(response: str, gold: str) -> int:
  found = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", _lm_eval_generation(response))
  prediction = next(g for g in found[-1] if g).strip() if found else "[invalid]"
  return int(_lm_eval_exact_match(prediction, gold))


def _last_boxed(text: str) -> str | None:
  start = text.rfind("\\boxed")
  if start < 0:
    return None
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        inside = text[start:i + 1]
        return inside[len("\\boxed{"):-1] if inside.startswith("\\boxed{") else None
  return None


_MINERVA_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""),
                          (" ", ""), ("mbox", "text"), (",\\text{and}", ","),
                          ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_MINERVA_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "ft", "hours",
                    "km", "units", "\\ldots", "sue", "points", "feet", "minutes", "digits",
                    "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
                    "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}",
                    "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
                    r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots")


def minerva_normalize(answer: str) -> str:
  answer = answer.split("=")[-1]
  for before, after in _MINERVA_SUBSTITUTIONS:
    answer = answer.replace(before, after)
  for removed in _MINERVA_REMOVED:
    answer = answer.replace(removed, "")
  answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
  for wrapper in ("text", "textbf", "overline"):
    answer = re.sub(r"(\\" + wrapper + r"\{)(.*?)(\})", "\\2", answer)
  answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
  answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
  answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
  answer = answer.replace("$", "")
  if answer.replace(",", "").isdigit():
    answer = answer.replace(",", "")
  return answer


def minerva(response: str, gold: str) -> int:
  boxed = _last_boxed(response)
  return int(boxed is not None and minerva_normalize(boxed) == minerva_normalize(gold))


# --------------------------------------------------------------------------- the table

# (response, gold, ours, strict, flex, minerva, why ours differs where it does)
TABLE = [
    # honest answers
    ("15 + 15 = 30\n#### 30", "30", 1, 1, 1, 0, "GSM8K format"),
    ("#### 30.", "30", 1, 1, 1, 0, "trailing period"),
    ("#### 30.0", "30", 1, 0, 0, 0, "numeric match: 30.0 == 30"),
    ("#### 30.00 dollars", "30", 1, 0, 0, 0, "numeric match, unit after the number"),
    ("#### $30", "30", 1, 0, 1, 0, "currency sign before the number"),
    ("#### 1,230", "1230", 1, 1, 1, 0, "thousands separator"),
    ("#### 30 dollars", "30", 1, 1, 1, 0, "unit after the number"),
    ("#### 50%", "50", 1, 1, 1, 0, "percent is a unit"),
    ("#### 30 hmm.", "30", 1, 1, 1, 0, "words that are neither numbers nor hedges may follow"),
    ("####30", "30", 1, 0, 1, 0, "no space after the marker"),
    ("#### -5", "-5", 1, 1, 1, 0, "negative"),
    ("#### −5", "-5", 1, 0, 0, 0, "unicode minus sign"),
    ("#### -$5", "-5", 1, 0, 1, 0, "sign before the currency sign"),
    ("#### 3e1", "30", 1, 0, 0, 0, "integer-valued scientific notation"),
    ("#### 1e3", "1000", 1, 0, 0, 0, "integer-valued scientific notation"),
    ("#### 30<|im_end|>", "30", 1, 1, 1, 0, "a special token left by the detokenizer"),
    ("The answer is \\boxed{30}.", "30", 1, 0, 1, 1, "the last \\boxed{} is a marker"),
    ("\\boxed{\\$30}", "30", 1, 0, 1, 1, "LaTeX currency sign"),
    ("\\boxed{1{,}230}", "1230", 1, 0, 0, 1, "LaTeX thousands separator"),
    ("\\boxed{30 \\text{ dollars}}", "30", 1, 0, 1, 1, "LaTeX unit"),
    ("12 + 18 = 30\n#### 30\n\nQuestion: Tom has 4 apples and 9 pears.", "30", 1, 1, 1, 0,
     "the invented next few-shot question is cut, as lm-eval's `until` does"),
    ("#### 31\nWait, 12 + 18 = 30.\n#### 30", "30", 1, 0, 1, 0,
     "the last marker wins (lm-eval strict takes the first)"),
    # hedges, several numbers, no marker
    ("I think #### 30 hmm.\nFinal answer: #### thirty-one", "30", 0, 1, 1, 0,
     "the last marker holds no digits: no fall-back to an earlier number"),
    ("#### 30 or 31 or 29", "30", 0, 1, 0, 0, "hedge"),
    ("#### 29 or 30", "30", 0, 0, 1, 0, "hedge"),
    ("It is 29, 31 or 30.\n####", "30", 0, 0, 1, 0, "nothing after the marker"),
    ("\\boxed{29, 30}", "30", 0, 0, 1, 0, "a list in the box"),
    ("\\boxed{31 \\text{ or } 30}", "30", 0, 0, 1, 0, "hedge in the box"),
    ("\\boxed{30} or \\boxed{31}", "30", 0, 0, 0, 0, "the last box is 31"),
    ("\\boxed{30} or maybe 31", "30", 0, 0, 0, 1, "a number and a hedge after the box"),
    ("#### 30,5", "30", 0, 0, 0, 0, "not a valid thousands separator"),
    ("#### 30–31", "30", 0, 1, 0, 0, "a range"),
    ("#### 30-31", "30", 0, 1, 0, 0, "a range"),
    ("#### 30 (thirty-one)", "30", 0, 1, 1, 0, "a spelled-out second number"),
    ("#### ~30", "30", 0, 0, 1, 0, "approximately"),
    ("#### about 30", "30", 0, 0, 1, 0, "approximately"),
    ("#### 30?", "30", 0, 1, 1, 0, "a question, not an answer"),
    ("\\boxed{\\approx 30}", "30", 0, 0, 1, 0, "approximately"),
    ("#### 30\nActually it is 31.", "30", 0, 1, 0, 0, "a second number after the answer"),
    ("#### 30\n#### 31", "30", 0, 1, 0, 0, "the last marker is 31"),
    ("#### 30 + 1 = 31", "30", 0, 1, 0, 0, "several numbers"),
    ("#### 1 230", "1230", 1, 0, 0, 0, "a space groups thousands"),
    ("The answer is 30.", "30", 0, 0, 1, 0, "no marker"),
    ("30", "30", 0, 0, 1, 0, "no marker"),
    ("#### 3e-1", "0.3", 0, 0, 0, 0, "scientific notation that is not an integer"),
    ("#### 30.5", "30", 0, 0, 0, 0, "wrong"),
    ("", "30", 0, 0, 0, 0, "empty"),
    # issue 38: signs and negations, postfix operators, numbers in other scripts, spaced and
    # apostrophe thousands separators, markers inside code, stray markers, restated questions
('#### −30', '30', 0, 0, 1, 0,
     'a Unicode minus sign: −30 is not 30'),
    ('#### －30', '30', 0, 0, 1, 0,
     'a full-width minus sign'),
    ('#### ﹣30', '30', 0, 0, 1, 0,
     'a small minus sign'),
    ('#### ‒30', '30', 0, 0, 1, 0,
     'a figure dash reads as a minus sign'),
    ('#### —30', '30', 0, 0, 1, 0,
     'an em dash reads as a minus sign'),
    ('#### −30', '-30', 1, 0, 0, 0,
     'a Unicode minus sign is a sign'),
    ('#### minus 30', '30', 0, 0, 1, 0,
     'a sign word'),
    ('#### minus 30', '-30', 1, 0, 0, 0,
     'a sign word right before the number is its sign'),
    ('#### negative 30', '30', 0, 0, 1, 0,
     'a sign word'),
    ('#### not 30', '30', 0, 0, 1, 0,
     'a negation'),
    ('#### 30 is not the answer', '30', 0, 1, 1, 0,
     'a negation after the number'),
    ('#### -\\,30', '30', 0, 0, 1, 0,
     'a sign, LaTeX thin space, the number'),
    ('The answer is $-\\boxed{30}$.', '30', 0, 0, 0, 1,
     'a sign written before the box'),
    ('The answer is $-\\boxed{30}$.', '-30', 1, 0, 0, 0,
     'a sign written before the box'),
    ('#### - -30', '-30', 0, 0, 1, 0,
     'two signs'),
    ('#### 30²', '30', 0, 1, 1, 0,
     'a postfix operator (superscript two)'),
    ('#### 30!', '30', 0, 1, 1, 0,
     'a postfix operator (factorial)'),
    ('#### 30^2', '30', 0, 1, 0, 0,
     'a postfix operator'),
    ('#### 30e2', '30', 0, 1, 0, 0,
     '30e2 is 3000'),
    ('#### 30 or 三十', '30', 0, 1, 1, 0,
     'a hedge, second number in CJK numerals'),
    ('#### 30 (or ㉛)', '30', 0, 1, 1, 0,
     'a hedge, second number circled'),
    ('#### 30 Ⅻ', '30', 0, 1, 1, 0,
     'a second number in Roman numerals'),
    ('#### 30 (XXXI)', '30', 0, 1, 1, 0,
     'a Roman numeral in Latin letters'),
    ('#### 30½', '30', 0, 1, 1, 0,
     'a vulgar fraction'),
    ('#### 30 (٣١)', '30', 0, 1, 1, 0,
     'digits of two scripts'),
    ('#### ３０', '30', 1, 0, 0, 0,
     'full-width digits, one script'),
    ('#### ٣٠', '30', 1, 0, 0, 0,
     'Arabic-Indic digits, one script'),
    ('#### 三十', '30', 0, 0, 0, 0,
     'CJK numerals are not read'),
    ('#### 1 000', '1000', 1, 0, 0, 0,
     'a space groups thousands'),
    ('#### 1\u2009000', '1000', 1, 0, 0, 0,
     'a thin space groups thousands'),
    ('#### 1\u202f000', '1000', 1, 0, 0, 0,
     'a narrow no-break space groups thousands'),
    ("#### 1'000", '1000', 1, 0, 0, 0,
     'an apostrophe groups thousands'),
    ('#### 1’000', '1000', 1, 0, 0, 0,
     'a right single quote groups thousands'),
    ('\\boxed{1\\,000}', '1000', 1, 0, 0, 0,
     'a LaTeX thin space groups thousands'),
    ('#### 1 00', '100', 0, 0, 0, 0,
     'not a group of three'),
    ('#### 10 000 0', '100000', 0, 0, 0, 0,
     'not a group of three'),
    ("#### 30\n```python\nprint('#### ' + str(31))\n```", '30', 0, 1, 0, 0,
     'code after the answer that prints another marked number is a second answer'),
    ("#### 30\n```python\nprint('#### ' + str(31))\n```", '31', 0, 0, 1, 0,
     'a marker inside code is code'),
    ('#### 30 (the `####` line)', '30', 1, 1, 1, 0,
     'inline code holds no marker'),
    ('```\n#### 30\n```', '30', 0, 1, 1, 0,
     'an answer only inside code'),
    ('#### 30\n\\boxed{}', '30', 1, 1, 1, 0,
     'a stray empty box after the answer'),
    ('\\boxed{30}\n####', '30', 1, 0, 1, 1,
     'a stray empty marker after the answer'),
    ('Question: Tom has 12 apples and buys 18. How many?\n12 + 18 = 30\n#### 30', '30', 1, 0, 0, 0,
     'a restated question before the answer is kept (lm-eval cuts it)'),
    ('#### 30\nQuestion: Ann has 5 pens. How many?\nAnswer: #### 5', '30', 1, 1, 1, 0,
     'a Question: line after the answer starts the next problem'),
    ('#### 30 - 1', '30', 0, 1, 0, 0,
     'two numbers'),
    ('#### 30-ish', '30', 0, 1, 1, 0,
     'a hedge'),
    ('#### ≈30', '30', 0, 0, 1, 0,
     'a hedge'),
    ('#### ≥30', '30', 0, 0, 1, 0,
     'a bound'),
    ('#### 30 ± 1', '30', 0, 1, 0, 0,
     'a hedge'),
    ('#### at least 30', '30', 0, 0, 1, 0,
     'a bound'),
    ('#### 30 or so', '30', 0, 1, 1, 0,
     'a hedge'),
    ('approximately \\boxed{30}', '30', 0, 0, 1, 1,
     'a hedge before the box'),
    ('#### 30k', '30', 0, 1, 1, 0,
     '30k is 30000'),
    ('#### 30+', '30', 0, 1, 1, 0,
     '30 or more'),
    ('#### 3\u200b0', '30', 0, 0, 0, 0,
     'an invisible character inside the number'),
    ('#### 30 x 30', '30', 0, 1, 1, 0,
     'an expression'),
    ('\\boxed{\\frac{60}{2}}', '30', 0, 0, 0, 0,
     'a fraction is an expression'),
    ('#### 3.0e1', '30', 1, 0, 0, 0,
     'integer-valued scientific notation'),
    ('#### 030', '30', 1, 0, 0, 0,
     'a leading zero'),
    ('#### 30\nSo Tom has 30 apples.', '30', 1, 1, 1, 0,
     'the same number restated after words'),
]


@pytest.mark.parametrize("response, gold, ours, strict, flex, minerva_verdict, why", TABLE,
                         ids=[f"{i}" for i in range(len(TABLE))])
def test_strict_rule_beside_reference_graders(response, gold, ours, strict, flex,
                                              minerva_verdict, why):
  problem = Problem("p", "q", answer=gold)
  assert GSM8KVerifier().score_batch([problem], [response]) == [float(ours)], why
  assert (lm_eval_strict(response, gold), lm_eval_flexible(response, gold),
          minerva(response, gold)) == (strict, flex, minerva_verdict)


def test_table_covers_both_kinds_and_every_reference_disagreement():
  assert len(TABLE) >= 87   # 47 of issue 25, 40 or more of issue 38
  assert sum(row[2] for row in TABLE) >= 30 and sum(1 - row[2] for row in TABLE) >= 30
  # Each reference grader accepts at least one answer that the strict rule refuses.
  for column in (3, 4, 5):
    assert any(row[column] == 1 and row[2] == 0 for row in TABLE), column


# --------------------------------------------------------------------------- the rule's API


@pytest.mark.parametrize("response, expected", [
    ("#### 1,234", "1234"),
    ("#### 3.50", "3.5"),
    ("#### -0", "0"),
    ("#### 1.5e2", "150"),
    ("#### .5", "0.5"),
    ("##### 7", "7"),
    ("\\boxed{\\text{\\textbf{42}}}", "42"),
    ("#### 7\n\\boxed{9}.", "9"),
    ("\\boxed{9} #### 7", "7"),
    ("#### 1" + "0" * 60, "1" + "0" * 60),   # exact, beyond the decimal context's precision
    ("#### 1.5.3", None),
    ("\\boxed{30", None),
    ("#### 5 pm", "5"),
    ("#### \\pm 5", None),
    ("#### <5", None),
])
def test_final_answer(response, expected):
  value = math_answer.final_answer(response)
  assert (None if value is None else math_answer.canonical_number(value)) == expected


@pytest.mark.parametrize("response", [
    "", "####", "\\boxed{", "\\boxed", "#### " + "9" * 50_000, "#### 3e" + "9" * 5000,
    "#### 1e999999999", "#### " + "1," * 20_000 + "000", "\udcff#### 30\udcfe", "#### 30\x00",
    "#### " + "{" * 10_000, "\\boxed{" * 10_000 + "3" + "}" * 10_000, "#### ３０",
    "#" * 100_000, "\\boxed{" + "\\text{" * 500 + "3" + "}" * 501,
])
def test_no_model_string_raises(response):
  problem = Problem("p", "q", answer="30")
  for verifier in (GSM8KVerifier(), TinyVerifier()):
    assert verifier.score_batch([problem], [response])[0] in (0.0, 1.0)


def test_giant_numbers_compare_exactly():
  big = "9" * 5000
  problem = Problem("p", "q", answer=big)
  for verifier in (GSM8KVerifier(), TinyVerifier()):
    assert verifier.score_batch([problem] * 2, [f"#### {big}", f"#### {big[:-1]}8"]) == [1.0, 0.0]


def test_gold_that_is_not_a_number_names_the_problem():
  with pytest.raises(ValueError, match="Problem 'q7'.*not a single number"):
    GSM8KVerifier().score_batch([Problem("q7", "q", answer="yes")], ["#### 1"])


def test_tiny_rule_is_the_shared_rule():
  verifier = TinyVerifier()
  problem = Problem("p", "q", answer="27")
  responses = ["9 * 3 = 27 . #### 27", "#### 27 .", "#### 27 . #### 3", "#### 2 7",
               "#### 27 . 3 + 4 = 7", "9 * 3 = 27 .", "#### 027"]
  assert verifier.score_batch([problem] * len(responses), responses) == [
      float(math_answer.answers_match(r, "27")) for r in responses] == [
      1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


# --------------------------------------------------------------------------- Unicode surveys
# Every code point of each class the rule must read (or refuse), taken from the Unicode
# database of the running Python, scored by both math verifiers in one batch each.

_ALL = [chr(i) for i in range(0x110000)]


def _by_category(*categories):
  return [c for c in _ALL if unicodedata.category(c) in categories]


def _verdicts(cases):
  """[(response, gold)] -> scores of both math verifiers (the same, or the test fails)."""
  problems = [Problem(f"q{i}", "q", answer=gold) for i, (_, gold) in enumerate(cases)]
  responses = [response for response, _ in cases]
  tiny, gsm8k = (v.score_batch(problems, responses) for v in (TinyVerifier(), GSM8KVerifier()))
  assert tiny == gsm8k
  return tiny


def _named_minus():
  """Symbols named MINUS (`−`, `⁻`, `˗`, `➖`, `∸`, ...), not dingbats such as BLACK DIAMOND
  MINUS WHITE X."""
  return [c for c in _ALL if "MINUS" in unicodedata.name(c, "").split()
          and (unicodedata.category(c) in ("Sm", "Sk", "Po")
               or "MINUS SIGN" in unicodedata.name(c, ""))]


def test_every_dash_and_minus_sign_is_read_as_a_minus_sign():
  dashes, minus = _by_category("Pd"), _named_minus()
  wave_dashes = {"\u301c", "\u3030"}   # tilde-like: hedges, never signs
  assert set(dashes) - wave_dashes <= math_number.MINUS_SIGNS
  assert {"\u2212", "\ufe63", "\uff0d", "\u2012", "\u2013", "\u2014", "\u2010", "\u2011",
          "\u2043", "\u02d7"} <= math_number.MINUS_SIGNS
  signs = sorted(set(dashes) | set(minus) | math_number.MINUS_SIGNS)
  # Gold 30: a minus-like character before the number is never 30 (a sign, an operator or a
  # hedge); gold -30: each minus sign is read as one.
  assert _verdicts([(f"#### {c}30", "30") for c in signs]) == [0.0] * len(signs)
  assert _verdicts([(f"#### {c}30", "-30") for c in signs]) == [
      float(c in math_number.MINUS_SIGNS) for c in signs]
  assert _verdicts([(f"#### 30{c}", "30") for c in signs]) == [0.0] * len(signs)


def test_every_other_math_symbol_is_a_hedge_or_an_operator():
  symbols = [c for c in _by_category("Sm") if c != "=" and c not in math_number.SIGNS]
  assert len(symbols) > 900
  links = [c for c in symbols if c in math_number.LINK_SYMBOLS]
  assert links == ["\u2192", "\u21d2", "\u2234", "\u27f6", "\u27f9"]   # → ⇒ ∴ ⟶ ⟹
  cases = [(f"#### {c}30", "30") for c in symbols if c not in links]
  cases += [(f"#### 30 {c} 1", "30") for c in symbols] + [(f"#### 30{c}", "30") for c in symbols]
  assert _verdicts(cases) == [0.0] * len(cases)
  # A link ends the statement before the number (`Total → 30`, `∴ 30`); after it, it is an
  # operator like any other.
  links += [c for c in math_number.LINK_SYMBOLS if c not in links]
  assert _verdicts([(f"#### Total {c} 30", "30") for c in links]) == [1.0] * len(links)
  after = [(f"#### 30 {c}", "30") for c in links if unicodedata.category(c) == "Sm" and c != "="]
  assert _verdicts(after) == [0.0] * len(after)


def test_every_number_in_another_script_is_a_second_number():
  """`str.isnumeric` is exactly `unicodedata.numeric` is defined (CJK numerals included), so the
  rule's test for a number in another script covers every numeric code point."""
  numeric = [c for c in _ALL if unicodedata.numeric(c, None) is not None]
  assert [c for c in _ALL if c.isnumeric()] == numeric and len(numeric) > 1800
  others = [c for c in numeric if not c.isascii()]
  cases = [(f"#### 30 ({c})", "30") for c in others] + [(f"#### 30 or {c}", "30") for c in others]
  cases += [(f"#### 30{c}", "30") for c in others]
  assert _verdicts(cases) == [0.0] * len(cases)
  # Alone, only a decimal digit (category Nd) is read, as its own value.
  alone = [(f"#### {c}", canonical_number(decimal.Decimal(unicodedata.numeric(c)))
            if unicodedata.numeric(c) == int(unicodedata.numeric(c)) else "1.5") for c in others]
  assert _verdicts(alone) == [float(c.isdecimal()) for c in others]


def test_a_number_in_one_decimal_script_reads_and_two_scripts_never_do():
  zeros = sorted({ord(c) - unicodedata.decimal(c) for c in _by_category("Nd")})
  assert len(zeros) > 60
  one_script = [(f"#### {chr(z + 3)}{chr(z)}", "30") for z in zeros]
  mixed = [(f"#### {chr(z + 3)}0", "30") for z in zeros if z != ord("0")]
  mixed += [(f"#### 30 ({chr(z + 3)}{chr(z)})", "30") for z in zeros if z != ord("0")]
  assert _verdicts(one_script) == [1.0] * len(one_script)
  assert _verdicts(mixed) == [0.0] * len(mixed)


def test_every_space_groups_thousands_and_invisible_or_combining_marks_refuse():
  # The Ogham space mark is a space drawn as a line: a dash look-alike, never a separator.
  spaces = [c for c in _by_category("Zs") if c != "\u1680"]
  assert _verdicts([(f"#### 1{c}000", "1000") for c in spaces]) == [1.0] * len(spaces)
  assert _verdicts([(f"#### 1{c}00", "100") for c in spaces]) == [0.0] * len(spaces)
  assert _verdicts([("#### 1\u1680000", "1000"), ("#### \u168030", "30")]) == [0.0, 0.0]
  marks = _by_category("Cf", "Mn", "Me")
  cases = [(f"#### 3{c}0", "30") for c in marks] + [(f"#### 30{c}", "30") for c in marks]
  assert _verdicts(cases) == [0.0] * len(cases)


def test_text_joiners_and_directional_marks_read_away_from_the_number():
  """Persian and Hebrew text needs the zero-width non-joiner and joiner and the directional
  marks; beside a digit or sign they could reorder or hide what is read, so there they refuse."""
  joiners = ["\u200c", "\u200d", "\u200e", "\u200f", "\u061c"]
  away = [(f"#### 30 {c}", "30") for c in joiners] + [(f"#### 30 ab{c}cd", "30") for c in joiners]
  beside = [(f"#### 30{c}", "30") for c in joiners] + [(f"#### {c}30", "30") for c in joiners]
  beside += [(f"#### -{c}30", "-30") for c in joiners] + [(f"#### 1,{c}000", "1000")
                                                          for c in joiners]
  assert _verdicts(away) == [1.0] * len(away)
  assert _verdicts(beside) == [0.0] * len(beside)


def _dash_lookalikes():
  """Characters drawn as a horizontal stroke that are neither dashes (Pd) nor signs, found by
  name: box-drawing horizontals and scan lines, prolonged sound marks, the Hangul vowel EU, CJK
  stroke H, Kangxi radical one, the Canadian final short horizontal stroke, the Ogham space."""
  exact = {"BOX DRAWINGS LIGHT HORIZONTAL", "BOX DRAWINGS HEAVY HORIZONTAL",
           "BOX DRAWINGS DOUBLE HORIZONTAL", "HANGUL JUNGSEONG EU", "CJK STROKE H",
           "KANGXI RADICAL ONE", "CANADIAN SYLLABICS FINAL SHORT HORIZONTAL STROKE",
           "OGHAM SPACE MARK", "BOX DRAWINGS LIGHT LEFT AND HEAVY RIGHT",
           "BOX DRAWINGS HEAVY LEFT AND LIGHT RIGHT"}
  exact |= {f"BOX DRAWINGS {w} {side}" for w in ("LIGHT", "HEAVY") for side in ("LEFT", "RIGHT")}
  ends = ("DASH HORIZONTAL", "PROLONGED SOUND MARK", "HANGUL LETTER EU")
  return [c for c in _ALL if unicodedata.name(c, "") in exact
          or unicodedata.name(c, "").endswith(ends)
          or unicodedata.name(c, "").startswith("HORIZONTAL SCAN LINE")]


def test_every_dash_lookalike_is_refused_unless_inside_a_word():
  lookalikes = _dash_lookalikes()
  assert set(lookalikes) == math_number.DASH_LOOKALIKES
  cases = [(f"#### {c}30", gold) for c in lookalikes for gold in ("30", "-30")]
  cases += [(f"#### {c} 30", "30") for c in lookalikes] + [(f"#### 30 {c}", "30")
                                                          for c in lookalikes]
  assert _verdicts(cases) == [0.0] * len(cases)
  # Inside a word of its script the mark is a letter's: `コーヒー` (coffee).
  assert _verdicts([("#### 30 \u30b3\u30fc\u30d2\u30fc", "30")]) == [1.0]


def test_a_variation_selector_may_follow_a_symbol_only():
  checks = ["\u2714", "\u2705", "\u2611", "\u2713"]
  assert _verdicts([(f"#### 30 {c}\ufe0f", "30") for c in checks]) == [1.0] * len(checks)
  assert _verdicts([("#### 30\ufe0f", "30"), ("#### 3\ufe0f\u20e30", "30"),
                    ("#### 30 \u274c", "30"), ("#### 30 \u274c\ufe0f", "30")]) == [0.0] * 4


def _named_marks(*words):
  """Non-letter, non-combining characters whose name holds one of `words`."""
  return [c for c in _ALL if any(w in unicodedata.name(c, "") for w in words)
          and unicodedata.category(c)[0] not in "LMC"]


def test_every_question_mark_tilde_and_ellipsis_is_a_hedge_and_every_bang_a_factorial():
  hedges = _named_marks("QUESTION MARK", "INTERROBANG", "TILDE", "ELLIPSIS", "TWO DOT LEADER")
  assert len(hedges) > 60
  cases = [(f"#### 30{c}", "30") for c in hedges] + [(f"#### {c}30", "30") for c in hedges]
  bangs = _named_marks("EXCLAMATION")
  cases += [(f"#### 30{c}", "30") for c in bangs] + [(f"#### (30){c}", "30") for c in bangs]
  assert _verdicts(cases) == [0.0] * len(cases)


def test_every_superscript_or_subscript_on_the_number_is_an_exponent():
  scripts = [c for c in _ALL if unicodedata.decomposition(c).startswith(("<super>", "<sub>"))
             and c not in "ºª™℠"]
  assert len(scripts) > 200
  cases = [(f"#### 30{c}", "30") for c in scripts]
  assert _verdicts(cases) == [0.0] * len(cases)
  # A unit's exponent is the unit's: square metres, cubic centimetres.
  assert _verdicts([("#### 30 m²", "30"), ("#### 30 cm^3", "30"),
                    ("\\boxed{30 \\text{ m}^2}", "30"), ("#### {30}^2", "30")]) == [1, 1, 1, 0]
