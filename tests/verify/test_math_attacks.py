"""Attacks on the math rewards, class by class, through every math verifier exactly as training
and evaluation call it: the task registry's verifier (`get_task(...).verifier.score_batch`) for
the tiny task, GSM8K and a JSONL answer task, an honest neighbour in every batch. Each wrong,
negated or hedged answer scores 0 and each right answer inside the grammar 1, beside each other.

The reference table (tests/verify/test_math_answers.py) compares the rule with the graders users
know; this file holds the attacks themselves (docs/verifier.md lists the classes)."""
import json

import ml_collections
import pytest

from configs import tiny
from orl_jax.problem import Problem
from orl_jax.tasks import get_task

# Gold 30 unless a class says otherwise; each case is a whole response, scored for PROMPT.
PROMPT = ("Tom has 12 apples and buys 18 more apples at the market. How many apples does Tom "
          "have in total?")
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
    # Round four: what the allowlist grammar refuses that the denylist rule read.
    "round four: letters in or right after the number": [
        "#### 3O", "#### 3o", "#### 3l", "#### 30 mill", "#### 30kg", "#### 30 apples!",
        "\\boxed{3O}", "\\boxed{30k}", "#### 30e0", ("#### 1e3", "1000"), "#### 30th",
        "#### 30 ft-lb", "#### 30 r"],
    "round four: hex and locale forms": [
        "#### 0x1E", "#### 1E", "#### \uff13\uff10", "#### \u0663\u0660", "#### 30,0",
        ("#### 1 000", "1000"), ("#### 1'000", "1000"), ("#### 1.000", "1000"),
        ("#### 1\u202f000", "1000"), ("\\boxed{1\\,000}", "1000"), ("#### 1.000,5", "1000.5"),
        "#### 3.0e1", "#### +30", "#### 30-"],
    "round four: magnitude words": [
        "#### 30 million", "#### 30 thousand", "#### 30 dozen", "#### 30 grand",
        "\\boxed{30 \\text{ million}}", "So Tom has \\boxed{30} million apples.",
        "#### 30 Mrd.", "#### 30 crore", "#### 30 lakh"],
    "round four: hedges in any language": [
        "#### 30 (rough)", "#### 30 at a push", "#### 30 environ", "#### 30 etwa", "#### etwa 30",
        "#### 30 aproximadamente", "#### 30 circa", "#### \u7d0430", "#### 30 \u304f\u3089\u3044",
        "#### 30 \u0442\u0430\u043a", "#### 30 ish", "#### 30 give or take",
        "\\boxed{30} at a push", "So Tom has \\boxed{30} apples, roughly.",
        "So Tom has \\boxed{30} apples environ.", "Tom has about \\boxed{30} apples.",
        "Tom has \\boxed{30} apples or so.", "Tom has \\boxed{30} apples, ungef\u00e4hr.",
        "Tom has \\boxed{30} apples (rough).", "Tom has \\boxed{30} apples at most.",
        "Tom has \\boxed{30} apples, give or take.", "#### 30 about", "\\boxed{30 \\text{ maybe}}"],
    "round four: markup that hides text": [
        "#### 30 <!-- 31 -->", "<!-- the answer is 31 -->\n#### 30",
        "<span style=\"display:none\">#### 31</span>\n#### 30",
        "<span hidden>It is 31.</span>\n#### 30",
        "<details><summary>Check</summary>\nIt is 31.\n</details>\n#### 30",
        "$\\color{white}{31}$\n#### 30", "\\textcolor{white}{Wrong: it is 31.}\n#### 30",
        "<font color=\"white\">31</font>\n#### 30", "[//]: # (the answer is 31)\n#### 30",
        "$\\phantom{31}$\n#### 30", "<div hidden>#### 31</div>\n#### 30",
        "#### 30\u200b", "#### 3\u200b0", "\\boxed{30}\u2063", "#### 30\n\u2060",
        "$\\textcolor{blue}{\\boxed{30}}$"],
    "round four: code after the answer": [
        "#### 30\n```\n# wait, it is 31\n```", "#### 30\n```python\nprint(31)  # correction\n```",
        "\\boxed{30}\n~~~\nretract: 31\n~~~", "#### 30\n`actually 31`", "#### 30\n```\nrough\n"],
    "round four: a second candidate answer": [
        "\\boxed{31}\nSo \\boxed{30}.", "#### 29\nNo, wait.\n#### 30", "#### 31 hmm\n#### 30",
        "\\boxed{29 or 30}\n#### 30", "In the working, \\boxed{31}. The answer is \\boxed{30}.",
        "| a | \\boxed{31} |\n\n#### 30"],
    "round four: text after the answer": [
        "#### 30\nActually it is 31.", "#### 30\nSo the answer is 30.",
        "\\boxed{30}\n#### Check\n12 + 18 = 30", "#### 30\nI am not sure.",
        "#### 30 \u2014 the total", "#### 30\n\\boxed{}", "#### Final Answer\nThe total is 30."],
}

