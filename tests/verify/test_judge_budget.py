"""The judge's CPU limit is each phase's own (docs/verifier.md#what-a-test-may-use).

The judge runs a task's tests twice for one sample: once to collect the calls the tests make
(against a stand-in), once to replay them with the sample's answers. Each phase is its own
contained process with its own `judge_cpu_s`, so an honest test whose own work costs most of
that limit is judged as in-process Python would judge it, although the two phases together cost
more than one limit; a test that costs more than the limit in one phase is the sample's
timeout, its cost reported.
"""
import sys
import time

import pytest

from orl_jax.problem import Problem
from orl_jax.verify.humaneval import HumanEvalVerifier
from orl_sandbox import launcher as sandbox
from tests.verify.test_judge_semantics import check_program, in_process

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux-only")

_PROMPT = "def f(x):\n"
_RIGHT = "    return x + 1\n"
_LIMITS = sandbox.SandboxLimits(timeout_s=30.0, judge_cpu_s=2)


def _spin(n: int) -> int:
  s = 0
  for i in range(n):
    s += i * i % 7
  return s


def _iterations_for(cpu_s: float) -> int:
  """Iterations of `_spin`'s loop that cost about `cpu_s` of this interpreter's CPU time."""
  n, spent = 200_000, 0.0
  while spent < 0.2:
    n *= 2
    start = time.process_time()
    _spin(n)
    spent = time.process_time() - start
  return int(n * cpu_s / spent)


def _heavy_tests(n: int) -> str:
  return ("def check(candidate):\n  s = 0\n"
          f"  for i in range({n}):\n    s += i * i % 7\n"
          "  assert candidate(1) == 2\n  assert candidate(s % 7 + 1) == s % 7 + 2\n")


def test_each_phase_has_its_own_cpu_limit():
  """Tests costing about 60% of the limit in each phase: in-process they pass, the judge
  passes them too, and its reported CPU time is above one phase's limit."""
  tests = _heavy_tests(_iterations_for(0.6 * _LIMITS.judge_cpu_s))
  assert in_process([check_program(_PROMPT, _RIGHT, tests, "f")]) == ["pass"]
  with HumanEvalVerifier(_LIMITS, parallelism=1) as verifier:
    result = verifier.run(Problem("heavy", _PROMPT, tests=tests, entry_point="f"), _RIGHT)
  assert result.verdict == "pass" and result.infra_error is None, result.detail
  assert result.judge_cpu_s is not None and result.judge_cpu_s > _LIMITS.judge_cpu_s


def test_a_phase_past_the_limit_is_the_samples_timeout_not_an_infrastructure_error():
  """Tests costing twice the limit in one phase: the judge's CPU limit ends the collection and
  the sample is timed out, as a test looping on an answer is (no infrastructure error); the
  cost reported is about one limit, not the tests' own."""
  tests = _heavy_tests(_iterations_for(2.0 * _LIMITS.judge_cpu_s))
  with HumanEvalVerifier(_LIMITS, parallelism=1) as verifier:
    result = verifier.run(Problem("heavier", _PROMPT, tests=tests, entry_point="f"), _RIGHT)
  assert not result.passed and result.timed_out and result.infra_error is None
  assert "CPU limit" in result.detail, result.detail
  assert result.judge_cpu_s is not None and result.judge_cpu_s < 2.0 * _LIMITS.judge_cpu_s


def test_a_phase_past_the_limit_inside_c_is_the_samples_timeout_too():
  """Tests whose collection spends its time in one long C computation (a huge power, where no
  signal handler runs until it returns): the hard CPU limit kills the collector, and that is
  still the sample's timeout, not an infrastructure error."""
  tests = ("def check(candidate):\n  x = 3 ** 40_000_000\n  y = x * x * x\n"
           "  assert candidate(1) == 2\n")
  limits = sandbox.SandboxLimits(timeout_s=30.0, judge_cpu_s=1)
  with HumanEvalVerifier(limits, parallelism=1) as verifier:
    result = verifier.run(Problem("c_heavy", _PROMPT, tests=tests, entry_point="f"), _RIGHT)
  assert not result.passed and result.timed_out and result.infra_error is None, result.detail
  assert "CPU limit" in result.detail, result.detail
