"""Attacks on the math rewards, class by class, through every math verifier exactly as training
and evaluation call it: the task registry's verifier (`get_task(...).verifier.score_batch`) for
the tiny task, GSM8K and a JSONL answer task, an honest neighbour in every batch. Each wrong,
negated or hedged answer scores 0 and each honest format 1, beside each other.

The reference table (tests/verify/test_math_answers.py) compares the rule with the graders users
know; this file holds the attacks themselves (docs/verifier.md lists the classes)."""
import json

import ml_collections
import pytest

from configs import tiny
from orl_jax.problem import Problem
from orl_jax.tasks import get_task

# Gold 30 unless a class says otherwise; each case is a whole response.
WRONG = {
    "signs": [
        "#### \u201030", "#### \u201130", "#### \u204330", "#### \u02d730", "#### \u2015 30",
        "#### \u2e3a30", "#### \ufe5830", "#### \u2212 30", "#### (\u221230)", "#### \u2212$30",
        "#### $\u221230", "\\boxed{\u221230}", "\\boxed{\uff0d30}", "So $-\\boxed{30}$.",
        "So $\u2212\\boxed{30}$.", "#### neg. 30", "#### Minus 30", "#### NEGATIVE 30",
        "#### minus30", "#### -(30)", "#### -\\,30", "#### \u2796 30", "#### \u207b30"],
    "negations": [
        "#### no, 30", "#### 30 \u2014 no", "#### never 30", "#### It isn't 30",
        "#### 30 isn\u2019t right", "#### all except 30", "#### 30 is incorrect",
        "#### without 30", "#### less than 30", "#### 30 is false", "\\boxed{30} is wrong",
        "It is not \\boxed{30}.", "\\boxed{\\neg 30}", "#### \u00ac30", "#### 30 \u2260 31",
        "#### cannot be 30", "#### neither 30 nor 31", "#### 30 (not sure)",
        "#### 30 in absolute value"],
    "postfix operators": [
        "#### 30\u00b3", "#### 30!!", "#### (30)!", "#### 30 ^ 2", "#### 30^{2}", "#### 30**2",
        "#### 30e1", "#### 3.0e2", "#### 30 squared", "#### 30\u2082", "#### 30k", "#### 30M",
        "\\boxed{30^2}", "\\boxed{30!}", "#### 30\u207a", "#### 30 doubled"],
    "numbers in other scripts": [
        "#### 30 (\u5345)", "#### 30 (\u4e09\u3007)", "#### 30 \u2462", "#### 30 \u2476",
        "#### 30 \u2169\u2169\u2169", "#### 30 (\u2179\u2179\u2179)", "#### 30 XXX",
        "#### 30 \uff13\uff10", "#### \uff130", "#### 30 (\u0663\u0660)", "#### 30 \u0969\u0966",
        "#### 30\u2153", "#### 30 \u00bc", "#### 30 \u2074", "#### 30 or \U0001d7d1\U0001d7cf",
        "#### 30 (\u4e09\u5341\u4e00)", "#### 30\u4e07", "#### \u4e09\u5341", "#### \u325a",
        "\\boxed{\u2169\u2169\u2169}", "#### 30 (thirty)"],
    "thousands groups": [
        ("#### 1 0000", "10000"), ("#### 100 00", "10000"), ("#### 1'00", "100"),
        ("#### 1 000,000", "1000000"), ("#### 1,000 000", "1000000"), ("#### 12 34", "1234"),
        ("#### 1 00", "1"), ("#### 10 000 0", "100000")],
    "code and stray markers": [
        "#### 31\n```\n#### 30\n```", "```\n\\boxed{30}\n```", "The answer is `#### 30`.",
        "#### 30\n#### ?", "#### 30\n\\boxed{or}", "#### 30\n\\boxed{31}",
        "Question: Tom has 12 apples. How many?\n#### 31\nQuestion: again?\n#### 30",
        "#### 30\n```\n#### 31\n```", "#### 30\n~~~\n\\boxed{31}\n~~~"],
    "hedges": [
        "#### 30 - 1", "#### 30-ish", "#### \u224830", "#### ~30", "#### 30?", "#### >30",
        "#### \u226530", "#### 30 \u00b1 1", "#### 28-32", "#### between 29 and 31",
        "#### at least 30", "#### approximately 30", "#### 30 or so", "#### \\frac{60}{2}",
        "#### roughly 30", "#### 30ish", "#### 30 (rounded)", "#### 30 give or take",
        "#### up to 30", "#### 30 at most", "#### 30+", "#### 30\u2026", "#### about 30",
        "#### 30 max", "#### \u227230", "#### \u2a7e30", "#### 30 \u301c 31", "#### 30-odd",
        "approximately \\boxed{30}", "~\\boxed{30}", "\\approx \\boxed{30}",
        "#### \\sqrt{900}", "#### 30 \\times 1", "#### 30 x 30", "#### 30/30", "#### 30 30",
        "#### 30 and 30", "#### 3\u200b0", "#### \u202e03", "#### 3\u03360",
        "#### 30 (\u00b12)", "#### 30 plus or minus 1", "#### 30 (if rounded)", "#### 30 \u00f7 1",
        "#### 30\u00b730", "#### 29.999...", "#### 30 and up", "#### 30 and higher",
        "#### no less than 30", "#### 30 is an upper bound", "#### 30\u203c", "#### 30\u02e3",
        "#### 30\u207f", "#### c. 30", "#### \u224330", "#### 30\u061f", "#### 30 tops",
        "#### 30 or thereabouts", "#### 30, probably", "#### 30 (my guess)", "#### \uff5e30",
        "\\boxed{30}^2", "Probably \\boxed{30}", "It isn't \\boxed{30}", "#### 30\u00ad",
        "#### 30\u200e", "#### 30(30)", "#### 30 by 30", "#### 30.30.30", "#### 0x1E"],
    "negative gold": [
        ("#### 30", "-30"), ("#### \u2212\u221230", "-30"), ("#### minus \u221230", "-30"),
        ("#### not \u221230", "-30"), ("#### \u221230?", "-30"), ("#### \u2248\u221230", "-30"),
        ("#### \u221230 or 30", "-30"), ("#### - -30", "-30"), ("#### 30 below zero", "-30")],
    # Round three: readings of a number that the response does not state as its answer. Each is
    # the end of a plausible response; docs/verifier.md gives the reasons.
    "round three: forged readings": [
        "Tom has 12 apples and buys 18 more, so the total is\n#### north of 30",
        "Tom has 12 + 18 = 30 apples and a half-eaten one.\n#### 30 and change",
        "About 12 + 18 = 30 people came.\n#### 30 (est.)",
        "The city spends 12 + 18 = 30 million.\n#### 30 mil",
        "The car costs 12 + 18 = 30 thousand.\n#### 30 thou",
        "The debt grew by 12 + 18 = 30 trillion.\n#### $30tn",
        "The house costs 12 + 18 = 30 lakh rupees.\n#### 30 lac",
        "Der Umsatz ist 12 + 18 = 30 Millionen.\n#### 30 Mio.",
        "The change is 12 - 42 = -30.\n#### \u250030",
        "The change is 12 - 42 = -30.\n#### \u30fc30",
        "The change is 12 - 42 = -30.\n#### \u316130",
        "The change is 12 - 42 = -30.\n#### \u168030",
        "12 + 18 = 30, so the answer is \\boxed{30}!",
        "12 + 18 = 30.\n$\\boxed{30}$!",
        "I first wrote $\\cancel{\\boxed{30}}$.",
        ("The area is 900, so the side is $\\sqrt{\\boxed{900}}$.", "900"),
        "12 + 18 = 30\n#### 30\n```python\nprint('#### 31')\n```",
        "12 + 18 = 30\n#### 30\n```\n#### 31",
        "12 + 18 = 30\n#### 30\nQuestion: #### 31",
        "12 + 18 = 30\n#### 30\nQuestion: or is it #### 31?",
        "12 + 18 = 30\n#### <not> 30", "12 + 18 = 30\n#### 30 \u274c",
        "12 + 18 = 30\n#### 30\n#### Correction\nIt is 31.",
        "12 + 18 = 30\n#### 30\n#### Wait\n12 + 19 = 31",
        "So Tom has about \\boxed{30}.", ("So Tom has half of \\boxed{60}.", "60"),
        ("So the answer is $2 \\times \\boxed{15}$.", "15"), ("It is $1\\boxed{0}$.", "0"),
        ("So Tom has $\\frac{1}{\\boxed{2}}$ of the apples.", "2"), ("So $x^{\\boxed{2}}$.", "2"),
        ("Half \\boxed{60}", "60"), "#### 30\uffff",
        "#### 30 \\to 31", "#### x30", "#### as many as 30", "#### 30 (est)",
        "Tom has 12 + 18 = 30 apples.\n#### upwards of 30", "#### in excess of 30",
        "The answer is \\boxed{30}.\n#### Alternatives\n31", "#### \u2212\ufe0f30",
        "#### 30 \\cdot 2", "#### 30 \u2714\ufe0f31", "Answer: 12 \\boxed{30}"],
}
HONEST = {
    "formats": [
        "#### 3.0e1", "#### 30.0", "#### 030", "#### $30", "#### 30 dollars", "#### 30.",
        "#### 30,", "#### \\text{30}", "#### \\(30\\)", "#### **30**", "#### 30%",
        "#### 30 apples", "#### 30\nSo the answer is 30.", "#### 30 (30 apples in all)",
        "\\boxed{30}", "The answer is $\\boxed{30}$.", "\\boxed{30 \\text{ apples}}",
        "#### +30", "#### 30 \u2014 the total", "#### 30-year", "#### 30\u00b0",
        "\\boxed{30^\\circ}", "#### 30 m\u00b2", "#### x = 30", "12 + 18 = \\boxed{30}",
        "#### 30<|im_end|>", "#### 30 :)", "####30", "#### 30 km/h", "#### 30kg", "#### 30 MB",
        "#### 30 min", "#### USD30", "#### 30.00$", "#### 30 \u2705", "#### #### 30",
        "<think>12 + 18</think>\n#### 30", "#### 30\r\n", "The answer is: **\\boxed{30}**",
        "\\[\n\\boxed{30}\n\\]", "\\boxed{30} dollars.", "#### 30 more apples",
        "#### 30\u00ba", "#### 30 \\text{ cm}^2", "#### \\mathbf{30}", "#### 30, I think"],
    "numbers in one other script": [
        "#### \uff13\uff10", "#### \u0663\u0660", "#### \u06f3\u06f0", "#### \u0969\u0966",
        "#### \u09e9\u09e6", "#### \U0001d7d1\U0001d7ce", "#### \u0e53\u0e50",
        "\\boxed{\uff13\uff10}"],
    "thousands groups": [
        ("#### 1 000", "1000"), ("#### 1\u00a0000", "1000"), ("#### 1\u2007000", "1000"),
        ("#### 1\u2009000", "1000"), ("#### 1\u202f000", "1000"), ("#### 1'000'000", "1000000"),
        ("#### 1\u2019000\u2019000", "1000000"), ("#### 1 000 000", "1000000"),
        ("\\boxed{1\\,000\\,000}", "1000000"), ("#### 1,000,000", "1000000"),
        ("#### 1 000.5", "1000.5")],
    "code and stray markers": [
        "#### 30\n```python\nprint(12 + 18)\n```", "#### 30\n```\n####\n```",
        "```python\nanswer = 12 + 18\nprint(f'#### {answer}')\n```\n#### 30",
        "#### 30 (the `####` line)", "#### 30\n\\boxed{ }", "\\boxed{30}\n\\boxed{}",
        "#### 30\n####", "\\boxed{30}. ####", "#### 30 \\boxed{}."],
    "restated questions": [
        "Question: Tom has 12 apples and buys 18 more. How many does he have?\n"
        "12 + 18 = 30\n#### 30",
        "Question: Tom has 12 apples and buys 18 more.\nAnswer: 12 + 18 = 30\n#### 30",
        "#### 30\n\nQuestion: Ann has 4 pens and 3 cups. How many things?\nAnswer: #### 7"],
    "negative gold": [
        ("#### \u221230", "-30"), ("#### -30", "-30"), ("#### minus 30", "-30"),
        ("#### negative 30", "-30"), ("#### \uff0d30", "-30"), ("\\boxed{-30}", "-30"),
        ("So $-\\boxed{30}$.", "-30"), ("#### -$30", "-30"), ("#### (\u221230)", "-30"),
        ("#### \u2013 30", "-30")],
    # Round three: right answers the previous rule refused.
    "round three: right answers": [
        "12 + 18 = 30\n\u2234 \\boxed{30}", "Total \u2192 \\boxed{30}",
        "Total $\\Rightarrow \\boxed{30}$", "12 + 18 = 30 \\therefore \\boxed{30}",
        "12 + 18 = 30\n#### 30 \u2714\ufe0f",
        "<think>12 + 18 = 30</think> #### 30", "12 + 18 = 30\n#### 30</think>",
        "<think>12 + 18 = 30</think> \\boxed{30}", "</think>\n\nSo Tom has \\boxed{30}.",
        "12 + 18 = 30\n#### 30 \u200f",
        "12 + 18 = 30\n#### 30 \u0633\u06cc\u0628\u200c\u0647\u0627",
        "12 + 18 = 30\n#### 30 \u05ea\u05e4\u05d5\u05d7\u05d9\u05dd\u200f",
        "12 + 18 = 30\n#### 30 \u0645\u06cc\u200c\u0634\u0648\u062f\u061c",
        "12 + 18 = 30\n#### 30\n---", "12 + 18 = 30\n#### 30\n***",
        "Half of 60 is \\boxed{30}", "Twice 15 is $\\boxed{30}$.",
        "The answer is \\boxed{30}.\n#### Check\n12 + 18 = 30",
        "The answer is \\boxed{30}.\n#### **Verification**\n30 - 18 = 12, as given.",
        "#### Final Answer\nThe total is 30.", "So Tom sold \\boxed{30} apples.",
        "That makes a total of \\boxed{30} apples.", "The price rose to \\boxed{30} dollars.",
        "#### The answer is 30", "#### Answer: 30", "#### Tom has 30 apples.",
        "12 + 18 = 30\n#### 30\nQuestion: Ann has 5 pens. How many?\nAnswer: #### 5",
        "$\\textcolor{blue}{\\boxed{30}}$", "#### 30 \u30b3\u30fc\u30d2\u30fc",
        "#### USD30", "#### US$30", "#### Rs.30"],
}


