"""A sample that burns CPU ends at its CPU limit, as a timeout, not at the wall timeout; one
that sleeps still ends at the wall timeout (docs/verifier.md#verifier-throughput)."""
import signal
import sys

import pytest

import orl_sandbox as sandbox
from orl_jax.problem import Problem
from orl_jax.verify.humaneval import HumanEvalVerifier
from orl_sandbox.runner import cpu_limit_line

linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")
PRELUDE = "def add(a, b):\n"
TESTS = "def check(candidate):\n  assert candidate(2, 3) == 5\n"
LOOP = "  while True:\n    pass\n"
SLEEP = "  import time\n  time.sleep(100)\n"


def test_only_a_sigkill_at_the_cpu_limit_is_the_cpu_limits_timeout():
  assert cpu_limit_line(-signal.SIGKILL, 2.0, 2) == (
      "timeout:the sample ran past its CPU limit (2 s of CPU)")
  assert cpu_limit_line(-signal.SIGKILL, 1.88, 2) is not None   # user + system: tick-sampled
  assert cpu_limit_line(-signal.SIGKILL, 0.3, 2) is None        # killed by something else
  assert cpu_limit_line(0, 2.5, 2) is None
  assert cpu_limit_line(-signal.SIGXCPU, 2.0, 2) is None


@linux_only
@pytest.mark.parametrize("judged", [True, False])
def test_a_busy_loop_is_timed_out_by_its_cpu_limit(judged):
  limits = sandbox.SandboxLimits(timeout_s=30.0, cpu_s=1)
  if judged:
    result = sandbox.run_judged(PRELUDE + LOOP, "add", tests=TESTS, prelude=PRELUDE,
                                limits=limits)
  else:
    result = sandbox.run_python("while True:\n  pass\n", limits=limits)
  assert result.timed_out and result.infra_error is None and not result.passed
  assert result.detail == "the sample ran past its CPU limit (1 s of CPU)"


@linux_only
def test_a_sleeping_sample_still_runs_to_the_wall_timeout():
  result = sandbox.run_judged(PRELUDE + SLEEP, "add", tests=TESTS, prelude=PRELUDE,
                              limits=sandbox.SandboxLimits(timeout_s=2.0, cpu_s=1))
  assert result.timed_out and "CPU limit" not in result.detail


@linux_only
def test_the_verifier_counts_and_caches_a_cpu_limit_like_a_timeout():
  problem = Problem("add", PRELUDE, tests=TESTS, entry_point="add")
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=30.0, cpu_s=1), parallelism=1,
                         slot_s=0) as verifier:
    assert verifier.score_batch([problem, problem], [LOOP, "  return a + b\n"]) == [0.0, 1.0]
    assert (verifier.stats.timeouts, verifier.stats.timeouts_cached) == (1, 0)
    assert verifier.score_batch([problem], [LOOP]) == [0.0]      # the second: cached
    assert (verifier.stats.timeouts, verifier.stats.timeouts_cached) == (2, 1)
    runs = verifier.stats.runs
    assert verifier.score_batch([problem], [LOOP]) == [0.0]
    assert verifier.stats.runs == runs


def test_training_verifies_code_with_the_task_cpu_limit(tmp_path):
  import json
  from configs import tiny
  from orl_jax.errors import ConfigError
  from orl_jax.tasks import get_task
  path = tmp_path / "code.jsonl"
  path.write_text(json.dumps({"id": "add", "prompt": PRELUDE, "entry_point": "add",
                              "tests": TESTS}) + "\n")
  c = tiny.get_config("smoke")
  c.task.name, c.task.path = "jsonl", str(path)
  task = get_task(c.task)
  assert task.verifier.code.inner.limits.cpu_s == 3     # the section's default
  task.verifier.code.inner.close()
  c.task.verify_cpu_s = 0
  with pytest.raises(ConfigError, match=r"task.verify_cpu_s=0 must be positive"):
    get_task(c.task)
