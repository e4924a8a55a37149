"""Parameters on disk: a folder with `params.safetensors` (flat, dot-joined names) and
`meta.json` (model config and anything else worth recording). Used for the committed tiny base
model, `model.init_from`, and the end-of-run export of every training run.

Loading into a model of another residual mode is allowed: parameters absent from the file (a
fresh adapter) keep their initialisation and are reported; shape mismatches are errors.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load_file, save_file

PARAMS_FILE = "params.safetensors"
META_FILE = "meta.json"


def flatten(pure: dict, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for k, v in pure.items():
    name = f"{prefix}.{k}" if prefix else str(k)
    if isinstance(v, dict):
      out.update(flatten(v, name))
    else:
      out[name] = np.asarray(v)
  return out


def save_params(directory: str, params: nnx.State, meta: dict) -> None:
  """Writes atomically: into a temporary sibling folder, then renamed into place."""
  parent = os.path.dirname(os.path.abspath(directory))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".params-tmp-", dir=parent)
  save_file(flatten(params.to_pure_dict()), os.path.join(tmp, PARAMS_FILE))
  with open(os.path.join(tmp, META_FILE), "w") as f:
    json.dump(meta, f, indent=2, sort_keys=True, default=_json_default)
  if os.path.exists(directory):
    old = directory + ".old"
    os.replace(directory, old)
    os.replace(tmp, directory)
    _rmtree(old)
  else:
    os.replace(tmp, directory)


def _json_default(x):
  if dataclasses.is_dataclass(x):
    return dataclasses.asdict(x)
  if isinstance(x, (np.integer, np.floating)):
    return x.item()
  return str(x)


def _rmtree(path):
  import shutil
  shutil.rmtree(path, ignore_errors=True)


def read_meta(directory: str) -> dict:
  path = os.path.join(directory, META_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: {directory!r} is not a parameter folder written by "
                            "orl_jax (expected params.safetensors and meta.json)")
  with open(path) as f:
    return json.load(f)


def load_params(directory: str, params: nnx.State) -> tuple[nnx.State, list[str]]:
  """Returns (params with the file's values, names that kept their initialisation)."""
  path = os.path.join(directory, PARAMS_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: run `make base` or point model.init_from at a "
                            "folder written by a training run (its `params/` folder)")
  stored = load_file(path)
  target = flatten(params.to_pure_dict())
  unexpected = sorted(set(stored) - set(target))
  if unexpected:
    raise ValueError(f"{path}: tensors not in the configured model: {unexpected[:8]}"
                     f"{' ...' if len(unexpected) > 8 else ''} (does the config match the "
                     "checkpoint's model?)")
  bad = [f"{k}: file {stored[k].shape} vs model {target[k].shape}" for k in stored
         if stored[k].shape != target[k].shape]
  if bad:
    raise ValueError(f"{path}: shape mismatch: " + "; ".join(bad[:8]))
  kept = sorted(set(target) - set(stored))
  merged = {k: stored.get(k, v) for k, v in target.items()}
  pure = params.to_pure_dict()

  def fill(tree, prefix=""):
    for k, v in tree.items():
      name = f"{prefix}.{k}" if prefix else str(k)
      if isinstance(v, dict):
        fill(v, name)
      else:
        tree[k] = merged[name].astype(np.asarray(v).dtype)

  fill(pure)
  new = jax.tree.map(lambda x: x, params)  # a copy: the caller's state stays untouched
  nnx.replace_by_pure_dict(new, pure)
  return new, kept
