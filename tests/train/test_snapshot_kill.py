"""A kill while a rollout snapshot is written (docs/training.md#resume-and-changed-settings): the
snapshot of an iteration is written in the background while its update runs, so a SIGKILL can
land in the middle of the write. The unfinished snapshot stays a `*.orbax-checkpoint-tmp`
folder that no resume takes for a finished one, and the rerun re-rolls that iteration out to
the uninterrupted run's parameters, bit for bit.

The write is made slow and observable from outside the production code: a `sitecustomize.py`
the test puts on PYTHONPATH wraps Orbax's array writer so that, for the chosen snapshot only, it
touches a marker file and sleeps before writing; the test kills `launch/train.py` once the
marker is there.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from orl_jax.metrics import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, SLOW_STEP = 4, 2    # checkpoints at 2 and 4: the kill's resume starts at the slow step

# Wraps the array writer of the installed Orbax (orbax/checkpoint/_src/serialization/
# jax_array_handlers.py); only a process whose environment names the slow step is affected.
_SEAM = textwrap.dedent("""
  import asyncio, json, os
  _SLOW = json.loads(os.environ.get("ORL_TEST_SLOW_SNAPSHOT", "null"))
  if _SLOW is not None:
    from orbax.checkpoint._src.serialization import jax_array_handlers as _handlers
    _write = _handlers._async_serialize_replica_slices

    async def _slow_write(values, infos, args, **kwargs):
      folder = f"{os.sep}rollouts{os.sep}{_SLOW['step']}.orbax-checkpoint-tmp"
      if infos and folder in str(infos[0].parent_dir):
        open(_SLOW["marker"], "w").close()
        await asyncio.sleep(_SLOW["seconds"])
      return await _write(values, infos, args, **kwargs)

    _handlers._async_serialize_replica_slices = _slow_write
""")


def _env(tmp_path, slow=None):
  seam = tmp_path / "seam"
  seam.mkdir(exist_ok=True)
  (seam / "sitecustomize.py").write_text(_SEAM)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=f"{seam}{os.pathsep}{ROOT}",
             # the runs share compiled programs (the same executables: the same bits)
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  env.pop("ORL_TEST_SLOW_SNAPSHOT", None)
  if slow is not None:
    env["ORL_TEST_SLOW_SNAPSHOT"] = json.dumps(slow)
  return env


def _args(workdir) -> list[str]:
  return [sys.executable, "launch/train.py", "--config=configs/llada.py:debug",
          f"--config.train.steps={STEPS}", "--config.checkpoint.every=2",
          "--config.checkpoint.save_rollouts=True", f"--config.workdir={workdir}"]


def _run(workdir, env) -> str:
  out = subprocess.run(_args(workdir), cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def _wait_for(condition, proc, what: str, timeout_s: float = 300) -> None:
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert proc.poll() is None, f"the run ended before {what}"
    assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
    time.sleep(0.05)


def _kill_during_snapshot_write(workdir, env) -> None:
  """Starts the run and SIGKILLs it while snapshot SLOW_STEP is being written (after
  checkpoint SLOW_STEP, written before that iteration, is complete)."""
  marker = json.loads(env["ORL_TEST_SLOW_SNAPSHOT"])["marker"]
  proc = subprocess.Popen(_args(workdir), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    _wait_for(lambda: os.path.exists(marker), proc, "snapshot write")
    _wait_for(lambda: os.path.isdir(workdir / "checkpoints" / str(SLOW_STEP)), proc,
              f"checkpoint {SLOW_STEP}")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


@pytest.mark.slow
def test_a_kill_while_a_rollout_snapshot_is_written_resumes_bit_exactly(tmp_path):
  straight, workdir = tmp_path / "straight", tmp_path / "run"
  _run(straight, _env(tmp_path))
  slow = {"step": SLOW_STEP, "marker": str(tmp_path / "writing"), "seconds": 600}
  _kill_during_snapshot_write(workdir, _env(tmp_path, slow))

  # the write was cut short: the step's folder is still Orbax's temporary one
  rollouts = sorted(os.listdir(workdir / "rollouts"))
  assert f"{SLOW_STEP}.orbax-checkpoint-tmp" in rollouts and str(SLOW_STEP) not in rollouts, (
      rollouts)

  out = _run(workdir, _env(tmp_path))
  assert f"resumed from step {SLOW_STEP} ({workdir}/checkpoints)" in out.splitlines()
  rows = read_jsonl(str(workdir / "metrics.jsonl"))
  assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
  # the unfinished snapshot was not taken for a finished one: that iteration rolled out again
  assert [r["rollout_from_snapshot"] for r in rows] == [0.0] * STEPS
  assert all(r["policy_lag"] == 0 and r["rollout_uses"] == 1 for r in rows)
  assert sorted(os.listdir(workdir / "rollouts")) == [str(STEPS - 1)]
  a = load_file(str(straight / "params" / "params.safetensors"))
  b = load_file(str(workdir / "params" / "params.safetensors"))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
