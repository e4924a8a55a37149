"""Shared helpers of the benchmarks: repo on sys.path, timing, JSON output."""
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def median_time(fn, repeats: int) -> tuple[float, list[float]]:
  """Median wall seconds of `fn()` over `repeats` runs (fn must block until done)."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times), times


def write_json(path: str, payload: dict) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(payload, f, indent=2)
  return path
