"""Metrics sinks: JSONL (one object per logged step) and TensorBoard event files.

Only process 0 writes. Values are converted to Python floats on the host at log time only.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np


class MetricsWriter:

  def __init__(self, workdir: str, name: str = "metrics"):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, f"{name}.jsonl")
    self._tb = None
    if self.enabled:
      os.makedirs(workdir, exist_ok=True)
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard", name))

  def write(self, step: int, metrics: dict) -> dict:
    scalars = {k: float(np.asarray(v)) for k, v in metrics.items()
               if np.asarray(v).size == 1}
    if self.enabled:
      with open(self.path, "a") as f:
        f.write(json.dumps({"step": int(step), **scalars}) + "\n")
      for k, v in scalars.items():
        self._tb.add_scalar(k, v, int(step))
      self._tb.flush()
    return scalars

  def close(self):
    if self._tb is not None:
      self._tb.close()


def read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
