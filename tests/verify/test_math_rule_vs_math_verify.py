"""The math grammar beside math-verify, HuggingFace's maintained answer verifier, on responses
that are right: every GSM8K test solution and tiny-task target must read as its gold under both,
but where math-verify reads a number from the working instead of the `####` answer; and GSM8K's
own final sentences with the gold number boxed in place, which the grammar reads where their
words are the problem's (in any of their forms) or listed, and whose every refusal is listed here
by class.
benchmarks/math_rule_vs_math_verify.py runs the whole comparison (the attack tables too) and
docs/verifier.md classifies every disagreement.

math-verify is a test-only reference (`make venv` installs it beside torch and transformers):
it is imported plainly, so a venv without it fails here rather than skipping the comparison.
The library itself never imports it."""
import gzip
import json
import pathlib
import re

from math_verify import parse, verify

from orl_jax.data import gsm8k, tiny_task
from orl_jax.verify.math_answer import answers_match

ROOT = pathlib.Path(__file__).resolve().parents[2]
# GSM8K solutions whose working math-verify reads instead of their `####` answer (`33.333...%,
# which rounds down to 33%`, `$<<4+2=6.00>>6.00`, `<<26+15=41>>41 points`, `<<28/7=4>>4 weeks`).
MATH_VERIFY_READS_THE_WORKING = {226, 258, 876, 1303}
# Boxed gold sentences (of 1,276) the grammar refuses, by class (docs/verifier.md): a piece of
# each sentence. The denylist rule refused 117 of them, the grammar's first version 71.
NOT_THE_PROBLEMS_WORD = "a word the problem does not use"
REFUSED_BOXED_SENTENCES = {
    # A word the problem never uses, after the box or as the verb before it: an allowlist of the
    # problem's words cannot tell `at the gardening store` from `at a stretch`.
    NOT_THE_PROBLEMS_WORD: [
        "bolts of fabric", "on these activities", "Sylas adds four", "to make the chicken",
        "for his friends", "= \\boxed{123} students", "to put in all", "training sessions",
        "5 minutes sooner", "of different colors", "the full house", "year gap",
        "candies originally", "beans difference", "dollars change", "\\boxed{1050} orders",
        "\\boxed{80} short", "grand-babies", "\\boxed{1000} voters", "people remain",
        "goats added", "5*56 = \\boxed{280} students", "of run time", "kilometers to travel",
        "who reached", "gardening store", "favorite route", "rest of the money",
        "days to complete", "cm long", "to create enough", "is responsible for", "from the sales",
        "medicine contained"],
    # The box is an operand or part of another number, not what the sentence states.
    "a box inside an expression": [
        "40-\\boxed{20} = $20.00", "because \\boxed{1600} > 1200", "10 - \\boxed{4} = 6",
        "1/\\boxed{3} pound", "\\boxed{2}:00 pm"],
    # `to` and `by` before a box relate it (`up to 30`, `by 30`), as `rounds down to` does here.
    "a lead that relates the box": ["rounds down to \\boxed{33}", "intake by \\boxed{16}"],
    "a hedge or negation word earlier on the line": [
        "Most of the cars", "eggs were not found", "who didn't use exit A"],
    # Not the problem's or the working's number, or after a word that is no NUMBER_LEADS word.
    "a second number the rule cannot place": [
        "in the two weeks", "old 4 years from now", "to be 600 inches", "to clean 45 rooms"],
    "a comparative away from the number": ["per day more than he consumes"],
}


def gsm8k_boxed_sentences() -> list[tuple[str, str, str]]:
  """(response, gold, question): each GSM8K test solution's final sentence (the last line of its
  working, calculator annotations `<<...>>` dropped) with the last occurrence of its gold number
  boxed in place, for the solutions whose final sentence holds the gold number."""
  with gzip.open(gsm8k.TEST_FILE, "rt") as f:
    docs = [json.loads(line) for line in f]
  cases = []
  for doc in docs:
    working, gold = doc["answer"].rsplit("####", 1)
    gold = gold.strip().replace(",", "")
    line = re.sub(r"<<[^>]*>>", "", working.strip().split("\n")[-1])
    numbers = [m for m in re.finditer(r"(?<![\d.,])\d[\d,]*(?:\.\d+)?(?!\d)", line)
               if m.group().replace(",", "") == gold]
    if numbers:
      at = numbers[-1]
      cases.append((line[:at.start()] + "\\boxed{" + at.group() + "}" + line[at.end():], gold,
                    doc["question"]))
  return cases


def _math_verify(response: str, gold: str) -> bool:
  return bool(verify(parse(gold), parse(response)))


def test_every_gsm8k_solution_reads_as_its_gold():
  with gzip.open(gsm8k.TEST_FILE, "rt") as f:
    solutions = [json.loads(line)["answer"] for line in f]
  golds = [s.rsplit("####", 1)[1].strip() for s in solutions]
  assert len(solutions) == 1319
  assert [i for i, (s, g) in enumerate(zip(solutions, golds)) if not answers_match(s, g)] == []
  theirs = {i for i, (s, g) in enumerate(zip(solutions, golds)) if not _math_verify(s, g)}
  assert theirs == MATH_VERIFY_READS_THE_WORKING


def test_gsm8k_final_sentences_boxed_in_place_read_as_their_gold():
  cases = gsm8k_boxed_sentences()
  assert len(cases) == 1276
  refused = [r for r, g, q in cases if not answers_match(r, g, q)]
  pieces = [piece for listed in REFUSED_BOXED_SENTENCES.values() for piece in listed]
  matched = {r: [p for p in pieces if p in r] for r in refused}
  assert {r: found for r, found in matched.items() if len(found) != 1} == {}   # one class each
  assert sorted(p for found in matched.values() for p in found) == sorted(pieces)
  assert len(refused) == 49
  # The problem's words only ever add readings: what reads without them reads with them.
  assert {r for r, g, _ in cases if answers_match(r, g)} <= {
      r for r, g, q in cases if answers_match(r, g, q)}
  theirs = sum(_math_verify(r, g) for r, g, _ in cases)
  assert theirs >= 1270


def test_every_tiny_task_target_reads_as_its_gold():
  cfg = tiny_task.TinyTaskConfig()
  problems = [tiny_task.train_problem(i, cfg) for i in range(500)]
  assert all(answers_match(p.target, str(p.answer)) for p in problems)
  assert all(_math_verify(p.target, str(p.answer)) for p in problems)


def test_the_library_never_imports_math_verify():
  sources = [p for folder in ("orl_jax", "orl_sandbox", "launch") for p in
             (ROOT / folder).rglob("*.py")]
  assert len(sources) > 50
  assert [str(p) for p in sources if "math_verify" in p.read_text()] == []
