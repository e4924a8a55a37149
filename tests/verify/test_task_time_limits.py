"""A code sample's time limits from its problem's reference solution: max(floor, k × the
reference's measured time), the CPU limit below the wall limit, a failing reference refused at
load (docs/verifier.md#time-limits-from-a-reference-solution)."""
import dataclasses
import json
import re
import sys
import types

import pytest

import orl_sandbox as sandbox
from orl_jax.problem import Problem
from orl_jax.verify import time_limits
from orl_jax.verify.humaneval import WALL_MARGIN_S, HumanEvalVerifier, limits_for
from orl_jax.verify.time_limits import ReferenceSolutionError, TimeRule, with_time_limits

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")
PROMPT = "def add(a, b):\n"
TESTS = "def check(candidate):\n  assert candidate(2, 3) == 5\n"
RIGHT = "  return a + b\n"
LOOP = "  while True:\n    pass\n"
CONFIGURED = sandbox.SandboxLimits(cpu_s=3)   # the task section's default verify_cpu_s


def _problem(problem_id: str, solution: str | None = RIGHT) -> Problem:
  # the id in the prompt: each problem its own reference, whatever this process measured before
  return Problem(problem_id, f"# {problem_id}\n{PROMPT}", tests=TESTS, entry_point="add",
                 solution=solution)


@pytest.fixture
def stubbed_runs(monkeypatch):
  """Reference runs that take the CPU seconds listed per problem id, one per run, in turn (no
  sandbox); the ids of the runs made, in `calls`."""
  seconds: dict[str, list[float]] = {}
  calls: list[str] = []

  def run(problem, limits):
    calls.append(problem.problem_id)
    return seconds[problem.problem_id].pop(0)

  monkeypatch.setattr(time_limits, "_measured", {})
  monkeypatch.setattr(time_limits, "_run_reference", run)
  return types.SimpleNamespace(seconds=seconds, calls=calls)


def test_the_limit_is_the_floor_or_k_times_the_measured_time(stubbed_runs):
  stubbed_runs.seconds.update(fast=[0.2], slow=[0.9, 0.5, 0.6])
  problems = [_problem("fast"), _problem("slow"), _problem("none", solution=None)]
  timed = with_time_limits(problems, TimeRule(factor=4.0, floor_s=1.0), CONFIGURED, workers=2,
                           source="code.jsonl")
  # fast: 4 × 0.2 = 0.8 < 1, the floor (one run: the limit does not depend on it);
  # slow: 4 × 0.9 > 1, so two more runs, and 4 × median(0.9, 0.5, 0.6) = 2.4
  assert [p.time_limit_s for p in timed] == [1.0, pytest.approx(2.4), None]
  assert sorted(stubbed_runs.calls) == ["fast", "slow", "slow", "slow"]
  assert [dataclasses.replace(p, time_limit_s=None) for p in timed] == problems
  # measured once per process: a second load runs nothing
  again = with_time_limits(problems, TimeRule(factor=4.0, floor_s=1.0), CONFIGURED, workers=2,
                           source="code.jsonl")
  assert again == timed and len(stubbed_runs.calls) == 4
  # the sample's limits: ceil(2.4) = 3 s of CPU, the wall 7 s above, the configured judge limit
  slow = limits_for(timed[1], CONFIGURED)
  assert (slow.cpu_s, slow.timeout_s, slow.judge_cpu_s) == (3, 3 + WALL_MARGIN_S, 2)
  assert slow.cpu_s < slow.timeout_s
  assert limits_for(timed[0], CONFIGURED).cpu_s == 1


def test_a_problem_without_reference_keeps_the_configured_limits(stubbed_runs):
  bare = _problem("bare", solution=None)
  [kept] = with_time_limits([bare], TimeRule(4.0, 1.0), CONFIGURED, workers=1, source="f")
  assert kept.time_limit_s is None and limits_for(kept, CONFIGURED) is CONFIGURED
  # factor 0 turns the rule off: nothing is measured, every problem keeps the configured limits
  [off] = with_time_limits([_problem("off")], TimeRule(0.0, 1.0), CONFIGURED, workers=1,
                           source="f")
  assert off.time_limit_s is None and stubbed_runs.calls == []


@linux_only
def test_a_looping_sample_ends_at_its_cpu_limit_below_its_wall_limit():
  problem = dataclasses.replace(_problem("loop-cpu"), time_limit_s=1.0)
  limits = limits_for(problem, CONFIGURED)
  assert (limits.cpu_s, limits.timeout_s) == (1, 1 + WALL_MARGIN_S)
  with HumanEvalVerifier(CONFIGURED, parallelism=1, slot_s=0) as verifier:
    result = verifier.run(problem, LOOP)   # its problem's limits, not the configured 3 s
  assert result.timed_out and not result.passed and result.infra_error is None
  assert result.detail == "the sample ran past its CPU limit (1 s of CPU)"
  assert result.wall_s < limits.timeout_s


@linux_only
def test_a_jsonl_solution_that_fails_its_tests_is_refused_at_load(tmp_path):
  from orl_jax.tasks import get_task
  path = tmp_path / "code.jsonl"
  record = {"prompt": PROMPT, "entry_point": "add", "tests": TESTS}
  path.write_text(json.dumps({**record, "id": "right", "solution": RIGHT}) + "\n"
                  + json.dumps({**record, "id": "wrong", "solution": "  return a - b\n"}) + "\n")
  config = types.SimpleNamespace(name="jsonl", path=str(path), chat="none")
  with pytest.raises(ReferenceSolutionError, match="^" + re.escape(
      f"{path}: task 'wrong': its reference solution fails its own tests in the sandbox "
      "(AssertionError): fix the solution or the tests, or drop the item.") + "$"):
    get_task(config)
  path.write_text(json.dumps({**record, "id": "right", "solution": RIGHT}) + "\n"
                  + json.dumps({**record, "id": "no reference"}) + "\n")
  task = get_task(config)
  try:
    limits = {p.problem_id: p.time_limit_s for p in task.verifier.code.originals.values()}
    assert limits == {"right": 1.0, "no reference": None}   # the task section's floor
    right, bare = task.eval_problems()
    assert task.verifier.score_batch([right, bare], [RIGHT, RIGHT]) == [1.0, 1.0]
  finally:
    task.verifier.code.inner.close()


def test_time_rule_settings_are_checked():
  from orl_jax.errors import ConfigError
  from orl_jax.tasks import _time_rule
  assert _time_rule(types.SimpleNamespace()) == TimeRule(4.0, 1.0)   # the section's defaults
  with pytest.raises(ConfigError, match=r"task.verify_time_factor=-1.0 must be >= 0"):
    _time_rule(types.SimpleNamespace(verify_time_factor=-1))
  with pytest.raises(ConfigError, match=r"task.verify_time_floor_s=0.0 must be positive"):
    _time_rule(types.SimpleNamespace(verify_time_floor_s=0))