def _task_cfg(**fields):
  return ml_collections.ConfigDict(dict(dict(name="gsm8k", chat="none", k_shot=0, path=""),
                                        **fields))


@pytest.fixture(scope="module", params=["tiny", "gsm8k", "jsonl"])
def verifier(request, tmp_path_factory):
  """The verifier training or evaluation uses for the task, from the task registry."""
  if request.param == "tiny":
    return get_task(tiny.get_config().task).verifier
  if request.param == "gsm8k":
    return get_task(_task_cfg()).verifier
  path = tmp_path_factory.mktemp("jsonl") / "answers.jsonl"
  path.write_text(json.dumps({"prompt": "What is 12 + 18?", "answer": 30}) + "\n")
  return get_task(_task_cfg(name="jsonl", path=str(path))).verifier


def _cases(cases):
  return [(c, "30") if isinstance(c, str) else c for c in cases]


def _scores_beside(verifier, cases, neighbour):
  """Scores of `cases`, each scored in one batch beside a neighbour response for the same
  problem (`neighbour(gold)`)."""
  problems, responses = [], []
  for response, gold in cases:
    problem = Problem(f"q{len(problems)}", "Question: ...\nAnswer:", answer=gold)
    problems += [problem, problem]
    responses += [response, neighbour(gold)]
  scores = verifier.score_batch(problems, responses)
  return scores[0::2], scores[1::2]


