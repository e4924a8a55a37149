"""Writing our Transformer's parameters as a local Hugging Face model directory
(docs/models.md#exports-and-other-tools), for every registered family: config.json, the weights (one
file, or shards with an index) and the files copied beside them (tokenizer, generation config, the
authors' modeling code).

The name map of each family is in its folder (`orl_jax/models/<family>/`); this module only
writes files (`hf_read` reads them, with the same names). Our NNX kernels are `[in, out]`,
PyTorch `Linear` weights `[out, in]` (transposed on export). The residual adapter (which no HF
model has) goes to a separate `adapter.safetensors` under our own names.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from orl_jax.models import params_io
from orl_jax.models import family_base
from orl_jax.models.family_base import AnyModelConfig
from orl_jax.models.hf_read import (ADAPTER_FILE, ADAPTER_PREFIX, CONFIG_FILE, INDEX_FILE,
                                    SINGLE_FILE, CheckpointError, checkpoint_family, flat_params,
                                    tensor_rules)


# ----------------------------------------------------------------------------- config.json


def hf_config_json(cfg: AnyModelConfig, family: str, extra: dict | None = None,
                   model_type: str = "") -> dict:
  """A HF `config.json` for `cfg` (what `export` writes; `architecture_from_hf` inverts it).
  `model_type` (default: the family's own) names one of the family's model types; one whose
  classes are the authors' (`Family.remote_code`) gets their `architectures` and `auto_map`."""
  fam = checkpoint_family(family)
  out = fam.hf_config_json(cfg)
  if model_type:
    if model_type not in fam.model_types:
      raise CheckpointError(f"export: model_type {model_type!r} is not one of the {family!r} "
                            f"family's {fam.model_types}")
    out["model_type"] = model_type
  remote = fam.remote_code.get(out.get("model_type", ""))
  if remote:
    out.update(copy.deepcopy(remote))
  out["torch_dtype"] = {"bfloat16": "bfloat16", "float32": "float32"}.get(cfg.param_dtype,
                                                                           cfg.param_dtype)
  out.update(extra or {})
  return out


# ----------------------------------------------------------------------------- export


def hf_tensors(params: nnx.State, cfg: AnyModelConfig, family: str):
  """(HF tensors of the base model, our adapter tensors) of `params`, as host numpy arrays;
  CheckpointError naming parameters the family has no name for, or lacks."""
  leaves = {n: np.asarray(jax.device_get(v)) for n, v in flat_params(params).items()}
  rules = tensor_rules(family, cfg)
  lacking = sorted({r.ours for r in rules} - set(leaves))
  if lacking:
    raise CheckpointError(f"export: parameters {lacking[:8]} missing from the model state")
  ours = {r.ours for r in rules}
  extra = {n: np.ascontiguousarray(v) for n, v in leaves.items() if n not in ours}
  not_adapter = [n for n in extra if not n.startswith(ADAPTER_PREFIX)]
  if not_adapter:
    raise CheckpointError(f"export: parameters with no {family!r} name: {not_adapter[:8]}")
  return family_base.params_to_hf(leaves, rules), extra


def export_hf(out_dir: str, params: nnx.State, cfg: AnyModelConfig, family: str, *,
              tokenizer_file: str | None = None, extra_config: dict | None = None,
              max_shard_bytes: int = 0, passthrough: dict | None = None,
              model_type: str = "", files: dict[str, str] | None = None,
              texts: dict[str, str] | None = None) -> str:
  """Writes `params` as a HF model directory (config.json + safetensors, adapter separately;
  `passthrough` tensors are written unchanged beside the model's); `model_type`: one of the
  family's (`hf_config_json`); `files` {name: path} are copied into it and `texts` {name: text}
  written (tokenizer and generation configs, the authors' modeling files).

  `max_shard_bytes > 0` splits the weights into `model-0000i-of-0000n.safetensors` files with an
  index. Writes into a temporary sibling folder, then renames it into place.
  """
  base, adapter = hf_tensors(params, cfg, family)
  base = {**(passthrough or {}), **base}
  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".hf-export-tmp-", dir=parent)
  _write_weights(tmp, base, max_shard_bytes)
  if adapter:
    save_file(adapter, os.path.join(tmp, ADAPTER_FILE))
  with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
    json.dump(hf_config_json(cfg, family, extra_config, model_type), f, indent=2)
  if tokenizer_file:
    shutil.copy(tokenizer_file, os.path.join(tmp, "tokenizer.json"))
  for name, path in (files or {}).items():
    shutil.copyfile(path, os.path.join(tmp, name))
  for name, text in (texts or {}).items():
    with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
      f.write(text)
  params_io.usual_modes(tmp)
  if os.path.exists(out_dir):
    old = out_dir.rstrip("/") + ".old"
    os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.replace(tmp, out_dir)
  return out_dir


def _write_weights(directory: str, tensors: dict[str, np.ndarray], max_shard_bytes: int):
  if max_shard_bytes <= 0:
    save_file(tensors, os.path.join(directory, SINGLE_FILE), metadata={"format": "pt"})
    return
  current: dict[str, np.ndarray]
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensors[name]
    size += nbytes
  shards.append(current)
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(directory, fname), metadata={"format": "pt"})
    weight_map.update({n: fname for n in shard})
  total = sum(t.nbytes for t in tensors.values())
  with open(os.path.join(directory, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
