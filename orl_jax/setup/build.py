"""The set-up of a run (`Setup`: its config, task, model config and mesh; `build_setup`) and its
starting parameters (`initial_params`: from a Hugging Face directory, a params folder or fresh,
`check_compatible`), with what a params folder records of them (`params_meta`)."""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Sequence, cast

from orl_jax import sharding as sharding_lib
from orl_jax.config import build as run_config
from orl_jax.config import derive as config_lib
from orl_jax.config.sections import RunConfig
from orl_jax.models import build, families, params_io
from orl_jax.models.build import init_model_params
from orl_jax.models.family_base import AnyModelConfig
from orl_jax.models.transformer import ModelConfig
from orl_jax.storage import weights as weights_lib
from orl_jax.setup.resolve import (check_prompt_lengths, hf_model_config, load_tokenizer,
                                   own_model_config, resolve_model, run_mesh, special_id)
from orl_jax.tasks import Task, get_task, prompt_task

if TYPE_CHECKING:
  from jax.sharding import Mesh


@dataclasses.dataclass
class Setup:
  """What every run derives from its config."""
  config: RunConfig
  task: Task
  model_cfg: AnyModelConfig   # ModelConfig, or the family's own class (DiffusionGemmaConfig)
  mesh: Mesh

  @property
  def tokenizer(self):
    return self.task.tokenizer


def build_setup(config, *, prompts: Sequence[str] | None = None) -> Setup:
  """config -> task, tokenizer, model config (from model.path's config.json when it is a
  Hugging Face directory), mesh. `prompts`: the task is these texts (`tasks.prompt_task`,
  what launch/decode.py --prompt decodes) instead of `config.task`'s problems."""
  config = run_config.build(config)
  hf_dir, family = dataclasses.astuple(resolve_model(config))
  tokenizer = load_tokenizer(config, hf_dir, family)
  task = (get_task(config.task, tokenizer=tokenizer) if prompts is None
          else prompt_task(config.task, prompts, tokenizer))
  tok = task.tokenizer
  check_prompt_lengths(config, task)
  if families.get(family).own_model:   # DiffusionGemma: its own config class
    model_cfg = own_model_config(
        config, hf_dir, family, config.model.vocab_size or tok.vocab_size,
        eos_ids=getattr(tok, "eos_ids", (tok.eos_id,)), pad_id=getattr(tok, "pad_id", 0))
  elif hf_dir:
    model_cfg = hf_model_config(config, tok, hf_dir, family)
  else:
    vocab_size = config.model.vocab_size or tok.vocab_size
    model_cfg = config_lib.model_config(config, vocab_size=vocab_size, mask_id=tok.mask_id)
    if hasattr(tok, "vocab_hash"):
      from orl_jax.data.hf_tokenizer import check_model_vocab
      check_model_vocab(tok, vocab_size, model_cfg.mask_id)
  return Setup(config, task, model_cfg, run_mesh(config))


def initial_params(setup: Setup):
  """(graphdef, params): read from a Hugging Face `model.path` (straight into the family's
  partition-rule shardings), fresh, or loaded from a params folder (`model.path` or
  `model.init_from`). Only residual adapter parameters may be absent from the weights (they keep
  their zero-output initialisation, and are logged); any other missing or extra tensor is an
  error."""
  weights = weights_lib.weights_of(setup.config)
  if weights is not None and weights.kind == weights_lib.HF:
    from orl_jax.models import hf_read
    _, abstract = build.abstract_params(setup.model_cfg, setup.config.seed)
    shardings = sharding_lib.tree_shardings(abstract, setup.mesh,
                                            families.of_model(setup.model_cfg).partition_rules)
    return hf_read.load_model_params(weights.path, setup.model_cfg.hf_family, setup.model_cfg,
                                     shardings=shardings, seed=setup.config.seed,
                                     check_config=False)
  graphdef, params = init_model_params(setup.model_cfg, setup.config.seed)
  if weights is not None:
    check_compatible(weights.path, setup)
    params, kept = params_io.load_params(weights.path, params)
    if kept:
      logging.warning("%s=%s has no residual adapter: %d adapter parameters start from their "
                      "initialisation (%s)", weights.field, weights.path, len(kept),
                      ", ".join(kept))
  return graphdef, params