HONEST = {
    "formats": [
        "#### 30", "#### 30.", "#### 30 .", "#### 30.0", "#### 030", "#### $30", "#### 30 dollars",
        "#### \\text{30}", "#### \\(30\\)", "#### **30**", "#### 30%", "#### 30 apples",
        "\\boxed{30}", "The answer is $\\boxed{30}$.", "####30", "#### 30<|im_end|>",
        "<think>12 + 18</think>\n#### 30", "#### 30\r\n", "The answer is: **\\boxed{30}**",
        "\\[\n\\boxed{30}\n\\]", "\\boxed{30} dollars.", "#### \\mathbf{30}", "#### 30.00$",
        "12 + 18 = 30 . #### 30", "#### 0030.000", "\\boxed{\\text{\\textbf{30}}}"],
    "fractions": [
        ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("#### \\tfrac{5}{2}", "2.5"), ("\\boxed{-\\frac{1}{4}}", "-0.25"),
        ("The share is $\\boxed{\\dfrac{1}{8}}$.", "0.125"), ("#### \\frac{61}{2}", "30.5")],
    "units in \\text{}": [
        "\\boxed{30 \\text{ apples}}", "\\boxed{30\\text{ dollars}}", "\\boxed{30 \\mathrm{kg}}",
        "#### 30 \\text{dollars}", "\\boxed{30\\,\\text{m}}", "\\boxed{30^\\circ}",
        "\\boxed{\\$30}", "\\boxed{30\\%}", "\\boxed{30 \\text{ cm}^2}", "#### 30 m\u00b2"],
    "restated in the sentence": [
        "Tom has 12 + 18 = \\boxed{30} apples.", "So Tom has \\boxed{30} apples in total.",
        "Tom buys 18 more, so he has 12 + 18 = $\\boxed{30}$ apples from the market.",
        "12 + 18 = \\boxed{30}", "Total \u2192 \\boxed{30}", "12 + 18 = 30 \\therefore \\boxed{30}",
        "Total $\\Rightarrow \\boxed{30}$", "12 + 18 = 30\n\u2234 \\boxed{30}",
        "So Tom has \\boxed{30}.", "That is 12 + 18 = \\boxed{30} apples, all of them Tom's.",
        "Tom buys 12 + 18 = \\boxed{30} apples", "With `12 + 18`, Tom has \\boxed{30} apples."],
    "table cells": [
        "| item | count |\n| --- | --- |\n| apples | \\boxed{30} |", "| Total | \\boxed{30} |",
        "| apples | 12 + 18 = \\boxed{30} |\n|---|---|"],
    "thousands groups": [
        ("#### 1,000", "1000"), ("#### 1,000,000", "1000000"), ("\\boxed{1{,}000}", "1000"),
        ("#### 1,000.5", "1000.5"), ("#### 12,345,678.25", "12345678.25")],
    "code and the same answer twice": [
        "```python\nanswer = 12 + 18\nprint(f'#### {answer}')\n```\n#### 30",
        "```\n\\boxed{31}\n```\nSo \\boxed{30}.", "\\boxed{30}\n#### 30",
        "The answer is \\boxed{30}.\n\n#### 30", "#### 30\n\n---", "12 + 18 = 30\n#### 30</think>",
        "Check: `#### 31` is wrong.\n#### 30"],
    "restated questions": [
        "Question: Tom has 12 apples and buys 18 more. How many does he have?\n"
        "12 + 18 = 30\n#### 30",
        "Question: Tom has 12 apples and buys 18 more.\nAnswer: 12 + 18 = 30\n#### 30",
        "#### 30\n\nQuestion: Ann has 4 pens and 3 cups. How many things?\nAnswer: #### 7"],
    "negative gold": [
        ("#### \u221230", "-30"), ("#### -30", "-30"), ("#### \uff0d30", "-30"),
        ("\\boxed{-30}", "-30"), ("So $-\\boxed{30}$.", "-30"), ("#### -$30", "-30"),
        ("#### \u2013 30", "-30"), ("\\boxed{\u221230}", "-30")],
}

