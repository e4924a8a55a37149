"""Every launcher and benchmark script starts as documented (`python launch/X.py`, `python
benchmarks/X.py`): `--help` prints its usage with no traceback, in a fresh interpreter whose
only path entry is the script's folder (a script that imports the repository's packages must
put the repository on sys.path itself)."""
import concurrent.futures
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(p for p in glob.glob(os.path.join(ROOT, "launch", "*.py"))
                 + glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))
                 if not os.path.basename(p).startswith("_"))


def _help(path: str) -> tuple[str, int, str]:
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  out = subprocess.run([sys.executable, path, "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(env, JAX_PLATFORMS="cpu"))
  return path, out.returncode, out.stdout + out.stderr


@pytest.fixture(scope="module")
def helps():
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    return {os.path.relpath(p, ROOT): (rc, text) for p, rc, text in pool.map(_help, SCRIPTS)}


def test_there_are_scripts():
  assert len(SCRIPTS) > 15 and any(p.endswith("launch/train.py") for p in SCRIPTS)


@pytest.mark.parametrize("script", [os.path.relpath(p, ROOT) for p in SCRIPTS])
def test_the_script_starts(helps, script):
  rc, text = helps[script]
  assert "Traceback" not in text, text[-3000:]
  # argparse exits 0 after its help; absl's launchers print theirs and exit 1
  assert rc in (0, 1) and ("usage" in text.lower() or "flags" in text.lower()), text[-3000:]
