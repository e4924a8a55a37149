"""The block decoder's config of a run (docs/decoding.md#one-denoising-step): `decode_config`
turns the run config's `decode` section, with the rules of the weights' registry family
(`family_rules`), into the `DecodeConfig` the jitted decoders receive. It reads the run config's
attributes and imports nothing of `orl_jax.config`, which sits above the decoders."""
from __future__ import annotations

from typing import TYPE_CHECKING

from orl_jax.decode.config import DecodeConfig
from orl_jax.errors import ConfigError, required
from orl_jax.models import families
from orl_jax.unmasking import UnmaskRule

if TYPE_CHECKING:
  from orl_jax.config.sections import RunConfig


# The block decoder's rules a family sets (`Family.decode`) and `decode.*` may override
BLOCK_RULES = ("block_placement", "commit_compare")


def family_rules(config: RunConfig, family: str | None = None) -> dict:
  """{block_placement, commit_compare} of a run: `decode.*` where set, else ("auto") the
  authors' rules of registry family `family` (None: `model.hf_family`; '' = ours, whose
  default family records the rules the tiny model is trained with). Pass the weights' family
  (`Setup.model_cfg.hf_family`): a config written for one family may load another's
  checkpoint."""
  family = config.model.hf_family if family is None else family
  entry = families.get(family)
  missing = [k for k in BLOCK_RULES if k not in entry.decode]
  if missing:
    raise ConfigError(f"the {family!r} family does not decode with the block decoder (its "
                      f"registry entry has no {missing}): it decodes with its own sampler")
  rules = {k: entry.decode[k] for k in BLOCK_RULES}
  d = config.decode
  for k in BLOCK_RULES:
    if getattr(d, k) != "auto":
      rules[k] = getattr(d, k)
  return rules


def decode_config(config: RunConfig, *, mask_id: int, eos_id: int,
                  rule: UnmaskRule | None = None, temperature: float | None = None,
                  capture_states: int = 0, family: str | None = None) -> DecodeConfig:
  """The block decoder's config of a run; `family`: the weights' registry family (decides
  the "auto" rules, `family_rules`; None: `model.hf_family`)."""
  d = config.decode
  if rule is None:
    rule = UnmaskRule(d.rule, required(d.rule_value, "decode.rule_value"))
  return DecodeConfig(gen_length=required(d.gen_length, "decode.gen_length"),
                      block_size=d.block_size, mask_id=mask_id,
                      eos_id=eos_id, rule=rule,
                      temperature=d.temperature if temperature is None else temperature,
                      max_steps_per_block=required(d.max_steps_per_block,
                                                   "decode.max_steps_per_block"),
                      capture_states=capture_states,
                      top_k=d.top_k, edit_threshold=d.edit_threshold,
                      max_post_edit_steps=d.max_post_edit_steps, cache=d.cache,
                      eos_early_stop=d.eos_early_stop,
                      **family_rules(config, family))
