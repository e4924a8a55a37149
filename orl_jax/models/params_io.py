"""Parameters on disk: a folder with `params.safetensors` (flat, dot-joined names) and
`meta.json` (model config and anything else worth recording). Used for the committed tiny base
model, `model.init_from`, and the end-of-run export of every training run.

Loading into a model with a residual adapter is allowed: adapter parameters absent from the file
keep their initialisation and are reported. Any other missing tensor, a tensor the model does not
have, a shape mismatch, or a file that cannot be read (truncated, another format) is an error
whose message names the file.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import jax
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

PARAMS_FILE = "params.safetensors"
META_FILE = "meta.json"


class ParamsFileError(ValueError):
  """A parameter or model file that cannot be used; the message names the file."""


def is_adapter(name: str) -> bool:
  """Parameters of the residual adapter: the only ones a loaded model may add."""
  return "adapter" in name.split(".")


def _safetensors_problem(path: str, e: Exception) -> ParamsFileError:
  reason = str(e).replace("Error while deserializing header: ", "")
  return ParamsFileError(f"{path} is not a readable safetensors file ({reason}): it is truncated "
                         "or in another format, so copy or export it again")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of a safetensors file; a truncated or foreign file is a ParamsFileError."""
  try:
    return load_file(path)
  except Exception as e:  # safetensors raises its own SafetensorError (and OSError)
    raise _safetensors_problem(path, e) from None


def open_safetensors(path: str):
  """`safe_open(path, "np")`, with a ParamsFileError naming the file when it cannot be read."""
  try:
    return safe_open(path, "np")
  except Exception as e:
    raise _safetensors_problem(path, e) from None


def read_json(path: str) -> dict:
  """A JSON object from `path`; a truncated or non-JSON file is a ParamsFileError naming it."""
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    reason = str(e).split(" (char")[0] if isinstance(e, json.JSONDecodeError) else e.reason
    raise ParamsFileError(f"{path} is not valid JSON ({reason}): the file is truncated or not a "
                          "JSON file, so copy or write it again") from None
  if not isinstance(value, dict):
    raise ParamsFileError(f"{path} holds a JSON {type(value).__name__}, not the expected object")
  return value


def flatten(pure: dict, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for k, v in pure.items():
    name = f"{prefix}.{k}" if prefix else str(k)
    if isinstance(v, dict):
      out.update(flatten(v, name))
    else:
      out[name] = np.asarray(v)
  return out


def usual_modes(directory: str) -> None:
  """Gives a folder written through `tempfile.mkdtemp` (mode 0700) and everything in it the
  modes a plain `mkdir`/`open` would (0777/0666 less the umask), so that every file of an export
  reads alike (safetensors' writer and mkdtemp make theirs private)."""
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(directory, 0o777 & ~umask)
  for root, dirs, files in os.walk(directory):
    for name in dirs:
      os.chmod(os.path.join(root, name), 0o777 & ~umask)
    for name in files:
      os.chmod(os.path.join(root, name), 0o666 & ~umask)


def save_params(directory: str, params: nnx.State, meta: dict, write_more=None) -> None:
  """Writes atomically: into a temporary sibling folder, then renamed into place;
  `write_more(folder)` adds files beside the parameters (a run's tokenizer.json)."""
  parent = os.path.dirname(os.path.abspath(directory))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".params-tmp-", dir=parent)
  save_file(flatten(params.to_pure_dict()), os.path.join(tmp, PARAMS_FILE))
  with open(os.path.join(tmp, META_FILE), "w") as f:
    json.dump(meta, f, indent=2, sort_keys=True, default=_json_default)
  if write_more is not None:
    write_more(tmp)
  usual_modes(tmp)
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
    raise ParamsFileError(f"{path} not found: {directory!r} is not a parameter folder written by "
                          "orl_jax (expected params.safetensors and meta.json)")
  return read_json(path)


def _names(names: list[str], limit: int = 8) -> str:
  more = f" and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def load_params(directory: str, params: nnx.State) -> tuple[nnx.State, list[str]]:
  """Returns (params with the file's values, adapter names that kept their initialisation).

  Raises ParamsFileError when the file is unreadable, lacks a non-adapter tensor of the model,
  holds a tensor the model does not have, or a shape differs.
  """
  path = os.path.join(directory, PARAMS_FILE)
  if not os.path.exists(path):
    raise ParamsFileError(f"{path} not found: run `make base` or point model.init_from at a "
                          "folder written by a training run (its `params/` folder)")
  stored = read_safetensors(path)
  target = flatten(params.to_pure_dict())
  unexpected = sorted(set(stored) - set(target))
  if unexpected:
    raise ParamsFileError(f"{path} holds {len(unexpected)} tensor(s) the configured model does "
                          f"not have ({_names(unexpected)}): set the model.* fields (and "
                          f"model.residual.mode) to those in {META_FILE} next to it")
  missing = sorted(k for k in set(target) - set(stored) if not is_adapter(k))
  if missing:
    raise ParamsFileError(f"{path} lacks {len(missing)} tensor(s) of the configured model "
                          f"({_names(missing)}) and only residual adapter parameters may start "
                          f"fresh: set the model.* fields to those in {META_FILE} next to it or "
                          "point model.init_from at the right folder")
  bad = [f"{k} is {stored[k].shape} in the file but {target[k].shape} in the model"
         for k in sorted(stored) if stored[k].shape != target[k].shape]
  if bad:
    raise ParamsFileError(f"{path} does not fit the configured model ({'; '.join(bad[:4])}): "
                          f"set the model.* fields to those in {META_FILE} next to it")
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
