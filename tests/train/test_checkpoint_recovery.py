"""Damaged checkpoints and clean logs after resume (docs/training.md#resume-and-changed-settings).

A damaged newest checkpoint (each kind of file Orbax and grain write, truncated) is moved aside
with one warning naming the file, and the run resumes bit-exactly from the previous step; after
a resume `metrics.jsonl` and TensorBoard hold every step once. The kill test SIGKILLs a real
ORL run at random points (checkpoints every other step, rollout snapshots on).
"""
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from orl_jax.storage.checkpoint import Checkpointer, CheckpointRestoreError, abstract_like
from orl_jax.metrics import MetricsWriter, read_jsonl
from orl_jax.train.entry import train
from tests.support.helpers import (CHECKPOINT_FILE_KINDS, KILLED_ORL_STEPS, killed_orl_config,
                           tensorboard_scalars, truncate_half)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(step):
  # arrays above OCDBT's 1 KiB inline limit, so they live in data files
  return {"w": jax.random.normal(jax.random.key(step), (64, 64), jnp.float32),   # incompressible
          "b": jnp.arange(512, dtype=jnp.int32) * step, "step": jnp.int32(step)}


def _data_iter():
  return iter(grain.MapDataset.range(1000).batch(4))


def _two_checkpoints(directory):
  """Checkpoints of steps 1 and 2, with the data iterator one batch further each step."""
  ckpt = Checkpointer(str(directory), every=1, keep=2)
  it = _data_iter()
  for step in (1, 2):
    next(it)
    ckpt.save(step, _state(step), it)
  ckpt.close()
  return Checkpointer(str(directory), every=1, keep=2)


@pytest.mark.parametrize("kind", list(CHECKPOINT_FILE_KINDS))
def test_damaged_newest_checkpoint_is_moved_aside_and_the_previous_one_restores(
    tmp_path, caplog, kind):
  ckpt = _two_checkpoints(tmp_path / "checkpoints")
  damaged = CHECKPOINT_FILE_KINDS[kind](ckpt.step_dir(2))
  truncate_half(damaged)
  it = _data_iter()
  with caplog.at_level(logging.WARNING):
    step, state, _ = ckpt.restore_latest(abstract_like(_state(0)), it)
  assert step == 1
  for k, v in _state(1).items():
    np.testing.assert_array_equal(np.asarray(state[k]), np.asarray(v), err_msg=k)
  assert next(it).tolist() == [4, 5, 6, 7]                    # the data stream of step 1
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1, warnings
  assert "step 2" in warnings[0] and "resuming from step 1" in warnings[0]
  named = damaged if kind != "array data" else os.path.join(ckpt.step_dir(2), "state")
  assert named in warnings[0], warnings[0]
  aside = tmp_path / "checkpoints-corrupt" / "2"                # moved, never deleted
  assert aside.is_dir() and not os.path.exists(ckpt.step_dir(2))
  assert ckpt.manager.all_steps() == [1]
  ckpt.close()


def test_when_every_checkpoint_is_damaged_the_run_starts_over(tmp_path, caplog):
  ckpt = _two_checkpoints(tmp_path / "checkpoints")
  for step in (1, 2):
    truncate_half(CHECKPOINT_FILE_KINDS["_METADATA"](ckpt.step_dir(step)))
  it = _data_iter()
  with caplog.at_level(logging.WARNING):
    step, state, _ = ckpt.restore_latest(abstract_like(_state(0)), it)
  assert (step, state) == (0, None)
  assert next(it).tolist() == [0, 1, 2, 3]                    # the stream from its start
  assert sum(r.levelno == logging.WARNING for r in caplog.records) == 2
  assert sorted(os.listdir(tmp_path / "checkpoints-corrupt")) == ["1", "2"]
  ckpt.close()


def test_a_changed_model_is_an_error_and_moves_nothing(tmp_path):
  ckpt = _two_checkpoints(tmp_path / "checkpoints")
  other = dict(_state(0), w=jnp.zeros((32, 64), jnp.float32))
  with pytest.raises(CheckpointRestoreError, match="use a new config.workdir"):
    ckpt.restore_latest(abstract_like(other), _data_iter())
  assert ckpt.manager.all_steps() == [1, 2]
  assert not os.path.exists(tmp_path / "checkpoints-corrupt")
  ckpt.close()


# ------------------------------------------------------------------- logs after a resume


def test_metrics_writer_keeps_each_step_once_after_a_resume(tmp_path):
  w = MetricsWriter(str(tmp_path), resume_step=0)
  for step in (1, 2, 3):
    w.write(step, {"loss": float(step)})
  w.close()
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 4, "lo')                                  # killed mid-write
  w = MetricsWriter(str(tmp_path), resume_step=2)               # restored step 2
  for step in (3, 4):
    w.write(step, {"loss": 10.0 + step})
  w.close()
  rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]
  assert tensorboard_scalars(str(tmp_path / "tensorboard" / "metrics"), "loss") == [1, 2, 3, 4]


# ------------------------------------------------------------- SIGKILL at random points

_RUN = textwrap.dedent("""
  import sys
  from orl_jax.train.entry import train
  from tests.support.helpers import killed_orl_config
  train(killed_orl_config(sys.argv[1]), progress=False)
  print("FINISHED")
""")


def _logged_steps(workdir):
  try:
    return len(read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  except (ValueError, OSError):
    return 0


@pytest.mark.slow
def test_orl_killed_at_random_points_resumes_bit_exactly_with_clean_logs(tmp_path):
  straight = train(killed_orl_config(tmp_path / "a"), progress=False)
  workdir = str(tmp_path / "b")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             # restarts reuse the compiled programs (same executables, so the same bits)
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  rng = random.Random(0)
  kills, logged_past_checkpoint, finished = 0, 0, False
  for _attempt in range(12):
    proc = subprocess.Popen([sys.executable, "-c", _RUN, workdir], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # kill inside the next step or two: once one more step is logged, after a random delay
    # (none the first time: step 1 is logged and not checkpointed, so its row must go)
    target = min(_logged_steps(workdir) + 1, KILLED_ORL_STEPS)
    while proc.poll() is None and _logged_steps(workdir) < target:
      time.sleep(0.05)
    if kills < 4 and proc.poll() is None:
      time.sleep(rng.uniform(0.0, 2.0) if kills else 0.0)
      if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += 1
        folder = os.path.join(workdir, "checkpoints")
        saved = [int(d) for d in os.listdir(folder) if d.isdigit()] if os.path.isdir(folder) else []
        logged_past_checkpoint += _logged_steps(workdir) > max(saved, default=0)
        continue
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    finished = "FINISHED" in out
    if finished:
      break
  assert finished and kills >= 3 and logged_past_checkpoint >= 1, (finished, kills,
                                                                     logged_past_checkpoint)
  a = load_file(os.path.join(straight, "params.safetensors"))
  b = load_file(os.path.join(workdir, "params", "params.safetensors"))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == list(range(1, KILLED_ORL_STEPS + 1))
  assert all(r["policy_lag"] == 0 and r["rollout_uses"] == 1 for r in rows)
  assert tensorboard_scalars(os.path.join(workdir, "tensorboard", "metrics"),
                             "loss") == list(range(1, KILLED_ORL_STEPS + 1))
