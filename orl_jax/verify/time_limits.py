"""A code sample's time limits from its problem's reference solution
(docs/verifier.md#time-limits-from-a-reference-solution).

EvalPlus's rule: a problem with a reference solution (`Problem.solution`: HumanEval's canonical
solution, a JSONL `solution`) gives its samples `max(floor, k × the reference's measured time)`
seconds of CPU (`TimeRule`, from `task.verify_time_floor_s` and `task.verify_time_factor`),
with the wall timeout a margin above it (`humaneval.limits_for`); a problem without one keeps
the task's configured limits. `with_time_limits` runs the references when the task loads,
through the same sandbox and judge as a sample (`humaneval.judge_run`), the problems in
parallel. A run's time is its processes' CPU seconds (`SandboxResult.runner_cpu_s`: the
sandbox's own, the judge's and the sample's, so at least the sample's), which a loaded machine
stretches far less than the wall clock; where the rule's limit depends on it (k × time above the
floor) the figure is the median of `RUNS` runs. Measurements are kept for the process, by the
sha256 of what a run depends on, so a second load costs nothing. A reference that fails its own
tests is refused (`ReferenceSolutionError`, one sentence naming the problem and what failed).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import statistics
import threading
import time
from typing import Sequence

import orl_sandbox as sandbox
from orl_jax.errors import ConfigError
from orl_jax.problem import Problem
from orl_jax.verify.humaneval import WALL_MARGIN_S, fields_digest, judge_run
from orl_sandbox import launcher as sandbox_launcher

_log = logging.getLogger(__name__)

# Runs behind a figure the limit depends on (one run otherwise: the limit is the floor, and the
# run only shows that the reference passes).
RUNS = 3
# CPU seconds a reference may take while it is measured: room for a slow one (whose samples the
# rule then gives more than the configured CPU limit), and a bound on what a looping one costs
# the load.
MEASURE_CPU_S = 20


class ReferenceSolutionError(ConfigError):
  """A problem's reference solution fails its own tests; the message names the problem."""


@dataclasses.dataclass(frozen=True)
class TimeRule:
  """A sample's CPU seconds from its reference's: max(floor_s, factor × measured). A factor of 0
  turns the rule off (every problem keeps the configured limits, nothing is measured)."""
  factor: float
  floor_s: float

  def limit_s(self, measured_s: float) -> float:
    return max(self.floor_s, self.factor * measured_s)


class _HostFailure(Exception):
  """The sandbox infrastructure failed a reference's run (no verdict on the reference)."""


_measured: dict[str, list[float]] = {}   # reference_key -> CPU seconds of each passing run
_measured_lock = threading.Lock()


def reference_key(problem: Problem) -> str:
  """The digest of what a reference's run depends on."""
  return fields_digest((problem.prompt, problem.solution or "", problem.tests or "",
                        problem.entry_point or ""))


def measured_runs(problem: Problem) -> list[float]:
  """The CPU seconds of this process's runs of `problem`'s reference so far."""
  with _measured_lock:
    return list(_measured.get(reference_key(problem), ()))


def _failure(result: sandbox.SandboxResult, limits: sandbox.SandboxLimits) -> str:
  """What a failed run of a reference did, as a clause."""
  detail = " ".join(result.detail.split())[:200]
  if result.timed_out and detail.startswith("the sample ran past its CPU limit"):
    return f"it ran past the {limits.cpu_s} s of CPU a reference may take"
  if result.timed_out:
    return detail or f"it ran past the {limits.timeout_s:g} s wall timeout"
  if result.verdict == "unsupported":
    return f"the judge cannot replay its tests: {detail}"
  return detail or f"verdict {result.verdict!r}"


def _run_reference(problem: Problem, limits: sandbox.SandboxLimits) -> float:
  """CPU seconds of one passing run of `problem`'s reference; ReferenceSolutionError when it
  fails, _HostFailure when the sandbox failed twice."""
  assert problem.solution is not None
  for _ in range(2):
    try:
      result = judge_run(problem, problem.solution, limits)
    except OSError as error:   # e.g. no memory or pids left to start the sandbox
      infra = repr(error)
    else:
      if result.infra_error is None:
        break
      infra = result.infra_error
  else:
    raise _HostFailure(infra)
  if not result.passed:
    raise ReferenceSolutionError(_failure(result, limits))
  return result.runner_cpu_s if result.runner_cpu_s is not None else result.wall_s


def with_time_limits(problems: Sequence[Problem], rule: TimeRule,
                     limits: sandbox.SandboxLimits, workers: int,
                     source: str) -> list[Problem]:
  """`problems` with `time_limit_s` set on each one that has a reference solution and tests.

  Args:
    problems: a task's problems, in file order.
    rule: the limit from a measured time; factor 0 returns `problems` as they are.
    limits: the task's configured sample limits (a reference is measured under them, with a
      CPU limit of `MEASURE_CPU_S`).
    workers: references run at once.
    source: where the problems come from (the file), for the refusal's sentence.

  Raises:
    ReferenceSolutionError: a reference fails its own tests (the first in file order is named).
  """
  if rule.factor == 0:
    return list(problems)
  cpu_s = max(MEASURE_CPU_S, limits.cpu_s or 0)
  measure_limits = dataclasses.replace(limits, cpu_s=cpu_s, timeout_s=cpu_s + WALL_MARGIN_S,
                                       judge_cpu_s=sandbox_launcher.judge_cpu_s(limits))
  by_key = {reference_key(p): p for p in problems
            if p.solution is not None and p.tests is not None and p.entry_point is not None}
  failed: dict[str, str] = {}
  host_failed: set[str] = set()
  start = time.monotonic()

  def more_runs(key: str) -> int:
    runs = _measured.get(key, [])
    if not runs:
      return 1
    return RUNS - len(runs) if rule.factor * statistics.median(runs) > rule.floor_s else 0

  def run(key: str) -> None:
    try:
      cpu = _run_reference(by_key[key], measure_limits)
    except ReferenceSolutionError as error:
      failed.setdefault(key, str(error))
    except _HostFailure as error:
      host_failed.add(key)
      _log.warning("the sandbox failed the reference solution of %s twice (%s): its samples "
                   "keep the configured limits", by_key[key].problem_id, error)
    else:
      with _measured_lock:
        _measured.setdefault(key, []).append(cpu)

  ran = 0
  with concurrent.futures.ThreadPoolExecutor(max(1, workers),
                                             thread_name_prefix="reference-time") as pool:
    for _ in range(2):   # a first run of each, then more where the limit depends on the time
      if failed:
        break
      with _measured_lock:
        jobs = [key for key in by_key if key not in failed and key not in host_failed
                for _ in range(max(0, more_runs(key)))]
      ran += len(jobs)
      list(pool.map(run, jobs))
  if ran:
    _log.info("measured %d reference solutions (%d runs) in %.1f s", len(by_key), ran,
              time.monotonic() - start)
  if failed:
    first = next(p for p in problems if reference_key(p) in failed)
    others = len(failed) - 1
    also = (f"; so do the reference solutions of {others} other task"
            f"{'s' if others > 1 else ''}" if others else "")
    raise ReferenceSolutionError(
        f"{source}: task {first.problem_id!r}: its reference solution fails its own tests in "
        f"the sandbox ({failed[reference_key(first)]}){also}: fix the solution or the tests, or "
        "drop the item.")
  out = []
  for problem in problems:
    key = reference_key(problem)
    runs = measured_runs(problem) if key in by_key and key not in host_failed else []
    out.append(dataclasses.replace(problem, time_limit_s=rule.limit_s(statistics.median(runs)))
               if runs else problem)
  return out
