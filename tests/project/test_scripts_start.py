"""Every launcher and benchmark script starts as documented (`python launch/X.py`, `python
benchmarks/X.py`): `--help` prints its usage with no traceback, in a fresh interpreter whose
only path entry is the script's folder (a script that imports the repository's packages must
put the repository on sys.path itself). tests/scripts/start_each_script.py starts each in a
child forked from a process that holds only the third-party modules (JAX's import paid once)."""
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(p for p in glob.glob(os.path.join(ROOT, "launch", "*.py"))
                 + glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
                 if not os.path.basename(p).startswith("_"))


@pytest.fixture(scope="module")
def helps():
  """{script: (return code, output)} of `python SCRIPT --help` for every script of SCRIPTS."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  out = subprocess.run([sys.executable, "tests/scripts/start_each_script.py", *SCRIPTS],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(env, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  results = [json.loads(line) for line in out.stdout.splitlines()]
  assert len(results) == len(SCRIPTS), out.stderr[-3000:]
  return {r["script"]: (r["returncode"], r["output"]) for r in results}


def test_there_are_scripts():
  assert len(SCRIPTS) > 15 and any(p.endswith("launch/train.py") for p in SCRIPTS)


@pytest.mark.parametrize("script", [os.path.relpath(p, ROOT) for p in SCRIPTS])
def test_the_script_starts(helps, script):
  rc, text = helps[script]
  assert "Traceback" not in text, text[-3000:]
  # argparse exits 0 after its help; absl's launchers print theirs and exit 1
  assert rc in (0, 1) and ("usage" in text.lower() or "flags" in text.lower()), text[-3000:]
