"""DiffusionGemma Hugging Face checkpoints <-> our `DiffusionGemma` (DESIGN §4).

transformers ties the encoder's text weights, the decoder's and the head, so a checkpoint holds
the text stack once, under `model.decoder.*`, plus the encoder's own `layer_scalar` buffers
(`model.encoder.language_model.layers.{i}.layer_scalar`) and the vision tower
(`model.encoder.vision_tower.*`, `model.encoder.embed_vision.*`), and no `lm_head`. The vision
tensors are carried through untouched (`passthrough`) so an export loads back into transformers.

Two layout changes live in the name map, not in the model: the fused experts
`experts.gate_up_proj` [E, 2F, D] (gate rows first) become our `moe.gate_proj` / `moe.up_proj`
[E, D, F], and `experts.down_proj` [E, D, F] becomes `moe.down_proj` [E, F, D]; every PyTorch
`Linear` [out, in] is transposed to an NNX kernel [in, out].

`params_from_hf` / `params_to_hf` are pure functions over flat dicts of numpy arrays (our
dot-joined names, as `orl_jax.sharding.path_name` writes them), ready for a family registry.
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from orl_jax.models.diffusion_gemma import DiffusionGemma
from orl_jax.models.diffusion_gemma_config import DiffusionGemmaConfig
from orl_jax.params_io import open_safetensors, read_json
from orl_jax.sharding import path_name

DECODER = "model.decoder."
ENCODER_LAYERS = "model.encoder.language_model.layers."
PASSTHROUGH_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
CONFIG_FILE, SINGLE_FILE, INDEX_FILE = ("config.json", "model.safetensors",
                                        "model.safetensors.index.json")

_NORMS = (("input_layernorm", "input_norm"), ("post_attention_layernorm", "post_attn_norm"),
          ("pre_feedforward_layernorm", "pre_mlp_norm"),
          ("post_feedforward_layernorm_1", "post_mlp_norm"),
          ("pre_feedforward_layernorm_2", "pre_moe_norm"),
          ("post_feedforward_layernorm_2", "post_moe_norm"),
          ("post_feedforward_layernorm", "post_ff_norm"))


class CheckpointError(ValueError):
  """A model directory that does not match the configured model; the message names the file."""


def _layer_pairs(cfg: DiffusionGemmaConfig, i: int) -> list[tuple[str, str, bool]]:
  """(HF name, our name, transpose) of layer i's one-to-one tensors."""
  hf, ours = f"{DECODER}layers.{i}.", f"layers.{i}."
  pairs = [(hf + f"{h}.weight", ours + f"{o}.weight", False) for h, o in _NORMS]
  projs = ("q_proj", "k_proj", "o_proj") + (() if cfg.layers[i].k_is_v else ("v_proj",))
  pairs += [(hf + f"self_attn.{p}.weight", ours + f"attn.{p}.kernel", True) for p in projs]
  pairs += [(hf + f"self_attn.{n}.weight", ours + f"attn.{n}.weight", False)
            for n in ("q_norm", "k_norm")]
  pairs += [(hf + f"mlp.{p}.weight", ours + f"mlp.{p}.kernel", True)
            for p in ("gate_proj", "up_proj", "down_proj")]
  pairs += [(hf + "router.proj.weight", ours + "moe.router.kernel", True),
            (hf + "router.scale", ours + "moe.router.scale", False),
            (hf + "router.per_expert_scale", ours + "moe.router.per_expert_scale", False),
            (hf + "layer_scalar", ours + "layer_scalar", False),
            (f"{ENCODER_LAYERS}{i}.layer_scalar", ours + "commit_layer_scalar", False)]
  return pairs


def _global_pairs() -> list[tuple[str, str, bool]]:
  sc = DECODER + "self_conditioning."
  return ([(DECODER + "embed_tokens.weight", "embed.embedding", False),
           (DECODER + "norm.weight", "final_norm.weight", False),
           (sc + "pre_norm.weight", "self_conditioning.pre_norm.weight", False)]
          + [(sc + f"{p}.weight", f"self_conditioning.mlp.{p}.kernel", True)
             for p in ("gate_proj", "up_proj", "down_proj")])


def hf_names(cfg: DiffusionGemmaConfig) -> list[str]:
  """Every text tensor name of a DiffusionGemma checkpoint of `cfg`."""
  names = [hf for hf, _, _ in _global_pairs()]
  for i in range(cfg.n_layers):
    names += [hf for hf, _, _ in _layer_pairs(cfg, i)]
    names += [f"{DECODER}layers.{i}.experts.gate_up_proj", f"{DECODER}layers.{i}.experts.down_proj"]
  return names


def params_to_hf(flat: dict[str, np.ndarray], cfg: DiffusionGemmaConfig,
                 passthrough: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
  """Our flat params -> DiffusionGemma checkpoint tensors (plus `passthrough` unchanged)."""
  out = dict(passthrough or {})
  for hf, ours, transpose in _global_pairs():
    out[hf] = flat[ours].T if transpose else flat[ours]
  for i in range(cfg.n_layers):
    for hf, ours, transpose in _layer_pairs(cfg, i):
      out[hf] = flat[ours].T if transpose else flat[ours]
    moe = f"layers.{i}.moe."
    gate_up = np.concatenate([flat[moe + "gate_proj"], flat[moe + "up_proj"]], axis=-1)
    out[f"{DECODER}layers.{i}.experts.gate_up_proj"] = gate_up.transpose(0, 2, 1)
    out[f"{DECODER}layers.{i}.experts.down_proj"] = flat[moe + "down_proj"].transpose(0, 2, 1)
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def params_from_hf(tensors: dict[str, np.ndarray], cfg: DiffusionGemmaConfig):
  """Checkpoint tensors -> (our flat params, passthrough tensors). Raises CheckpointError naming
  missing and unexpected tensors."""
  expected = set(hf_names(cfg))
  passthrough = {k: v for k, v in tensors.items() if k.startswith(PASSTHROUGH_PREFIXES)}
  missing = sorted(expected - set(tensors))
  unexpected = sorted(set(tensors) - expected - set(passthrough))
  if missing or unexpected:
    raise CheckpointError(f"DiffusionGemma tensors do not match config.json: missing "
                          f"{missing[:8]}, unexpected {unexpected[:8]}")
  flat = {}
  for hf, ours, transpose in _global_pairs():
    flat[ours] = tensors[hf].T if transpose else tensors[hf]
  for i in range(cfg.n_layers):
    for hf, ours, transpose in _layer_pairs(cfg, i):
      flat[ours] = tensors[hf].T if transpose else tensors[hf]
    gate_up = tensors[f"{DECODER}layers.{i}.experts.gate_up_proj"].transpose(0, 2, 1)
    flat[f"layers.{i}.moe.gate_proj"], flat[f"layers.{i}.moe.up_proj"] = np.split(
        gate_up, 2, axis=-1)
    flat[f"layers.{i}.moe.down_proj"] = tensors[f"{DECODER}layers.{i}.experts.down_proj"
                                                ].transpose(0, 2, 1)
  return {k: np.ascontiguousarray(v) for k, v in flat.items()}, passthrough


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
