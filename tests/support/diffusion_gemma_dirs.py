"""DiffusionGemma Hugging Face directories <-> our `DiffusionGemma`, whole tensors at a time: the
tests' own reader and writer (docs/models.md#diffusiongemma), beside the run's sharded loader and
exporter (`orl_jax.models.hf_read`, `hf_write`), against which they check it.

transformers ties the encoder's text weights, the decoder's and the head, so a checkpoint holds
the text stack once, under `model.decoder.*`, plus the encoder's own `layer_scalar` buffers
(`model.encoder.language_model.layers.{i}.layer_scalar`) and the vision tower
(`model.encoder.vision_tower.*`, `model.encoder.embed_vision.*`), and no `lm_head`. The vision
tensors are carried through untouched (`passthrough`) so an export loads back into transformers.

The name map (with its one-to-many fused experts) is the family's
(`orl_jax.models.diffusion_gemma.family`). `params_from_hf` / `params_to_hf` are pure functions
over flat dicts of numpy arrays (our dot-joined names, as `orl_jax.sharding.path_name` writes
them).
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from orl_jax.models import family_base
from orl_jax.models.diffusion_gemma import family
from orl_jax.models.diffusion_gemma.config import DiffusionGemmaConfig
from orl_jax.models.diffusion_gemma.model import DiffusionGemma
from orl_jax.models.hf_read import CheckpointError
from orl_jax.models.params_io import open_safetensors, read_json
from orl_jax.sharding import path_name

CONFIG_FILE, SINGLE_FILE, INDEX_FILE = ("config.json", "model.safetensors",
                                        "model.safetensors.index.json")


def params_to_hf(flat: dict[str, np.ndarray], cfg: DiffusionGemmaConfig,
                 passthrough: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
  """Our flat params -> DiffusionGemma checkpoint tensors (plus `passthrough` unchanged)."""
  return {**(passthrough or {}), **family_base.params_to_hf(flat, family.tensor_rules(cfg))}


def params_from_hf(tensors: dict[str, np.ndarray], cfg: DiffusionGemmaConfig):
  """Checkpoint tensors -> (our flat params, passthrough tensors). Raises CheckpointError naming
  missing and unexpected tensors."""
  passthrough = {k: v for k, v in tensors.items() if k.startswith(family.PASSTHROUGH_PREFIXES)}
  modelled = {k: v for k, v in tensors.items() if k not in passthrough}
  try:
    flat = family_base.params_from_hf(modelled, family.tensor_rules(cfg))
  except ValueError as e:
    raise CheckpointError(f"DiffusionGemma {e}") from None
  return flat, passthrough


# ----------------------------------------------------------------------------- model <-> flat


def flat_params(model: DiffusionGemma) -> dict[str, np.ndarray]:
  """{our dot-joined name: numpy array} of every parameter."""
  state = nnx.state(model, nnx.Param)
  return {path_name(p): np.asarray(jax.device_get(v))
          for p, v in jax.tree_util.tree_leaves_with_path(state)}


def assign_params(model: DiffusionGemma, flat: dict[str, np.ndarray], source: str = "") -> None:
  """Writes `flat` into `model` in place; raises CheckpointError on a name or shape mismatch."""
  state = nnx.state(model, nnx.Param)
  leaves = {path_name(p): v for p, v in jax.tree_util.tree_leaves_with_path(state)}
  missing, unexpected = sorted(set(leaves) - set(flat)), sorted(set(flat) - set(leaves))
  bad = [f"{n}: {tuple(flat[n].shape)} vs model {tuple(leaves[n].shape)}"
         for n in set(leaves) & set(flat) if tuple(flat[n].shape) != tuple(leaves[n].shape)]
  if missing or unexpected or bad:
    raise CheckpointError(f"{source or 'params'} do not fit the model: missing {missing[:8]}, "
                          f"unexpected {unexpected[:8]}, mis-shaped {sorted(bad)[:8]}")
  new = jax.tree_util.tree_map_with_path(
      lambda p, v: jax.numpy.asarray(flat[path_name(p)], v.dtype), state)
  nnx.update(model, new)


# ----------------------------------------------------------------------------- directories


def read_tensors(hf_dir: str) -> dict[str, np.ndarray]:
  """Every tensor of `model.safetensors` or of the shards its index names."""
  index = os.path.join(hf_dir, INDEX_FILE)
  if os.path.isfile(index):
    files = sorted(set(read_json(index)["weight_map"].values()))
  elif os.path.isfile(os.path.join(hf_dir, SINGLE_FILE)):
    files = [SINGLE_FILE]
  else:
    raise CheckpointError(f"{hf_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
  out = {}
  for name in files:
    path = os.path.join(hf_dir, name)
    if not os.path.isfile(path):
      raise CheckpointError(f"{path} not found: {INDEX_FILE} names it as a weight file")
    with open_safetensors(path) as f:
      out.update({k: f.get_tensor(k) for k in f.keys()})
  return out


def read_config(hf_dir: str, **overrides) -> DiffusionGemmaConfig:
  path = os.path.join(hf_dir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise CheckpointError(f"{path} not found: a DiffusionGemma directory needs config.json")
  try:
    return DiffusionGemmaConfig.from_hf(read_json(path), **overrides)
  except (KeyError, ValueError) as e:
    raise CheckpointError(f"{path}: {e}") from None


def load_dir(hf_dir: str, *, seed: int = 0, **overrides):
  """(model, passthrough tensors) from a local DiffusionGemma directory; `overrides` set the
  config fields config.json does not determine (dtype, param_dtype, moe_impl)."""
  cfg = read_config(hf_dir, **overrides)
  try:
    flat, passthrough = params_from_hf(read_tensors(hf_dir), cfg)
  except CheckpointError as e:
    raise CheckpointError(f"{hf_dir}: {e}") from None
  model = DiffusionGemma(cfg, rngs=nnx.Rngs(seed))
  assign_params(model, flat, source=hf_dir)
  return model, passthrough


def export_dir(out_dir: str, model: DiffusionGemma,
               passthrough: dict[str, np.ndarray] | None = None) -> str:
  """Writes config.json and model.safetensors that transformers' DiffusionGemma loads."""
  os.makedirs(out_dir, exist_ok=True)
  tensors = params_to_hf(flat_params(model), model.cfg, passthrough)
  save_file(tensors, os.path.join(out_dir, SINGLE_FILE), metadata={"format": "pt"})
  with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
    json.dump(model.cfg.to_hf(), f, indent=2)
  return out_dir