# ModelConfig fields that decide which tensors exist and their shapes (only these are compared:
# meta.json of older runs names the attention layout `family`, now `attention`, unread here)
_SHAPE_FIELDS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
                 "qk_norm", "tie_embeddings", "first_k_dense")


def check_compatible(params_dir: str, setup: Setup) -> None:
  """Raises ValueError naming both sides when the folder's meta.json records another vocabulary
  or another model shape than the configured one."""
  meta_path = os.path.join(params_dir, params_io.META_FILE)
  meta = params_io.read_meta(params_dir)
  vocab = meta.get("vocab_hash")
  stored = meta.get("model", {})
  tok = setup.tokenizer
  tok_name = getattr(tok, "source", None) or f"the {setup.config.task.name} task's tokenizer"
  if vocab and hasattr(tok, "vocab_hash") and vocab != tok.vocab_hash():
    raise params_io.ParamsFileError(
        f"{meta_path} records another vocabulary (hash {vocab}) than {tok_name} (hash "
        f"{tok.vocab_hash()}, {tok.vocab_size} tokens): use the "
        "tokenizer the parameters were trained with, or retrain them (`make base`)")
  ours = dataclasses.asdict(setup.model_cfg)
  if "vocab_size" in stored and stored["vocab_size"] != ours["vocab_size"]:
    raise params_io.ParamsFileError(
        f"{meta_path} has vocab_size={stored['vocab_size']} but the model built from {tok_name} "
        f"has {ours['vocab_size']} rows: use the tokenizer the parameters were trained with (or "
        "set model.vocab_size)")
  bad = [f"model.{k}={ours[k]!r} but {params_io.META_FILE} says {stored[k]!r}"
         for k in _SHAPE_FIELDS if k in stored and stored[k] != ours[k]]
  if bad:
    raise params_io.ParamsFileError(f"{meta_path} describes another model than the config "
                                    f"({'; '.join(bad)}): set those fields or point "
                                    "model.path at another folder")


def params_meta(setup: Setup, extra: dict | None = None) -> dict:
  meta = {"model": dataclasses.asdict(setup.model_cfg), "task": setup.config.task.to_dict(),
          "decode": setup.config.decode.to_dict()}
  if hasattr(setup.tokenizer, "vocab_hash"):
    meta["vocab_hash"] = setup.tokenizer.vocab_hash()
  meta.update(extra or {})
  return meta
def sizing_model_config(config, *, laid_out: bool = True):
  """The ModelConfig of `config` without reading a tokenizer (`model.vocab_size` must be set,
  or the task's tokenizer is used; a Hugging Face `model.path` gives the architecture).
  `laid_out`: experts are sized as laid out by the partition rules, not run
  (`expert_parallel` off); False keeps the run's own setting (the compile command)."""
  config = run_config.build(config, rules=False)
  hf_dir = weights_lib.hf_dir(config)
  vocab = config.model.vocab_size
  mask_id = special_id(config.model.special_tokens.mask)
  if hf_dir or not vocab:
    cfg = cast(ModelConfig, build_setup(config).model_cfg)   # not a family with its own model
  else:
    cfg = config_lib.model_config(config, vocab_size=vocab, mask_id=mask_id)
  if cfg.moe is not None and laid_out:
    cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, expert_parallel=False))
  return cfg
def run_model_config(config):
  """The model config a run of `config` builds (a family's own config class included), its
  decoder defaults filled in, without weights: `model.path`'s config.json when it is a
  Hugging Face directory, else the config's fields (`model.vocab_size` set, as for sizing)."""
  config = run_config.build(config, rules=False)
  run = resolve_model(config)
  family = families.get(run.family)
  if not family.own_model:
    return sizing_model_config(config, laid_out=False)
  vocab = config.model.vocab_size
  if not vocab and not run.hf_dir:
    raise config_lib.ConfigError(f"set model.vocab_size (or model.path) to build a "
                                 f"{family.name} model without its weights")
  return own_model_config(config, run.hf_dir, family.name, vocab)
