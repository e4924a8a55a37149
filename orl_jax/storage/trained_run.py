"""What a trained run keeps beside its parameters, and how export, evaluation and decoding
reuse it (docs/models.md#what-a-model-directory-decides: a checkpoint's directory decides its facts;
overrides win).

A params folder (`WORKDIR/params`) holds `params.safetensors`, `meta.json` and, for a run with
a Hugging Face tokenizer, a copy of that `tokenizer.json`. meta.json's `model` record is the
resolved model (architecture, residual pathway, family); its `run` record (`run_record`) is
what the model was trained with besides: the tokenizer, the resolved special-token ids, the
chat template and the Hugging Face directory it started from. `trained_settings` turns both into
config fields, and `apply_settings` sets those the command line did not override, so
`launch/export.py`, `launch/eval.py` and `launch/decode.py` given a run's folder need none of the
training overrides again. An exported Hugging Face directory records its residual pathway in
config.json (`RESIDUAL_KEY`), which is read back the same way.
"""
from __future__ import annotations

import copy
import os
import shutil
from typing import Iterable, Mapping

import ml_collections

from orl_jax.models import params_io

RUN_KEY = "run"                 # meta.json: what the model was trained with (run_record)
TOKENIZER_FILE = "tokenizer.json"
RANDOM_INIT = "random"   # an `eval.compare` path: a fresh model from config.seed, no weights
TINY = "tiny"                   # model.tokenizer: the tiny task's word tokenizer
RESIDUAL_KEY = "orl_residual"   # config.json of an export: the residual pathway's settings
# ModelConfig fields a params folder decides, as config fields: the architecture and the
# parameters' storage dtype (what the weights are; the run-time choices -- the compute dtype,
# the attention kernel, model.moe.impl -- stay the config's)
ARCHITECTURE = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                "mlp_dim", "rope_theta", "rope_fraction", "norm_eps", "qk_norm",
                "tie_embeddings", "embed_scale", "attention", "hf_family", "first_k_dense",
                "norm_head", "param_dtype")
RESIDUAL = {"residual_mode": "mode", "residual_hidden": "hidden", "residual_scale": "scale",
            "residual_temperature": "temperature"}
MOE_ARCHITECTURE = ("n_experts", "top_k", "expert_dim", "n_group", "topk_group", "n_shared",
                    "routed_scaling_factor")


def run_record(config, tokenizer, source_dir: str, model_type: str) -> dict:
  """meta.json's `run` record: `tokenizer` ('tokenizer.json': the copy in the params folder,
  written by `save_tokenizer`; 'tiny': the tiny task's word tokenizer), the resolved
  `special_tokens` ids, the
  `chat` template, the Hugging Face directory the run started from (`source`) and its
  `model_type`."""
  hf_tokenizer = hasattr(tokenizer, "backend")
  word_tokenizer = hasattr(tokenizer, "vocab")    # the tiny task's
  special = {}
  if hf_tokenizer:
    special = {role: list(ids) for role, ids in (
        ("mask", (tokenizer.mask_id,)), ("eos", tokenizer.eos_ids), ("pad", (tokenizer.pad_id,)),
        ("bos", (tokenizer.bos_id,))) if ids[0] is not None}
  return {"tokenizer": TOKENIZER_FILE if hf_tokenizer else (TINY if word_tokenizer else ""),
          "special_tokens": special,
          "chat": config.task.chat,
          "source": os.path.abspath(source_dir) if source_dir else "", "model_type": model_type,
          "task": {"name": config.task.name,
                   "path": os.path.abspath(config.task.path) if config.task.path else ""}}


def save_tokenizer(tokenizer, folder: str) -> None:
  """Writes a Hugging Face tokenizer's tokenizer.json into `folder` (the params folder travels
  with the tokenizer its ids mean); nothing for the tiny task's word tokenizer."""
  if hasattr(tokenizer, "backend"):
    source = getattr(tokenizer, "source", "")
    if os.path.isfile(source):
      shutil.copyfile(source, os.path.join(folder, TOKENIZER_FILE))
    else:   # built in memory (the byte-level debug tokenizer)
      tokenizer.backend.save(os.path.join(folder, TOKENIZER_FILE))


