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
import re
import unicodedata

import pytest

from orl_jax.problem import Problem
from orl_jax.verify import math_answer
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
    ("#### 30 hmm.", "30", 0, 1, 1, 0, "a word after the number that is no unit"),
    ("####30", "30", 1, 0, 1, 0, "no space after the marker"),
    ("#### -5", "-5", 1, 1, 1, 0, "negative"),
    ("#### −5", "-5", 1, 0, 0, 0, "unicode minus sign"),
    ("#### -$5", "-5", 1, 0, 1, 0, "sign before the currency sign"),
    ("#### 3e1", "30", 0, 0, 0, 0, "scientific notation is no NUMBER"),
    ("#### 1e3", "1000", 0, 0, 0, 0, "scientific notation is no NUMBER"),
    ("#### 30<|im_end|>", "30", 1, 1, 1, 0, "a special token left by the detokenizer"),
    ("The answer is \\boxed{30}.", "30", 1, 0, 1, 1, "the last \\boxed{} is a marker"),
    ("\\boxed{\\$30}", "30", 1, 0, 1, 1, "LaTeX currency sign"),
    ("\\boxed{1{,}230}", "1230", 1, 0, 0, 1, "LaTeX thousands separator"),
    ("\\boxed{30 \\text{ dollars}}", "30", 1, 0, 1, 1, "LaTeX unit"),
    ("12 + 18 = 30\n#### 30\n\nQuestion: Tom has 4 apples and 9 pears.", "30", 1, 1, 1, 0,
     "the invented next few-shot question is cut, as lm-eval's `until` does"),
    ("#### 31\nWait, 12 + 18 = 30.\n#### 30", "30", 0, 0, 1, 0,
     "a second candidate answer (31) before the last"),
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
    ("#### 1 230", "1230", 0, 0, 0, 0, "only `,` groups thousands"),
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
    ('#### minus 30', '-30', 0, 0, 0, 0,
     'a sign word is no SIGN'),
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
    ('#### ３０', '30', 0, 0, 0, 0,
     'full-width digits: a locale form'),
    ('#### ٣٠', '30', 0, 0, 0, 0,
     'Arabic-Indic digits: a locale form'),
    ('#### 三十', '30', 0, 0, 0, 0,
     'CJK numerals are not read'),
    ('#### 1 000', '1000', 0, 0, 0, 0,
     'only `,` groups thousands (space groups thousands)'),
    ('#### 1\u2009000', '1000', 0, 0, 0, 0,
     'only `,` groups thousands (thin space groups thousands)'),
    ('#### 1\u202f000', '1000', 0, 0, 0, 0,
     'only `,` groups thousands (narrow no-break space groups thousands)'),
    ("#### 1'000", '1000', 0, 0, 0, 0,
     'only `,` groups thousands (apostrophe groups thousands)'),
    ('#### 1’000', '1000', 0, 0, 0, 0,
     'only `,` groups thousands (right single quote groups thousands)'),
    ('\\boxed{1\\,000}', '1000', 0, 0, 0, 0,
     'only `,` groups thousands (LaTeX thin space groups thousands)'),
    ('#### 1 00', '100', 0, 0, 0, 0,
     'not a group of three'),
    ('#### 10 000 0', '100000', 0, 0, 0, 0,
     'not a group of three'),
    ("#### 30\n```python\nprint('#### ' + str(31))\n```", '30', 0, 1, 0, 0,
     'code after the answer that prints another marked number is a second answer'),
    ("#### 30\n```python\nprint('#### ' + str(31))\n```", '31', 0, 0, 1, 0,
     'a marker inside code is code'),
    ('#### 30 (the `####` line)', '30', 0, 1, 1, 0,
     'code and words after the number on the answer line'),
    ('```\n#### 30\n```', '30', 0, 1, 1, 0,
     'an answer only inside code'),
    ('#### 30\n\\boxed{}', '30', 0, 1, 1, 0,
     'text after the answer line (an empty box)'),
    ('\\boxed{30}\n####', '30', 0, 0, 1, 1,
     'text after the answer line (an empty marker)'),
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
    ('#### 3.0e1', '30', 0, 0, 0, 0,
     'scientific notation is no NUMBER'),
    ('#### 030', '30', 1, 0, 0, 0,
     'a leading zero'),
    ('#### 30\nSo Tom has 30 apples.', '30', 0, 1, 1, 0,
     'text after the answer line'),
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
  assert sum(row[2] for row in TABLE) >= 20 and sum(1 - row[2] for row in TABLE) >= 60
  # Each reference grader accepts at least one answer that the strict rule refuses.
  for column in (3, 4, 5):
    assert any(row[column] == 1 and row[2] == 0 for row in TABLE), column


# --------------------------------------------------------------------------- the rule's API


