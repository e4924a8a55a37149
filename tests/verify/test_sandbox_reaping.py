"""The runner reaps every process it forks: a candidate that does not load (a syntax error)
never reaches the replay judge, whose child R used to leave behind at exit. An orphan goes to
the nearest subreaper or the host's init, which may reap it seconds later (on this project's
machines about 2 s) while the launcher's teardown waits for the sample's uid to own no process,
so every such sample held its worker and slot that long (docs/verifier.md#verifier-throughput).
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

# Run in a child process that is a subreaper: an orphan of the sandbox's processes is
# reparented to it (a zombie until it waits), so it can count them.
_SCRIPT = textwrap.dedent("""
    import ctypes, json, os, sys
    PR_SET_CHILD_SUBREAPER = 36
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    import orl_sandbox as sandbox
    prelude, tests = "def add(a, b):\\n", "def check(candidate):\\n  assert candidate(2, 3) == 5\\n"
    results = [sandbox.run_judged(prelude + body, "add", tests=tests, prelude=prelude)
               for body in sys.argv[1:]]
    orphans = []
    while True:
      try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
      except ChildProcessError:
        break
      if pid == 0:
        break
      orphans.append(pid)
    print(json.dumps([[r.verdict for r in results], [r.detail for r in results], len(orphans)]))
    """)


def test_a_sample_leaves_no_orphan_whatever_its_path():
  bodies = ["  x = 1 )(\n", "    return a + b\n", "    return a - b\n"]
  out = subprocess.run([sys.executable, "-c", _SCRIPT, *bodies],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  verdicts, details, orphans = json.loads(out.stdout.strip().splitlines()[-1])
  assert verdicts == ["fail", "pass", "fail"], out.stdout
  assert details[0].startswith("the candidate did not load"), details
  assert orphans == 0, out.stdout
