"""Phase times of the on-policy loop (docs/training.md#verification-overlapped-with-decoding):
when the device had work queued, and verification calls that run beside decoding.

* `busy_seconds` — the measure of the union of [dispatch, completion] intervals, clipped to a
  window (a pure function).
* `DeviceTimeline` — records each device program's dispatch time on the loop's thread and its
  completion time on a waiter thread (`jax.block_until_ready` on the program's output), so host
  work on the loop's thread does not delay the completion's timestamp.
* `VerifyCalls` — starts a verification without waiting for it: the verifier's own
  `submit(problems, responses) -> Future[list[float]]`, else `score_batch` on a one-thread pool;
  each call's future also gives its wall time.
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, Iterable, Sequence

import jax


def busy_seconds(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
  """Seconds of [start, end] covered by at least one of `intervals` ((begin, finish) pairs;
  overlapping ones count once, the parts outside the window not at all)."""
  clipped = sorted((max(a, start), min(b, end)) for a, b in intervals)
  total, reach = 0.0, start
  for a, b in clipped:
    lo = max(a, reach)
    if b > lo:
      total += b - lo
    reach = max(reach, b)
  return total


def _completed_at(out) -> float:
  jax.block_until_ready(out)
  return time.perf_counter()


class DeviceTimeline:
  """[dispatch, completion] of the device programs of one iteration. The waiter thread is the
  loop's (`waiter`, one thread: the programs of one device complete in their dispatch order)."""

  def __init__(self, waiter: concurrent.futures.Executor):
    self.waiter = waiter
    self.pending: list[tuple[str, float, concurrent.futures.Future]] = []

  def run(self, name: str, fn: Callable, *args, watch: Callable = lambda out: out):
    """fn(*args), its dispatch time recorded and its output (`watch(out)`: the part that is not
    donated to a later program) watched for completion."""
    start = time.perf_counter()
    out = fn(*args)
    self.pending.append((name, start, self.waiter.submit(_completed_at, watch(out))))
    return out

  def intervals(self) -> list[tuple[str, float, float]]:
    """(name, dispatched, completed) of every program run so far (waits for them)."""
    return [(name, start, done.result()) for name, start, done in self.pending]


def _timed(score_batch: Callable, problems, responses) -> tuple[list[float], float]:
  start = time.perf_counter()
  scores = score_batch(problems, responses)
  return scores, time.perf_counter() - start


class VerifyCalls:
  """Verification calls that run while the loop goes on (`submit`); `close` ends the pool."""

  def __init__(self, verifier: Any):
    self.verifier = verifier
    self.own_submit = callable(getattr(verifier, "submit", None))
    self.pool = (None if self.own_submit else
                 concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="orl-verify"))

  def submit(self, problems: Sequence, responses: Sequence[str]) -> concurrent.futures.Future:
    """Future[(scores, seconds the call took)] of `verifier` on (problems, responses)."""
    if self.pool is not None:
      return self.pool.submit(_timed, self.verifier.score_batch, problems, responses)
    start = time.perf_counter()
    out: concurrent.futures.Future = concurrent.futures.Future()
    inner = self.verifier.submit(problems, responses)

    def done(f: concurrent.futures.Future) -> None:
      if f.exception() is not None:
        out.set_exception(f.exception())
      else:
        out.set_result((f.result(), time.perf_counter() - start))

    inner.add_done_callback(done)
    return out

  def close(self) -> None:
    if self.pool is not None:
      self.pool.shutdown(wait=True)