@pytest.mark.parametrize("response, expected", [
    ("#### 1,234", "1234"),
    ("#### 3.50", "3.5"),
    ("#### -0", "0"),
    ("#### 1.5e2", None),
    ("#### .5", None),
    ("##### 7", "7"),
    ("\\boxed{\\text{\\textbf{42}}}", "42"),
    ("#### 7\n\\boxed{9}.", None),
    ("\\boxed{9} #### 7", None),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("\\boxed{\\frac{1}{3}}", "1/3"),
    ("\\boxed{\\frac{2}{4}}", None),
    ("#### 1" + "0" * 60, "1" + "0" * 60),   # exact, beyond the decimal context's precision
    ("#### 1.5.3", None),
    ("\\boxed{30", None),
    ("#### 5 pm", None),
    ("#### 5 hours", "5"),
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
    "Roughly " * 20_000 + "So \\boxed{30} q", "So \\boxed{30} q" + " not q" * 20_000,
])
def test_no_model_string_raises(response):
  problem = Problem("p", "q", answer="30")
  for verifier in (GSM8KVerifier(), TinyVerifier()):
    assert verifier.score_batch([problem], [response])[0] in (0.0, 1.0)


def test_a_long_list_of_counts_after_a_box_reads_in_linear_time():
  """Each number after a box is checked against the list before it; in time quadratic in the
  sentence's length this sentence would take minutes."""
  problem = "Tom has 12 apples and 18 pears. How many fruits does he have?"
  response = "12 + 18 = \\boxed{30} fruits for 12 apples" + " and 12 apples" * 20_000
  assert math_answer.final_answer(response, problem) == 30


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
# The grammar is an allowlist: every code point of a class, from the Unicode database of the
# running Python, is placed where the grammar allows only a few, and scored by both math
# verifiers in one batch each; the expected verdict is computed here from the listed few.

_BMP = [chr(i) for i in range(0x10000) if not 0xd800 <= i < 0xe000]


def _verdicts(cases):
  """[(response, gold)] -> scores of both math verifiers (the same, or the test fails)."""
  problems = [Problem(f"q{i}", "q", answer=gold) for i, (_, gold) in enumerate(cases)]
  responses = [response for response, _ in cases]
  tiny, gsm8k = (v.score_batch(problems, responses) for v in (TinyVerifier(), GSM8KVerifier()))
  assert tiny == gsm8k
  return tiny


def test_only_the_listed_minus_signs_sign_a_number():
  """Every dash, math symbol and character named MINUS before the number: a sign only when it
  is one of the listed minus signs, and never the positive number."""
  minus_like = [c for c in _BMP if unicodedata.category(c) in ("Pd", "Sm")
                or "MINUS" in unicodedata.name(c, "")]
  assert len(minus_like) > 900
  assert _verdicts([(f"#### {c}30", "-30") for c in minus_like]) == [
      float(c in "-\u2212\u2013\uff0d\ufe63") for c in minus_like]
  assert _verdicts([(f"#### {c}30", "30") for c in minus_like]) == [0.0] * len(minus_like)


def test_nothing_but_blanks_a_full_stop_or_a_unit_sign_follows_the_number():
  """`#### 30` + any one code point: read only when it is a blank, a full stop, `%`, `°`, or
  formatting that is read as nothing (`$`, a brace)."""
  allowed = set(" \t\r\n.%°${}")
  assert _verdicts([(f"#### 30{c}", "30") for c in _BMP]) == [float(c in allowed) for c in _BMP]


def test_nothing_but_blanks_or_formatting_stands_between_the_marker_and_the_number():
  allowed = set(" \t\r${}0")   # `#### 030` is 30
  assert _verdicts([(f"#### {c}30", "30") for c in _BMP]) == [float(c in allowed) for c in _BMP]


def test_a_digit_of_any_other_script_is_a_locale_form():
  digits = [c for c in _BMP if unicodedata.category(c) == "Nd" and not c.isascii()]
  assert len(digits) > 300
  cases = [(f"#### {c}", str(unicodedata.digit(c))) for c in digits]
  cases += [(f"#### 3{c}", "3" + str(unicodedata.digit(c))) for c in digits]
  assert _verdicts(cases) == [0.0] * len(cases)


def test_invisible_code_points_on_or_after_the_answer_line_refuse():
  """Control, format (but the two joiners), private-use and unassigned code points hide or
  reorder text: on the answer's line or after it they make the response wrong."""
  hidden = [c for c in _BMP if unicodedata.category(c) in ("Cc", "Cf", "Co", "Cn")
            and c not in "\n\r\t\u200c\u200d"][::7]
  assert len(hidden) > 300
  cases = [(f"#### 30\n{c}", "30") for c in hidden] + [(f"\\boxed{{30}} {c}", "30")
                                                        for c in hidden]
  assert _verdicts(cases) == [0.0] * len(cases)
  # Before the answer's line they hide nothing that is read: GSM8K's own solutions hold a
  # zero-width space in their working.
  assert _verdicts([("12 + 18\u200b = 30\n#### 30", "30")]) == [1.0]


def test_a_problem_word_reads_as_a_unit_but_never_a_hedge_word():
  problem = "Tom walks about 3 miles with some apples, maybe more."
  read = [math_answer.final_answer(r, problem) for r in (
      "#### 30 apples", "Tom has \\boxed{30} apples with him.", "#### 30 about", "#### 30 maybe",
      "Tom has \\boxed{30} apples, maybe.", "Tom has \\boxed{30} apples, some.", "Tom has about "
      "\\boxed{30} apples.")]
  assert read == [30, 30, None, None, None, None, None]
  assert math_answer.final_answer("#### 30 apples") is None   # no problem: apples is not listed