def trained_settings(kind: str, folder: str) -> dict:
  """{config field: value} that the weights in `folder` decide: for a params folder (kind
  'params') its architecture, residual pathway, family, tokenizer, special tokens and chat
  template; for a Hugging Face directory (kind 'hf') the residual pathway an export recorded
  (the rest comes from its config.json as for any checkpoint)."""
  if kind == "hf":
    from orl_jax.models import hf_read
    recorded = hf_read.read_hf_config(folder).get(RESIDUAL_KEY, {})
    return {f"model.residual.{k}": recorded[k] for k in RESIDUAL.values() if k in recorded}
  meta = _checked_meta(params_io.read_meta(folder), folder)
  model, run = meta.get("model", {}), meta.get(RUN_KEY, {})
  out = {f"model.{k}": model[k] for k in ARCHITECTURE if k in model}
  out.update({f"model.residual.{v}": model[k] for k, v in RESIDUAL.items() if k in model})
  if model.get("moe"):
    out.update({f"model.moe.{k}": model["moe"][k] for k in MOE_ARCHITECTURE})
  elif "moe" in model:
    out["model.moe.n_experts"] = 0
  if run.get("tokenizer") == TINY:
    out["model.tokenizer"] = TINY
  elif run.get("tokenizer"):
    out["model.tokenizer"] = os.path.join(folder, run["tokenizer"])
  out.update({f"model.special_tokens.{role}": ",".join(map(str, ids))
              for role, ids in run.get("special_tokens", {}).items()})
  if "chat" in run:
    out["task.chat"] = run["chat"]
  return out


def overridden_fields(argv: Iterable[str]) -> frozenset[str]:
  """The config fields a command line sets (`--config.a.b=v` or `--config.a.b v` -> 'a.b')."""
  out = set()
  for arg in argv:
    if arg.startswith("--config."):
      out.add(arg[len("--config."):].split("=", 1)[0])
  return frozenset(out)


def _is_overridden(field: str, overridden: frozenset[str]) -> bool:
  return any(field == o or field.startswith(o + ".") for o in overridden)


def apply_settings(config, settings: Mapping, overridden: frozenset[str] = frozenset()) -> list:
  """Sets each `settings` field of `config` (creating it where the config file lacks it) unless
  the command line overrode it; returns the fields whose value changed."""
  changed = []
  with config.unlocked():
    for field, value in settings.items():
      if _is_overridden(field, overridden):
        continue
      *parents, name = field.split(".")
      section = config
      for p in parents:
        if p not in section:
          section[p] = ml_collections.ConfigDict()
        section = section[p]
      if section.get(name) != value:
        section[name] = value
        changed.append(field)
  return changed


def _checked_meta(meta, folder: str) -> dict:
  """`meta` if each field `trained_settings` reads has its type, else ParamsFileError naming
  the file and the field (a hand-edited or foreign meta.json stops with a sentence)."""
  where = os.path.join(folder, params_io.META_FILE)

  def fail(field: str, want: str, value) -> None:
    raise params_io.ParamsFileError(f"{where}: {field} must be {want}, got {value!r:.60}")

  if not isinstance(meta, dict):
    fail("the file", "a JSON object", meta)
  model, run = meta.get("model", {}), meta.get(RUN_KEY, {})
  for name, record in (("model", model), (RUN_KEY, run)):
    if not isinstance(record, dict):
      fail(name, "an object", record)
  for k in (*ARCHITECTURE, *RESIDUAL):
    if k in model and (model[k] is None or not isinstance(model[k], (bool, int, float, str))):
      fail(f"model.{k}", "a number, a boolean or a string", model[k])
  moe = model.get("moe")
  if moe and not (isinstance(moe, dict) and all(
      isinstance(moe.get(k), (int, float)) for k in MOE_ARCHITECTURE)):
    fail("model.moe", f"an object of numbers {MOE_ARCHITECTURE}", moe)
  for k in ("tokenizer", "chat"):
    if k in run and not isinstance(run[k], str):
      fail(f"{RUN_KEY}.{k}", "a string", run[k])
  tokens = run.get("special_tokens", {})
  if not (isinstance(tokens, dict) and all(
      isinstance(ids, list) and all(type(i) is int for i in ids) for ids in tokens.values())):
    fail(f"{RUN_KEY}.special_tokens", "an object of token id lists", tokens)
  return meta


def model_config_for(config, path: str, overridden: frozenset = frozenset(),
                     field: str = "model.path"):
  """A copy of `config` whose weights come from `path` (set as model.path): a Hugging Face
  directory, an orl_jax params folder or a finished run's work directory (`field` names it in
  errors); 'random' -> a fresh model from config.seed. The settings the weights were trained
  with (`trained_settings`: a params folder's architecture, residual pathway,
  tokenizer, special tokens and chat template) replace the config's, except the fields in
  `overridden` (those the command line set)."""
  from orl_jax.storage import weights as weights_lib
  cfg = copy.deepcopy(config)
  with cfg.unlocked():
    cfg.train.mode = "eval"        # evaluation only: the training modes' checks do not apply
    cfg.model.init_from = ""
    cfg.model.path = ""
  if path == RANDOM_INIT:
    return cfg
  kind, folder = weights_lib.resolve(path, field)
  try:
    apply_settings(cfg, trained_settings(kind, folder), overridden)
  except TypeError as e:      # a recorded value of another type than the config field's
    raise params_io.ParamsFileError(f"{folder}: a recorded setting does not fit the config "
                                    f"({e})") from None
  with cfg.unlocked():
    cfg.model.path = folder
  return cfg
