"""The default family: models of ours (`model.hf_family = ""`, the tiny models and any model the
run config sizes itself), the shared `Transformer` with every architecture field from
`model.*` (`config.model_config`).

What it records: the generic partition rules, the block decoder's rules the tiny model is trained
with (the response starts on a block boundary, `prompt_end`; a position commits at
confidence >= tau), a mask token (its tokenizer names the special tokens: the tiny task's word
tokenizer, or `model.special_tokens`). Its attention layout is `model.attention`'s. It has no
Hugging Face form: its name map and config.json callables raise an error that says so.
"""
from __future__ import annotations

from orl_jax import sharding
from orl_jax.models.family_base import Family


def no_hf_form(*_):
  """A model of ours has no config.json and no Hugging Face tensor names."""
  raise ValueError("model.hf_family='' (a model of ours) has no Hugging Face form: set "
                   "model.hf_family to a registry family to read or write a Hugging Face "
                   "directory")


FAMILY = Family(
    name="", model_types=(), attention="",
    architecture_from_hf=no_hf_form, hf_config_json=no_hf_form, tensor_rules=no_hf_form,
    partition_rules=sharding.PARTITION_RULES, special_tokens={},
    decode=dict(block_placement="prompt_end", commit_compare=">="))
