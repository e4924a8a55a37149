"""The Hugging Face export of a run (docs/models.md#exports-and-other-tools): `WORKDIR/hf` with
the weights under the family's official names, the tokenizer files, the residual adapter apart,
and the config.json `model_type` it declares (`export_model_type`)."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING


from orl_jax.errors import ConfigError
from orl_jax.models import families
from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib

if TYPE_CHECKING:
  from orl_jax.setup.build import Setup


HF_EXPORT_DIR = "hf"   # WORKDIR/hf: the final parameters as a Hugging Face directory


def export_model_type(config, hf_dir: str = "") -> str:
  """The config.json `model_type` an export of the run declares: the Hugging Face directory's it
  started from, else `model.hf_model_type`, else '' (its family's own)."""
  if hf_dir:
    from orl_jax.models import hf_read
    return hf_read.read_hf_config(hf_dir).get("model_type", "")
  return config.model.hf_model_type


def export_hf_dir(setup: Setup, params, out_dir: str, max_shard_bytes: int = 0) -> str:
  """Writes `params` as a Hugging Face directory of the run's family: weights, config.json
  (declaring the authors' classes where transformers has none, `Family.remote_code`, and the
  residual pathway), the tokenizer files and, from the directory the run started from, its
  generation_config.json and modeling code (`export_files`)."""
  from orl_jax.models import hf_read, hf_write
  if not setup.model_cfg.hf_family:
    raise ConfigError("export: the model belongs to no Hugging Face family; set "
                      "model.hf_family (or model.path to a Hugging Face directory)")
  source = weights_lib.hf_dir(setup.config)
  family = setup.model_cfg.hf_family
  files, texts = export_files(setup, source)
  extra = dict(_special_token_ids(setup), **_residual_record(setup.model_cfg))
  return hf_write.export_hf(out_dir, params, setup.model_cfg, family,
                            max_shard_bytes=max_shard_bytes, extra_config=extra,
                            passthrough=hf_read.read_passthrough(source, family),
                            model_type=export_model_type(setup.config, source), files=files,
                            texts=texts)


def export_files(setup: Setup, source: str) -> tuple[dict, dict]:
  """({name: path to copy}, {name: text}) of an export besides its weights and config.json:
  tokenizer.json (the run's tokenizer file, else written from the tokenizer),
  tokenizer_config.json and special_tokens_map.json naming the run's special tokens, and from
  the Hugging Face directory `source` ('' = none) its other tokenizer files, its
  generation_config.json (with the run's special-token ids) and its `*.py` modeling code."""
  from orl_jax.data import hf_tokenizer
  from orl_jax.models import hf_read
  tok = setup.tokenizer
  files, texts = {}, {}
  tok_file = getattr(tok, "source", "")
  if os.path.isfile(tok_file):
    files[trained_run.TOKENIZER_FILE] = tok_file
  else:
    texts[trained_run.TOKENIZER_FILE] = hf_tokenizer.tokenizer_json(tok)
  if source:
    for name in sorted(os.listdir(source)):
      if name.endswith(".py") or name in hf_tokenizer.TOKENIZER_SIDE_FILES:
        files[name] = os.path.join(source, name)
  side = os.path.join(source, hf_tokenizer.TOKENIZER_CONFIG_FILE) if source else ""
  texts.update(hf_tokenizer.tokenizer_configs(
      tok, hf_read.read_json_object(side) if os.path.isfile(side) else None))
  generation = os.path.join(source, hf_read.GENERATION_CONFIG_FILE) if source else ""
  if os.path.isfile(generation):
    config = dict(hf_read.read_json_object(generation), **_special_token_ids(setup))
    texts[hf_read.GENERATION_CONFIG_FILE] = json.dumps(config, indent=2)
  return files, texts


def _residual_record(model_cfg) -> dict:
  """config.json's record of the residual pathway a model has (read back by
  `trained_run.trained_settings`); {} without one."""
  from orl_jax.models import hf_read
  mode = getattr(model_cfg, "residual_mode", "none")
  if mode == "none":
    return {}
  return {trained_run.RESIDUAL_KEY: {
      "mode": mode, "hidden": model_cfg.residual_hidden, "scale": model_cfg.residual_scale,
      "temperature": model_cfg.residual_temperature,
      "file": hf_read.ADAPTER_FILE if mode == "adapter" else ""}}


def _special_token_ids(setup: Setup) -> dict:
  """The run's EOS and pad ids as config.json keys (so the exported directory declares the
  tokens it was trained with); {} for a family with its own config (it writes them itself)."""
  if families.get(setup.model_cfg.hf_family).own_model:
    return {}
  tok = setup.tokenizer
  eos = list(getattr(tok, "eos_ids", (tok.eos_id,)))
  ids = {"eos_token_id": eos[0] if len(eos) == 1 else eos, "pad_token_id": tok.pad_id}
  bos = getattr(tok, "bos_id", None)
  return ids if bos is None else dict(ids, bos_token_id=bos)
