"""SIGINT and SIGTERM keep a training run (docs/training.md#interrupts-and-preemption): real
signals to `launch/train.py` in a subprocess stop it at the next step boundary with a checkpoint
(also under `checkpoint.every=0`), one line names the step and the command to resume, the exit
status is 128 + the signal's number, nothing else is printed, and the same command resumes
(`resumed from step K`) to the uninterrupted run's parameters, bit for bit. The demo resumes
the stage it was interrupted in. In-process: a stop before the first step, a stop right after a
resume, and a fresh start in a work directory that holds files but no checkpoint."""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from orl_jax.metrics import read_jsonl
from orl_jax.train import interrupt
from orl_jax.train.entry import train
from tests.support.helpers import orl_smoke_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABSL_LOG = re.compile(r"[IWEF]\d{4} |WARNING:")


def _env(tmp_path):
  # the runs of a test share compiled programs (the same executables: the same bits), and start
  # sooner
  return dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax"),
              JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def _train_args(*args) -> list[str]:
  return ["launch/train.py", *args]


def _run(args, tmp_path) -> subprocess.CompletedProcess:
  out = subprocess.run([sys.executable, *args], cwd=ROOT, env=_env(tmp_path),
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out


def _rows(path) -> int:
  try:
    return len(read_jsonl(path))
  except (OSError, ValueError):
    return 0


def _interrupt(args, tmp_path, metrics, rows: int, signum: int, group: bool):
  """Starts `args`, sends `signum` once `metrics` has `rows` rows (to the process group, as a
  terminal's Ctrl-C does, or to the process), returns (return code, stdout, stderr)."""
  proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(tmp_path),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)
  try:
    deadline = time.monotonic() + 300
    while proc.poll() is None and _rows(metrics) < rows and time.monotonic() < deadline:
      time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it was interrupted"
    if group:
      os.killpg(proc.pid, signum)
    else:
      proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.communicate()
  return proc.returncode, out, err


def _last_line(stderr: str) -> str:
  """The last line on stderr after the progress bars (which redraw with carriage returns)."""
  lines = [ln.rsplit("\r", 1)[-1] for ln in stderr.splitlines()]
  return [ln for ln in lines if ln.strip()][-1]


def _stop_line(stderr: str, signame: str, last: int, workdir, args) -> int:
  """Checks the interrupted run's last line and that nothing but progress bars and log lines
  came before it; returns the step it saved."""
  assert "Traceback" not in stderr, stderr[-3000:]
  line = _last_line(stderr)
  command = re.escape("python " + shlex.join(args))
  m = re.fullmatch(rf"train\.py: interrupted \({signame}\) at step (\d+) of {last}: saved "
                   rf"checkpoint (\d+) in {re.escape(str(workdir))}/checkpoints; resume with: "
                   rf"{command}", line)
  assert m and m.group(1) == m.group(2), line
  others = [ln for ln in stderr.splitlines()[:-1] if ln.strip() and not ABSL_LOG.match(ln)
            and "\r" not in ln and not ln.startswith(("sft:", "orl:"))]
  assert not others, others
  return int(m.group(1))


def _same_params(a_dir, b_dir):
  a = load_file(os.path.join(a_dir, "params", "params.safetensors"))
  b = load_file(os.path.join(b_dir, "params", "params.safetensors"))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _checkpoints(workdir) -> list[int]:
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def test_ctrl_c_saves_a_checkpoint_under_every_0_and_the_rerun_resumes_bit_exactly(tmp_path):
  """SFT on the smoke shapes, `checkpoint.every=0` (the `:debug` variants' policy): SIGINT to
  the process group saves the step it stops at, the only checkpoint."""
  steps = 60
  common = ["--config=configs/tiny.py:smoke", f"--config.train.steps={steps}",
            "--config.train.log_every=1", "--config.checkpoint.every=0"]
  straight, workdir = tmp_path / "straight", tmp_path / "run"
  _run(_train_args(*common, f"--config.workdir={straight}"), tmp_path)
  args = _train_args(*common, f"--config.workdir={workdir}")
  code, _, err = _interrupt(args, tmp_path, workdir / "metrics.jsonl", 3, signal.SIGINT,
                            group=True)
  assert code == 130, err[-3000:]
  step = _stop_line(err, "SIGINT", steps, workdir, args)
  assert 3 <= step < steps and _checkpoints(workdir) == [step]
  out = _run(args, tmp_path)
  assert f"resumed from step {step} ({workdir}/checkpoints)" in out.stdout.splitlines()
  _same_params(straight, workdir)
  assert [r["step"] for r in read_jsonl(str(workdir / "metrics.jsonl"))] == list(
      range(1, steps + 1))


def test_sigterm_stops_an_orl_run_at_an_iteration_boundary_and_it_resumes_bit_exactly(tmp_path):
  """A preempted VM's SIGTERM, to the process alone, on the ORL loop of `configs/llada.py:debug`
  (a tiny random MoE; its `checkpoint.every=0`)."""
  steps = 12
  common = ["--config=configs/llada.py:debug", f"--config.train.steps={steps}"]
  straight, workdir = tmp_path / "straight", tmp_path / "run"
  _run(_train_args(*common, f"--config.workdir={straight}"), tmp_path)
  args = _train_args(*common, f"--config.workdir={workdir}")
  code, _, err = _interrupt(args, tmp_path, workdir / "metrics.jsonl", 2, signal.SIGTERM,
                            group=False)
  assert code == 143, err[-3000:]
  step = _stop_line(err, "SIGTERM", steps, workdir, args)
  assert 2 <= step < steps and _checkpoints(workdir) == [step]
  out = _run(args, tmp_path)
  assert f"resumed from step {step} ({workdir}/checkpoints)" in out.stdout.splitlines()
  _same_params(straight, workdir)
  rows = read_jsonl(str(workdir / "metrics.jsonl"))
  assert [r["step"] for r in rows] == list(range(1, steps + 1))
  assert all(r["policy_lag"] == 0 and r["rollout_uses"] == 1 for r in rows)


