"""The judge contained without root (docs/verifier.md#threat-model).

A training process that is not root runs the sandbox through user namespaces: the sample and
the judge's children each get a namespace in which they hold no capability
(`judge-caps-dropped`), their own mount, network, IPC and UTS namespaces, Landlock and the
syscall filter. These tests run the verifier in a process whose uid is 1000 and which holds no
capability (a user namespace of its own, made with `unshare`), and check what the root tests of
tests/verify/test_sandbox_attacks.py check: honest and wrong samples judged, and a custom check that
evaluates, unpickles, executes, writes to or removes what a sample returns cannot touch a host
file.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.verify.test_sandbox_attacks import JUDGE_OPERATIONS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_UNSHARE = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]

# Runs in the unprivileged process: argv[1] = JSON {operation: [tests, hostile completion]};
# prints {"uid", "capabilities", operation: [[scores], detail, isolation]} as JSON.
_SCRIPT = r'''
import json, os, sys
sys.path.insert(0, os.getcwd())
from orl_jax.problem import Problem
from orl_jax.tasks import CodePromptVerifier
from orl_jax.verify.humaneval import HumanEvalVerifier
from orl_sandbox import launcher as sandbox

table = json.loads(sys.argv[1])
with open("/proc/self/status") as f:
  caps = [line.split()[1] for line in f if line.startswith("CapEff:")][0]
out = {"uid": os.getuid(), "capabilities": caps}
limits = sandbox.SandboxLimits(timeout_s=20.0)
with HumanEvalVerifier(limits, parallelism=2) as inner:
  for name, (tests, hostile) in table.items():
    problem = Problem("Custom/" + name, 'def echo(text):\n    """Returns text."""\n',
                      target="    return text\n", tests=tests, entry_point="echo")
    stack = CodePromptVerifier(inner, {problem.problem_id: problem})
    scores = stack.score_batch([problem, problem], [hostile, "    return text  # honest\n"])
    # a check outside the contract is not judged by the verifier; the judge's containment of
    # it is the sandbox's own (a problem run by the sandbox directly)
    result, honest = (sandbox.run_judged(problem.prompt + body + "\n", "echo", tests,
                                         prelude=problem.prompt, limits=limits)
                      for body in (hostile, "    return text  # honest\n"))
    out[name] = [scores, [float(result.passed), float(honest.passed)], result.detail,
                 list(result.isolation), result.infra_error]
print(json.dumps(out))
'''


def _unprivileged_available() -> bool:
  if sys.platform != "linux" or shutil.which("unshare") is None:
    return False
  probe = subprocess.run(_UNSHARE + ["id", "-u"], capture_output=True, text=True, check=False)
  return probe.returncode == 0 and probe.stdout.strip() == "1000"


pytestmark = pytest.mark.skipif(not _unprivileged_available(),
                                reason="needs Linux and unprivileged user namespaces (unshare)")


def _run_unprivileged(table: dict) -> dict:
  done = subprocess.run(_UNSHARE + [sys.executable, "-c", _SCRIPT, json.dumps(table)],
                        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 0, done.stderr[-4000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_root_a_check_that_runs_the_answer_cannot_touch_a_host_file(tmp_path):
  """Every operation of the root test's table, from a process without capabilities: the
  verifier refuses each such check (outside the contract), and run by the sandbox directly the
  host file stays, the attack fails and the honest neighbour passes; the judge's children report
  the layers of the unprivileged path."""
  target = tmp_path / "secret"
  target.write_text("keep")
  target.chmod(0o600)
  table = {}
  for name, (check, returned) in JUDGE_OPERATIONS.items():
    hostile = f"    P = {str(target)!r}\n    return {returned}  # {name}\n"
    table[name] = [f"def check(candidate):\n    {check}\n", hostile]
  table["wrong"] = ["def check(candidate):\n    assert candidate('a') == 'a'\n",
                    "    return text + '!'\n"]
  out = _run_unprivileged(table)
  assert out["uid"] == 1000 and int(out["capabilities"], 16) == 0
  for name in JUDGE_OPERATIONS:
    scores, judged, detail, isolation, infra = out[name]
    assert scores == [0.0, 0.0], (name, scores)   # refused at load: nothing is judged
    assert judged == [0.0, 1.0] and infra is None, (name, detail)
    assert "No such file" in detail or "Permission" in detail, (name, detail)
    assert {"judge-caps-dropped", "judge-mountns", "judge-netns", "judge-no-new-privs",
            "judge-seccomp"} <= set(isolation), (name, isolation)
  assert out["wrong"][0] == [0.0, 1.0] and out["wrong"][1] == [0.0, 1.0]
  assert out["wrong"][4] is None
  assert target.read_text() == "keep" and (target.stat().st_mode & 0o777) == 0o600
  assert os.listdir(tmp_path) == ["secret"]
