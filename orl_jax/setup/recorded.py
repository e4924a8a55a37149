"""The settings a run's checkpoints record (`recorded_settings`): the one table of what decides
its rollouts and how they are replayed and scored, resolved
(docs/training.md#resume-and-changed-settings); `orl_jax.storage.run_settings` compares it on
resume."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from orl_jax.config import derive as config_lib
from orl_jax.config.sections import RunConfig, recorded_fields
from orl_jax.decode import from_run
from orl_jax.models import families

if TYPE_CHECKING:
  from orl_jax.setup.build import Setup


def _family_decode_settings(config: RunConfig, family: str) -> dict:
  """{decode.<field>: value} of the decode settings the weights' family declares
  (`Family.config_sections["decode"]`: DiffusionGemma's sampler), resolved by `build_setup`;
  {} for a family that declares none."""
  section = families.get(family).config_sections.get("decode")
  if section is None:
    return {}
  own = dataclasses.asdict(config.decode.family_settings(section))
  return {f"decode.{name}": value for name, value in own.items()}


def recorded_settings(setup: Setup) -> dict:
  """{field: resolved value} of every setting that decides what the run's rollouts are and how
  they are replayed and scored, the one table of them: each checkpoint records it and a resume
  compares it (`orl_jax/storage/run_settings.py`). Its fields are those the sections mark
  `recorded` (`orl_jax.config.sections.recorded_fields`), the vocabulary's hash, and the decode
  settings the weights' family declares. Values are resolved: the weights' family, the
  tokenizer's special ids, the family's block rules, the decode defaults `build_setup` filled
  in. Step counts, logging, checkpointing, batch sizes and the work directory are not marked:
  they may change between a run and its resume; the ORL sections are left out for the other
  modes."""
  config, tok, model_cfg = setup.config, setup.tokenizer, setup.model_cfg
  family = getattr(model_cfg, "hf_family", "")
  rules = _block_rules(config, family)
  table = recorded_fields(config)
  resolved = {
      "model.path": config.model.path or config.model.init_from,
      "model.hf_family": family,
      "model.vocab_size": model_cfg.vocab_size,
      "model.special_tokens.mask": getattr(tok, "mask_id", None),
      "model.special_tokens.eos": list(getattr(tok, "eos_ids", (tok.eos_id,))),
      **{f"decode.{k}": rules.get(k) for k in from_run.BLOCK_RULES},
  }
  unmarked = sorted(set(resolved) - set(table))
  if unmarked:
    raise ValueError(f"resolved settings the sections do not mark recorded: {unmarked}")
  table.update(resolved)
  table["tokenizer.vocab_hash"] = tok.vocab_hash() if hasattr(tok, "vocab_hash") else ""
  table.update(_family_decode_settings(config, family))
  if config.train.mode == "orl":
    return table
  return {k: v for k, v in table.items() if not k.startswith(_ORL_ONLY)}


_ORL_ONLY = ("orl.", "replay.", "loss.")   # settings only an ORL run reads


def _block_rules(config, family: str) -> dict:
  """The block decoder's resolved rules (`decode.from_run.family_rules`); {} for a family that
  decodes with its own sampler."""
  try:
    return from_run.family_rules(config, family)
  except config_lib.ConfigError:
    return {}