# Slow (about 100 s on 2 loaded cores): each of its parts keeps a fast guard in the default run:
# a real SIGINT's checkpoint and bit-exact resume (the Ctrl-C test above), an ORL run's stop and
# resume (the SIGTERM test above), and a rerun of the demo that evaluates nothing again
# (tests/apps/test_demo_report.py).
@pytest.mark.slow
def test_an_interrupted_demo_resumes_the_stage_it_stopped_in(tmp_path):
  """The demo's ORL stage interrupted: the rerun keeps the evaluations already done and resumes
  the stage from its checkpoint, then finishes."""
  workdir = tmp_path / "demo"
  args = _train_args("--config=configs/tiny.py", f"--config.workdir={workdir}",
                     "--config.eval.n_problems=4", "--config.eval.batch_size=4",
                     "--config.eval.settings=('threshold_0.9',)",
                     "--config.demo.stages.orl.train.steps=6",
                     "--config.demo.stages.orl.train.log_every=1",
                     "--config.demo.stages.orl.train.warmup_steps=2")
  stage = workdir / "orl"
  code, _, err = _interrupt(args, tmp_path, stage / "metrics.jsonl", 2, signal.SIGINT,
                            group=True)
  assert code == 130 and "Traceback" not in err, err[-3000:]
  m = re.fullmatch(rf"train\.py: interrupted \(SIGINT\) at step (\d+) of 6: saved checkpoint "
                   rf"\1 in {re.escape(str(stage))}/checkpoints; resume with: .*",
                   _last_line(err))
  assert m, _last_line(err)
  out = _run(args, tmp_path)
  assert f"resumed from step {m.group(1)} ({stage}/checkpoints)" in out.stdout.splitlines()
  assert "evaluate base" not in out.stderr and "evaluate warmup" not in out.stderr  # kept
  assert "evaluate orl" in out.stderr and f"results: {workdir}/results.json" in out.stdout
  with open(workdir / "results.json") as f:
    assert sorted(json.load(f)) == ["base", "orl", "warmup"]


# --------------------------------------------------------------------- in-process stops


@pytest.fixture()
def stop_request():
  """Records a stop request as the signal handler does inside a training loop."""
  yield interrupt.request
  interrupt.clear()


def test_stops_before_a_step_keep_what_there_is_and_a_fresh_start_says_so(tmp_path, capsys,
                                                                          stop_request):
  config = orl_smoke_config(tmp_path / "w", steps=4)        # checkpoints every 2
  stop_request(signal.SIGTERM)
  with pytest.raises(interrupt.Interrupted) as e:
    train(config, progress=False)
  assert (e.value.step, e.value.checkpoint, e.value.exit_status) == (0, None, 143)
  assert e.value.message("python launch/train.py X") == (
      "interrupted (SIGTERM) at step 0 of 4: no step taken, nothing to save; resume with: "
      "python launch/train.py X")
  assert "resumed" not in capsys.readouterr().out
  interrupt.clear()
  train(config, progress=False, stop_after=2)               # the work directory now holds files
  out = capsys.readouterr().out
  assert out.startswith(f"fresh start at step 0 in a non-empty work directory: {tmp_path / 'w'} "
                        "holds checkpoints, config.json"), out
  stop_request(signal.SIGINT)
  with pytest.raises(interrupt.Interrupted) as e:
    train(config, progress=False)
  assert f"resumed from step 2 ({tmp_path / 'w' / 'checkpoints'})" in capsys.readouterr().out
  assert (e.value.step, e.value.checkpoint, e.value.saved) == (2, 2, False)
  assert e.value.message("C") == (f"interrupted (SIGINT) at step 2 of 4: checkpoint 2 in "
                                  f"{tmp_path / 'w' / 'checkpoints'} is kept (no step since); "
                                  "resume with: C")


# ------------------------------------------------------- the handler outside a step boundary

_STOPPER = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from orl_jax.train import interrupt
interrupt.install()
if sys.argv[1] == "loop":           # inside a training loop: the first signal waits, a second
  with interrupt.training_loop(None, 0, 10):      # ends the process at once
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    print("first signal recorded", interrupt.requested() == signal.SIGINT, flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
else:                               # outside one: the process ends at once
  print("ready", flush=True)
  time.sleep(60)
print("not stopped", flush=True)
"""


def test_outside_a_training_loop_or_on_a_second_signal_the_process_ends_at_once(tmp_path):
  """Set-up, imports and the demo's evaluations have nothing to save: the handler ends the
  process with the same kind of line, not by raising (which Python would swallow were it raised
  inside a garbage-collection callback). A second signal during a stop ends it too."""
  script = tmp_path / "stopper.py"
  script.write_text(_STOPPER.format(root=ROOT))
  proc = subprocess.Popen([sys.executable, str(script), "set-up"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  assert proc.stdout.readline() == "ready\n"
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 143 and out == "", (out, err)
  assert err == (f"stopper.py: interrupted (SIGTERM) outside a training step: completed "
                 f"checkpoints, stages and evaluations are kept; resume with: python {script} "
                 "set-up\n")
  twice = subprocess.run([sys.executable, str(script), "loop"], capture_output=True, text=True,
                         timeout=60)
  assert twice.returncode == 130 and twice.stdout == "first signal recorded True\n", twice
  assert twice.stderr == (f"stopper.py: SIGINT again: stopped at once, completed checkpoints "
                          f"are kept; resume with: python {script} loop\n")
