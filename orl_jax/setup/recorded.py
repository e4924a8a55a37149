"""The settings a run's checkpoints record (`recorded_settings`): the one table of what decides
its rollouts and how they are replayed and scored, resolved
(docs/training.md#resume-and-changed-settings); `orl_jax.storage.run_settings` compares it on
resume."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from orl_jax.config import derive as config_lib
from orl_jax.config.sections import RunConfig
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
  compares it (`orl_jax/storage/run_settings.py`). Values are resolved: the weights' family, the
  tokenizer's special ids, the family's block rules, the decode defaults `build_setup` filled
  in. Step counts, logging, checkpointing, batch sizes and the work directory are left out:
  they may change between a run and its resume; so are the ORL sections for the other modes."""
  config, tok, model_cfg = setup.config, setup.tokenizer, setup.model_cfg
  m, task, d, o, r = config.model, config.task, config.decode, config.orl, config.replay
  family = getattr(model_cfg, "hf_family", "")
  rules = _block_rules(config, family)
  loss = config_lib.loss_config(config)
  table = {
      "train.mode": config.train.mode,
      # model and tokenizer identity
      "model.path": m.path or m.init_from,
      "model.hf_family": family,
      "model.residual.mode": m.residual.mode,
      "model.residual.scale": m.residual.scale,
      "model.residual.temperature": m.residual.temperature,
      "model.tokenizer": m.tokenizer,
      "model.vocab_size": model_cfg.vocab_size,
      "tokenizer.vocab_hash": tok.vocab_hash() if hasattr(tok, "vocab_hash") else "",
      "model.special_tokens.mask": getattr(tok, "mask_id", None),
      "model.special_tokens.eos": list(getattr(tok, "eos_ids", (tok.eos_id,))),
      # the prompts
      "task.name": task.name,
      "task.path": task.path,
      "task.chat": task.chat,
      "task.prompt_len": task.prompt_len,
      # how a rollout decodes
      "decode.block_size": d.block_size,
      "decode.gen_length": d.gen_length,
      "decode.block_placement": rules.get("block_placement"),
      "decode.commit_compare": rules.get("commit_compare"),
      "decode.max_steps_per_block": d.max_steps_per_block,
      "decode.edit_threshold": d.edit_threshold,
      "decode.max_post_edit_steps": d.max_post_edit_steps,
      **_family_decode_settings(config, family),
      "orl.rollout_rule": o.rollout_rule,
      "orl.rollout_rule_value": o.rollout_rule_value,
      "orl.rollout_temperature": o.rollout_temperature,
      "orl.group_size": o.group_size,
      "orl.min_reward": o.min_reward,
      # what a rollout captures and how its states are replayed
      "decode.top_k": d.top_k,
      "orl.capture_states": o.capture_states,
      "orl.capture_routes": o.capture_routes,
      "replay.layout": r.layout,
      "replay.states_per_response": r.states_per_response,
      # the loss
      "loss.gate_entropy": loss.gate_entropy,
      "loss.aec_rho": loss.aec_rho,
      "loss.conf_entropy": loss.conf_entropy,
      "loss.kl_cap": loss.kl_cap,
      "loss.w_aec": loss.w_aec,
      "loss.w_kl": loss.w_kl,
      "loss.kl_reference": loss.kl_reference,
  }
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
