"""The strict math rule beside math-verify, HuggingFace's maintained answer verifier, on responses
that are right: every GSM8K test solution and tiny-task target must read as its gold under both,
but where math-verify reads a number from the working instead of the `####` answer.
benchmarks/math_rule_vs_math_verify.py runs the whole comparison (the attack tables too) and
docs/verifier.md classifies every disagreement.

math-verify is a test-only reference (`make venv` installs it beside torch and transformers):
it is imported plainly, so a venv without it fails here rather than skipping the comparison.
The library itself never imports it."""
import gzip
import json
import pathlib

from math_verify import parse, verify

from orl_jax.data import gsm8k, tiny_task
from orl_jax.verify.math_answer import answers_match

ROOT = pathlib.Path(__file__).resolve().parents[2]
# GSM8K solutions whose working math-verify reads instead of their `####` answer (`33.333...%,
# which rounds down to 33%`, `$<<4+2=6.00>>6.00`, `<<26+15=41>>41 points`, `<<28/7=4>>4 weeks`).
MATH_VERIFY_READS_THE_WORKING = {226, 258, 876, 1303}


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