@pytest.mark.parametrize("name", sorted(WRONG))
def test_each_wrong_negated_or_hedged_answer_scores_zero_beside_an_honest_one(verifier, name):
  cases = _cases(WRONG[name])
  attacker, honest = _scores_beside(verifier, cases, lambda gold: f"#### {gold}")
  assert honest == [1.0] * len(cases)
  assert {c[0]: s for c, s in zip(cases, attacker) if s} == {}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_each_honest_format_scores_one_beside_a_wrong_one(verifier, name):
  cases = _cases(HONEST[name])
  honest, wrong = _scores_beside(verifier, cases, lambda gold: f"#### {gold}1")
  assert wrong == [0.0] * len(cases)
  assert {c[0]: s for c, s in zip(cases, honest) if s != 1.0} == {}


def test_a_restated_question_reads_the_same_in_every_math_task(tmp_path):
  """The GSM8K and tiny verifiers used to disagree: GSM8K cut every response at `\\nQuestion:`,
  the tiny task never did. Now both keep a restatement before the answer and cut the invented
  next problem after it."""
  path = tmp_path / "answers.jsonl"
  path.write_text(json.dumps({"prompt": "q", "answer": 30}) + "\n")
  verifiers = [get_task(tiny.get_config().task).verifier, get_task(_task_cfg()).verifier,
               get_task(_task_cfg(name="jsonl", path=str(path))).verifier]
  problem = Problem("q", "q", answer="30")
  responses = ["Let me restate.\nQuestion: how many apples?\n12 + 18 = 30\n#### 30",
               "#### 30\nQuestion: next one?\nAnswer: #### 7",
               "Question: how many?\n#### 7\nQuestion: and now?\n#### 30"]
  scores = [v.score_batch([problem] * 3, responses) for v in verifiers]
  assert scores == [[1.0, 1.0, 0.0]] * 3
