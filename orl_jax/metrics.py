"""Metrics sinks: JSONL (one object per logged step) and TensorBoard event files.

Only process 0 writes. Values are converted to Python floats on the host at log time only.
A resumed run passes the step it restored: rows logged after that step by the killed run are
dropped from the JSONL, and TensorBoard purges its events after that step, so both hold each
step once and continue as one run.
"""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np


class MetricsWriter:

  def __init__(self, workdir: str, name: str = "metrics", *, resume_step: int | None = None):
    """`resume_step`: the step the run (re)starts from (0 for a fresh start); None appends."""
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, f"{name}.jsonl")
    self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      if resume_step is not None:
        truncate_jsonl(self.path, resume_step)
      from tensorboardX import SummaryWriter
      # one run directory; each (re)start adds an event file (named by second, so a
      # nanosecond suffix keeps a quick restart from overwriting the previous file)
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard", name),
                               purge_step=None if resume_step is None else resume_step + 1,
                               filename_suffix=f".{time.time_ns()}")

  def write(self, step: int, metrics: dict) -> dict:
    scalars = {k: float(np.asarray(v)) for k, v in metrics.items()
               if np.asarray(v).size == 1}
    if self.enabled:
      assert self._tb is not None, "opened by __init__ on process 0"
      with open(self.path, "a") as f:
        f.write(json.dumps({"step": int(step), **scalars}) + "\n")
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, int(step))
      self._tb.flush()
    return scalars

  def close(self):
    if self._tb is not None:
      self._tb.close()

# How TPF counts forwards, said wherever TPF is shown (bar, run summary, results table, page)
TPF_COUNT = ("TPF = generated tokens / forwards, the paper's count: every denoising forward "
             "plus one commit forward per decoded block, so a block that commits one token "
             "per forward has TPF below 1 (block size / (steps + 1))")
_tpf_explained = [False]   # TPF_COUNT printed by this process already


def tpf_explanation_once(prefix: str) -> str | None:
  """`prefix` + TPF_COUNT the first time a process asks, None after: the progress bars of a
  demo's several runs explain the count once."""
  if _tpf_explained[0]:
    return None
  _tpf_explained[0] = True
  return prefix + TPF_COUNT


def read_jsonl(path: str) -> list[dict]:
  """The rows of a metrics file; a last line cut short by a kill is skipped."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  rows = []
  for i, line in enumerate(lines):
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      if i != len(lines) - 1:
        raise ValueError(f"{path}:{i + 1} is not valid JSON") from None
  return rows


def truncate_jsonl(path: str, last_step: int) -> None:
  """Keeps the rows with step <= `last_step` (and drops a line cut short by a kill)."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = []
  for line in lines:
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    if int(row.get("step", 0)) <= last_step:
      kept.append(line if line.endswith("\n") else line + "\n")
  if len(kept) == len(lines):
    return
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    f.writelines(kept)
  os.replace(tmp, path)
