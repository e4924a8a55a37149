"""Where a run's starting weights come from: `model.path`
(docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm).

`model.path` names one directory and its contents say what it is: a local Hugging Face model
(`config.json`; the family and every architecture field then come from that file), an orl_jax
params folder (`meta.json`, what every training run exports) or a finished run's work directory
(its `params/` folder). `model.init_from` is the older
name for a params folder and still works (the tiny demo's stages set it).
"""
from __future__ import annotations

import dataclasses
import json
import os

from orl_jax.errors import ConfigError

HF = "hf"              # a Hugging Face model directory
PARAMS = "params"      # an orl_jax params folder
_HF_FILE, _PARAMS_FILE = "config.json", "meta.json"


@dataclasses.dataclass(frozen=True)
class Weights:
  kind: str    # HF | PARAMS
  path: str
  field: str   # the config field that named it (for messages)


RUN_PARAMS = "params"   # WORKDIR/params: the final parameters every training run exports


def resolve(path: str, field: str = "model.path") -> tuple[str, str]:
  """(HF or PARAMS, the folder to read) of `path` by its contents: a Hugging Face model
  directory, a params folder, or a finished run's work directory (its `params/` folder);
  ConfigError naming the field otherwise (a run that has not finished yet included)."""
  run_params = os.path.join(path, RUN_PARAMS)
  if os.path.isfile(os.path.join(run_params, _PARAMS_FILE)):
    return PARAMS, run_params           # before config.json: a work directory has the run's
  if os.path.isfile(os.path.join(path, _PARAMS_FILE)):
    return PARAMS, path
  if os.path.isfile(os.path.join(path, _HF_FILE)) and not _is_work_dir(path):
    return HF, path
  hf = f"a Hugging Face model directory ({_HF_FILE}, *.safetensors, tokenizer.json)"
  ours = (f"an orl_jax params folder ({_PARAMS_FILE}, params.safetensors) or a finished run's "
          "work directory")
  if not os.path.exists(path):
    raise ConfigError(f"{field}={path!r} does not exist: give {hf} or {ours}")
  if _is_work_dir(path):
    raise ConfigError(f"{field}={path!r} is the work directory of a run that has not finished "
                      f"(no {RUN_PARAMS}/ folder yet): run its launch/train.py command again to "
                      "resume and finish it, or give the weights of a finished run")
  raise ConfigError(f"{field}={path!r} holds neither {hf} nor {ours}")


def _is_work_dir(path: str) -> bool:
  """A training run's work directory (its checkpoints or metrics, or only the config a run
  records when it starts), finished or not."""
  return (any(os.path.exists(os.path.join(path, name))
              for name in ("checkpoints", "metrics.jsonl"))
          or _is_run_config(os.path.join(path, _HF_FILE)))


def _is_run_config(file: str) -> bool:
  """`file` is the config.json a training run writes into its work directory (a config with
  `workdir` and `train` sections), not a Hugging Face model's."""
  try:
    with open(file, encoding="utf-8") as f:
      head = json.load(f)
  except (OSError, ValueError):
    return False
  return isinstance(head, dict) and "workdir" in head and isinstance(head.get("train"), dict)


def kind_of(path: str, field: str = "model.path") -> str:
  """HF or PARAMS by the directory's contents (`resolve`)."""
  return resolve(path, field)[0]


def display_name(path: str) -> str:
  """What a weights folder is called in tables: a run's name (its work directory's, for the
  run's `params/` folder or the directory itself), else the folder's own name."""
  folder = os.path.normpath(path)
  if os.path.basename(folder) == RUN_PARAMS:
    folder = os.path.dirname(folder)
  return os.path.basename(folder) or folder


def weights_of(config) -> Weights | None:
  """The run's starting weights (None: a freshly initialised model)."""
  m = config.model
  path, legacy = m.path, m.init_from
  if path and legacy and os.path.abspath(path) != os.path.abspath(legacy):
    raise ConfigError(f"model.path={path!r} and model.init_from={legacy!r} both give weights; "
                      "set model.path only")
  if path:
    return Weights(*resolve(path), "model.path")
  if legacy:
    return Weights(*resolve(legacy, "model.init_from"), "model.init_from")
  return None


def hf_dir(config) -> str:
  """The Hugging Face directory the run starts from, or ''."""
  w = weights_of(config)
  return w.path if w is not None and w.kind == HF else ""


def params_dir(config) -> str:
  """The orl_jax params folder the run starts from, or ''."""
  w = weights_of(config)
  return w.path if w is not None and w.kind == PARAMS else ""


def require_weights(config) -> None:
  """A config that names its real model (`model.hub_id`) cannot train from random weights:
  ConfigError in one sentence saying which `model.path` to set."""
  hub_id = config.model.hub_id
  if hub_id and weights_of(config) is None:
    raise ConfigError(f"this config trains {hub_id}: set --config.model.path to its local "
                      "Hugging Face directory (config.json, *.safetensors, tokenizer.json), "
                      f"e.g. one downloaded with `huggingface-cli download {hub_id}`")
