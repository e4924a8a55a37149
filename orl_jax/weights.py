"""Where a run's starting weights come from: `model.path` (DESIGN §4).

`model.path` names one directory and its contents say what it is: a local Hugging Face model
(`config.json`; the family and every architecture field then come from that file) or an orl_jax
params folder (`meta.json`, what every training run exports). `model.init_from` is the older
name for a params folder and still works (the tiny demo's stages set it).
"""
from __future__ import annotations

import dataclasses
import os

from orl_jax.config import ConfigError

HF = "hf"              # a Hugging Face model directory
PARAMS = "params"      # an orl_jax params folder
_HF_FILE, _PARAMS_FILE = "config.json", "meta.json"


@dataclasses.dataclass(frozen=True)
class Weights:
  kind: str    # HF | PARAMS
  path: str
  field: str   # the config field that named it (for messages)


def kind_of(path: str, field: str = "model.path") -> str:
  """HF or PARAMS by the directory's contents; ConfigError naming the field otherwise."""
  if os.path.isfile(os.path.join(path, _HF_FILE)):
    return HF
  if os.path.isfile(os.path.join(path, _PARAMS_FILE)):
    return PARAMS
  hf = f"a Hugging Face model directory ({_HF_FILE}, *.safetensors, tokenizer.json)"
  ours = f"an orl_jax params folder ({_PARAMS_FILE}, params.safetensors)"
  if not os.path.exists(path):
    raise ConfigError(f"{field}={path!r} does not exist: give {hf} or {ours}")
  raise ConfigError(f"{field}={path!r} holds neither {hf} nor {ours}")


def weights_of(config) -> Weights | None:
  """The run's starting weights (None: a freshly initialised model)."""
  m = config.model
  path, legacy = m.get("path", ""), m.get("init_from", "")
  if path and legacy and os.path.abspath(path) != os.path.abspath(legacy):
    raise ConfigError(f"model.path={path!r} and model.init_from={legacy!r} both give weights; "
                      "set model.path only")
  if path:
    return Weights(kind_of(path), path, "model.path")
  if legacy:
    return Weights(PARAMS, legacy, "model.init_from")
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
  hub_id = config.model.get("hub_id", "")
  if hub_id and weights_of(config) is None:
    raise ConfigError(f"this config trains {hub_id}: set --config.model.path to its local "
                      "Hugging Face directory (config.json, *.safetensors, tokenizer.json), "
                      f"e.g. one downloaded with `huggingface-cli download {hub_id}`")