# Round four, second part: each attack beside its honest twin, the same response with the right,
# unhedged answer; the twin must score 1 where the attack scores 0 (gold 30, PROMPT, unless a case
# gives `(attack, twin, gold, problem)`).
MILLIONS = ("A city has 12 million people and 18 million more move in. How many million people "
            "live there now?")
NOT_RIPE = "Tom picks 50 apples and 20 of them are ripe. How many apples are not ripe?"
DOZENS = "A farmer sells 12 dozen eggs and 18 dozen more. How many dozen eggs did he sell?"
ROUND_TRIP = "Tom has 12 apples and buys 18 more on a round trip. How many apples does Tom have?"
TIMES = "Tom rang the bell 12 times and then 18 more times. How many times did he ring it?"
TWINS = {
    "letters that look like digits": [
        ("#### 3O", "#### 30"), ("#### 3o", "#### 30"), ("#### 3O apples", "#### 30 apples"),
        ("\\boxed{3O}", "\\boxed{30}"), ("So Tom has \\boxed{3O} apples.",
                                         "So Tom has \\boxed{30} apples."),
        ("#### 1O0", "#### 100", "100", PROMPT), ("#### l5", "#### 15", "15", PROMPT),
        ("#### 3\u039f", "#### 30")],   # a Greek capital omicron
    "hex and locale forms": [
        ("#### 0x1E", "#### 30"), ("#### 1E", "#### 30"), ("#### \uff13\uff10", "#### 30"),
        ("#### \u0663\u0660", "#### 30"), ("#### 30,0", "#### 30.0"),
        ("#### 1.000", "#### 1,000", "1000", PROMPT), ("#### 1 000", "#### 1000", "1000", PROMPT),
        ("\\boxed{1\\,000}", "\\boxed{1{,}000}", "1000", PROMPT)],
    "magnitude words": [
        ("#### 30 mill", "#### 30 apples"), ("#### 30 million", "#### 30"), ("#### 30k", "#### 30"),
        ("So Tom has \\boxed{30} thousand apples.", "So Tom has \\boxed{30} apples."),
        ("So Tom has \\boxed{30} dozen apples.", "So Tom has \\boxed{30} apples."),
        ("\\boxed{30 \\text{ million}}", "\\boxed{30 \\text{ apples}}"),
        ("#### 30 thousand", "#### 30 million", "30", MILLIONS),
        ("The city has \\boxed{30} thousand people.", "The city has \\boxed{30} million people.",
         "30", MILLIONS),
        ("He sold \\boxed{30} dozen dozen eggs.", "He sold \\boxed{30} dozen eggs.", "30", DOZENS)],
    "arithmetic after the answer": [
        ("So Tom has \\boxed{30} times two apples.", "So Tom has \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples and 12 more.", "Tom has \\boxed{30} apples at the market."),
        ("Tom has \\boxed{30} apples, less one.", "Tom has \\boxed{30} apples, in total."),
        ("Tom has \\boxed{30} apples and up.", "Tom has \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples, make that 31 apples.", "Tom has \\boxed{30} apples."),
        ("12 + 18 = 30, so Tom has \\boxed{30} apples by 30.",
         "12 + 18 = 30, so Tom has \\boxed{30} apples at the market."),
        ("Tom has \\boxed{30} apples out of 12.", "Tom has \\boxed{30} apples in total."),
        ("He rang it \\boxed{30} times two.", "He rang it 12 + 18 = \\boxed{30} times.", "30",
         TIMES)],
    "hedges in any language": [
        ("#### 30 (rough)", "#### 30"), ("#### 30 at a push", "#### 30"),
        ("#### \u7ea630", "#### 30"),
        ("Tom has about \\boxed{30} apples.", "Tom has \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples, ungef\u00e4hr.", "Tom has \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples environ.", "Tom has \\boxed{30} apples in total."),
        ("Tom has \\boxed{30} apples at a stretch.", "Tom has \\boxed{30} apples at the market."),
        ("Tom has \\boxed{30} apples in the ballpark.", "Tom has \\boxed{30} apples in total."),
        ("Tom has \\boxed{30} apples, m\u00e1s o menos.", "Tom has \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples, \u043f\u0440\u0438\u043c\u0435\u0440\u043d\u043e.",
         "Tom has \\boxed{30} apples."),
        ("Roughly, Tom has \\boxed{30} apples.", "So, Tom has \\boxed{30} apples."),
        ("Tom doesn't have \\boxed{30} apples.", "Tom does have \\boxed{30} apples."),
        ("Tom cannot have \\boxed{30} apples.", "Tom must have \\boxed{30} apples."),
        ("Tom might have \\boxed{30} apples.", "Tom does have \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples, could be.", "Tom has \\boxed{30} apples."),
        ("Tom has about 12 + 18 = \\boxed{30} apples.", "Tom has 12 + 18 = \\boxed{30} apples."),
        # A problem word (`round`) in a hedging form.
        ("Tom has \\boxed{30} apples, rounded.", "Tom has \\boxed{30} apples.", "30",
         ROUND_TRIP),
        # A hedge planted in the working first: the working's words are not read.
        ("12 + 18 = 30 environ.\nSo Tom has \\boxed{30} apples environ.",
         "12 + 18 = 30.\nSo Tom has \\boxed{30} apples."),
        # The problem's own negation reads only as the problem's phrase.
        ("So \\boxed{30} apples, not ripe maybe.", "So \\boxed{30} apples are not ripe.", "30",
         NOT_RIPE),
        ("So \\boxed{30} apples, or not.", "So 50 - 20 = \\boxed{30} apples are not ripe.", "30",
         NOT_RIPE)],
    "markup that hides a second answer": [
        ("#### 30 <!-- 31 -->", "#### 30"), ("<!-- 31 -->\nTom has \\boxed{30} apples.",
                                            "Tom has \\boxed{30} apples."),
        ("<span style=\"display:none\">#### 31</span>\n#### 30",
         "Not hidden: 12 + 18 = 30.\n#### 30"),
        ("<details><summary>Check</summary>\nIt is 31.\n</details>\n#### 30",
         "Check: 12 + 18 = 30.\n#### 30"),
        ("$\\color{white}{31}$\n#### 30", "$12 + 18 = 30$\n#### 30"),
        ("$\\phantom{31}$\nTom has \\boxed{30} apples.", "$12 + 18$\nTom has \\boxed{30} apples.")],
    "a retraction after the answer": [
        ("#### 30\nActually it is 31.", "#### 30"),
        ("#### 30\n```\n# wait, it is 31\n```", "```\n# 12 + 18\n```\n#### 30"),
        ("Tom has \\boxed{30} apples.\n```\nno: 31\n```",
         "```\nprint(12 + 18)\n```\nTom has \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples, not 31.", "Tom has \\boxed{30} apples."),
        ("Tom has \\boxed{30} apples. Wait, no.", "Tom has \\boxed{30} apples.")],
    "restatements in the problem's words": [
        # What the first grammar refused and reads now beside the attack it must not let in.
        ("Tom bought \\boxed{30} apples, roughly.", "Tom bought \\boxed{30} apples."),
        ("So \\boxed{30} apples are not ripe, probably.", "So \\boxed{30} apples are not ripe.",
         "30", NOT_RIPE),
        ("He rang it \\boxed{30} times, give or take.", "He rang it \\boxed{30} times.", "30",
         TIMES),
        ("Tom had a total of about \\boxed{30} apples.", "Tom had a total of \\boxed{30} apples."),
        ("Tom buys \\boxed{30} apples, more or less.", "Tom buys \\boxed{30} more apples.")],
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
  path.write_text(json.dumps({"prompt": PROMPT, "answer": 30}) + "\n")
  return get_task(_task_cfg(name="jsonl", path=str(path))).verifier


def _cases(cases):
  return [(c, "30") if isinstance(c, str) else c for c in cases]


def _scores_beside(verifier, cases, neighbour):
  """Scores of `cases`, each scored in one batch beside a neighbour response for the same
  problem (`neighbour(gold)`)."""
  problems, responses = [], []
  for response, gold in cases:
    problem = Problem(f"q{len(problems)}", PROMPT, answer=gold)
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


@pytest.mark.parametrize("name", sorted(TWINS))
def test_each_attack_scores_zero_and_its_honest_twin_one(verifier, name):
  cases = [case if len(case) == 4 else (*case, "30", PROMPT) for case in TWINS[name]]
  problems = [Problem(f"q{i}", prompt, answer=gold) for i, (_, _, gold, prompt) in enumerate(cases)]
  responses = [response for case in cases for response in case[:2]]
  scores = verifier.score_batch([p for p in problems for _ in range(2)], responses)
  assert {c[0]: s for c, s in zip(cases, scores[0::2]) if s} == {}
  assert {c[1]: s for c, s in zip(cases, scores[1::2]) if s != 1.0} == {}


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
