"""Stopping a training run on SIGINT (Ctrl-C) or SIGTERM (a preempted VM, a scheduler's stop)
without losing it (docs/training.md#interrupts-and-preemption).

A signal handler cannot save a checkpoint: it runs between two Python bytecodes of the main
thread, while JAX may still be computing the step it dispatched and Orbax may be writing the
previous checkpoint in its own threads. So inside a training loop the handler (`install`, set up
by `launch/train.py`) only records the request, and the loop stops at its next step boundary
(`StopPoints.check`): the step's state is complete there, its checkpoint is saved
synchronously (whatever `checkpoint.every` says) and waited for, and `Interrupted` carries the
step and the checkpoint to the launcher, which prints one line and exits with 128 + the signal
number (130 for SIGINT, 143 for SIGTERM: what a shell reports for a process the signal ended,
so a job script sees a stop, not a success). Outside a training loop (imports, set-up, the
demo's evaluations) there is no state to save: the handler prints the same kind of line and
ends the process at once, keeping what is finished (checkpoints, stages, evaluations). A second
signal while the stop is under way ends the process at once too; Orbax writes a checkpoint
under a temporary name and renames it when complete, so the newest complete checkpoint stays
the one a rerun resumes from.

With several processes every one checks at the same step boundary and they agree (the flag is
gathered from all of them) on whether to stop, so a signal that reaches one process stops all
of them at the same step instead of leaving the others waiting in a collective.
"""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
from typing import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
  """A training run stopped on a signal (a BaseException, as KeyboardInterrupt is, so that no
  `except Exception` on the way up takes it for an error). `step`: the step it stopped at (None:
  outside a training loop); `checkpoint`: the step of the checkpoint a rerun resumes from (None:
  none, the run starts over); `saved`: that checkpoint was written at the stop."""

  def __init__(self, signum: int, step: int | None = None, last: int | None = None,
               checkpoint: int | None = None, directory: str = "", saved: bool = False):
    super().__init__(signum, step, checkpoint)
    self.signum, self.step, self.last = signum, step, last
    self.checkpoint, self.directory, self.saved = checkpoint, directory, saved

  @property
  def exit_status(self) -> int:
    return 128 + self.signum

  def message(self, command: str) -> str:
    """The one line the launcher prints: where the run stopped, what is kept, how to go on."""
    name = signal.Signals(self.signum).name
    if self.step is None:
      return (f"interrupted ({name}) outside a training step: completed checkpoints, stages and "
              f"evaluations are kept; resume with: {command}")
    at = f"at step {self.step}" + ("" if self.last is None else f" of {self.last}")
    if self.checkpoint is None:
      kept = "no step taken, nothing to save"
    elif self.saved:
      kept = f"saved checkpoint {self.checkpoint} in {self.directory}"
    else:
      kept = f"checkpoint {self.checkpoint} in {self.directory} is kept (no step since)"
    return f"interrupted ({name}) {at}: {kept}; resume with: {command}"


def resume_command(argv: list[str] | None = None) -> str:
  """The command that started this process, to run again (it resumes)."""
  return "python " + shlex.join(sys.argv if argv is None else argv)


def stop_line(stop: Interrupted) -> str:
  """The line a launcher prints for `stop`, after its name (`train.py: interrupted ...`)."""
  return f"{os.path.basename(sys.argv[0])}: {stop.message(resume_command())}"


class _State:
  installed = False
  signum: int | None = None   # the first request's signal
  loops = 0                   # training loops running: they stop at their next step boundary


_state = _State()


def _exit_now(line: str, signum: int) -> None:
  """Ends the process from the signal handler. Not by raising: an exception raised in a
  handler surfaces wherever the main thread was, and where that is a garbage-collection
  callback or a `__del__` Python prints it and carries on."""
  sys.stdout.flush()
  sys.stderr.write(line + "\n")
  sys.stderr.flush()
  os._exit(128 + signum)


def _on_signal(signum, frame) -> None:
  del frame
  if _state.signum is not None:   # asked twice: stop now
    _exit_now(f"{os.path.basename(sys.argv[0])}: {signal.Signals(signum).name} again: stopped "
              f"at once, completed checkpoints are kept; resume with: {resume_command()}",
              signum)
  _state.signum = signum
  if not _state.loops:
    _exit_now(stop_line(Interrupted(signum)), signum)


def install() -> None:
  """Handles SIGINT and SIGTERM for the rest of the process (Python runs handlers in the main
  thread, between bytecodes): a request stops the running training loop at its next step
  boundary (`Interrupted`), or, outside one (imports, set-up, the demo's evaluations: nothing
  to save), the process at once, with the same kind of line. The project resumes from
  anything a SIGKILL leaves (tests/train/test_checkpoint_recovery.py), so stopping there at once is
  safe."""
  for signum in SIGNALS:
    signal.signal(signum, _on_signal)
  _state.installed = True


def request(signum: int) -> None:
  """Records a stop request as the handler does inside a training loop (tests)."""
  _state.signum = signum


def clear() -> None:
  """Forgets a request (tests; a process that trains again after a stop)."""
  _state.signum = None


def requested() -> int | None:
  """The signal a stop was requested with on this process or, with several processes, on any
  of them (a collective: every process calls it at the same step); None when none was."""
  if not _state.installed:
    return _state.signum
  import jax
  if jax.process_count() == 1:
    return _state.signum
  import numpy as np
  from jax.experimental import multihost_utils
  flags = multihost_utils.process_allgather(np.int32(_state.signum or 0))
  asked = [int(s) for s in np.ravel(flags) if s]
  return asked[0] if asked else None


class StopPoints:
  """The step boundaries of one training loop, where a requested stop is carried out."""

  def __init__(self, ckpt, start: int, last: int):
    self.ckpt, self.start, self.last = ckpt, start, last

  def check(self, step: int, state, data_iter, close: Callable[[], None],
            save: Callable[[int], None] | None = None) -> None:
    """At the boundary after `step` (`state` holds `step` steps, `data_iter` is where they left
    it): when a stop was requested, saves checkpoint `step` (`save(step)` when the loop saves
    its own way, else the state and `data_iter`) unless it is saved already (or no step was
    taken), waits for every save, calls `close` (the loop's progress bar and metrics) and
    raises Interrupted."""
    signum = requested()
    if signum is None:
      return
    save_now = step > self.start and self.ckpt.last_saved != step
    if save_now:
      if save is not None:
        save(step)
      else:
        self.ckpt.save(step, state, data_iter)
    self.ckpt.close()
    close()
    raise Interrupted(signum, step, self.last, step if step > 0 else None, self.ckpt.directory,
                      saved=save_now or self.ckpt.last_saved == step)


@contextlib.contextmanager
def training_loop(ckpt, start: int, last: int) -> Iterator[StopPoints]:
  """The span of a training loop: a signal in it waits for the next `StopPoints.check`. A
  request that comes after the last check (during the final step or the export) stops the
  process when the loop has finished, with its final checkpoint saved."""
  _state.loops += 1
  try:
    yield StopPoints(ckpt, start, last)
  finally:
    _state.loops -= 1
  signum = requested()
  if signum is not None:
    raise Interrupted(signum, last, last, last, ckpt.directory, saved=True)
