"""The math grammar beside math-verify, HuggingFace's maintained answer verifier, on responses
that are right: every GSM8K test solution and tiny-task target must read as its gold under both,
but where math-verify reads a number from the working instead of the `####` answer; and GSM8K's
own final sentences with the gold number boxed in place, which the grammar reads where their
words are the problem's, the working's or the listed ones.
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
# Boxed gold sentences (of 1,276) the grammar refuses: a word after the box that is neither the
# problem's, nor the working's, nor listed (55), a lead that is no link (`because \\boxed{1600}`,
# `reduce ... by \\boxed{16}`: 9), a character outside the sentence's alphabet (`M&M's`,
# `2}:00`: 4), a number that is not the problem's (3): 71.
# The denylist rule refused 117 of them.
REFUSED_BOXED_SENTENCES = 71


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
  assert len(refused) == REFUSED_BOXED_SENTENCES
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
