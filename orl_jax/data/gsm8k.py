"""GSM8K test split (1319 problems), read offline from the file shipped with the package
(docs/models.md#real-tasks): `gsm8k_test.jsonl.gz`, byte for byte GSM8K's own `test.jsonl` (MIT
license and source in `GSM8K_LICENSE` beside it; its checksum is tested).

There is NO offline GSM8K *train* split: these are test problems, for evaluation only. Never
train on them; train real models on your own data (`data/jsonl.py`).
"""
from __future__ import annotations

import pathlib
import re
from typing import Callable

from orl_jax.data.jsonl import DatasetError, iter_jsonl
from orl_jax.problem import Problem
from orl_jax.verify.math_answer import canonical_number, final_answer

N_TEST = 1319
TEST_FILE = pathlib.Path(__file__).with_name("gsm8k_test.jsonl.gz")
# SHA-256 of the decompressed file: GSM8K's test.jsonl (openai/grade-school-math, 3101c7d).
TEST_SHA256 = "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"
_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")   # GSM8K's calculator annotations: `<<16-3=13>>`


def clean_solution(solution: str) -> str:
  """Drops the calculator annotations from a gold solution; keeps the final `#### N`."""
  return _CALCULATOR_RE.sub("", solution)


def load_gsm8k_test(path: str | pathlib.Path | None = None,
                    prompt_fn: Callable[[str], str] | None = None) -> list[Problem]:
  """The GSM8K test problems in file order (GSM8K's index).

  Args:
    path: a JSONL file (`.gz` read transparently) in GSM8K's format, one
      `{"question": str, "answer": str}` per line; None → the shipped test split.
    prompt_fn: maps a question to the model's prompt (e.g. `prompts.gsm8k_prompt`); None keeps
      the bare question.

  Returns:
    Problems with `problem_id` 'gsm8k-test-<index>' (0-based line order), `answer` the gold
    number as a canonical string ('1,600' → '1600'), `target` the gold solution without
    calculator annotations.
  """
  path = pathlib.Path(path) if path is not None else TEST_FILE
  problems: list[Problem] = []
  for line_number, doc in iter_jsonl(path):
    where = f"{path}:{line_number}"
    if not (isinstance(doc, dict) and isinstance(doc.get("question"), str)
            and isinstance(doc.get("answer"), str)):
      raise DatasetError(f"{where}: expected GSM8K's format, an object with string fields "
                         "'question' and 'answer'.")
    problems.append(_problem(len(problems), doc, where, prompt_fn))
  return problems


def _problem(index: int, doc: dict, where: str, prompt_fn: Callable[[str], str] | None) -> Problem:
  gold = final_answer(doc["answer"]) if "####" in doc["answer"] else None
  if gold is None:
    raise DatasetError(f"{where}: the gold solution does not end with '#### <number>'.")
  question = doc["question"]
  return Problem(problem_id=f"gsm8k-test-{index}",
                 prompt=prompt_fn(question) if prompt_fn else question,
                 target=clean_solution(doc["answer"]), answer=canonical_number(gold))
