"""The model-family registry: one `Family` per HF architecture (see `base.py`), looked up by our
name (`model.hf_family`) or by a checkpoint's config.json `model_type`.

Adding a family: write its module (config.json <-> ModelConfig, `TensorRule`s, partition rules,
attention layout, decoder defaults, special tokens) and list its `FAMILY` here.
"""
from __future__ import annotations

from orl_jax.models.families import diffusion_gemma, llada, llada2_moe, qwen3
from orl_jax.models.families.base import (ATTENTION_LAYOUTS, Family,  # noqa: F401
                                          TensorRule)
from orl_jax import sharding

FAMILIES: dict[str, Family] = {f.name: f for f in (llada.FAMILY, qwen3.FAMILY,
                                                    llada2_moe.FAMILY, diffusion_gemma.FAMILY)}
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}


def get(name: str) -> Family:
  """The family called `name`; a ValueError naming `model.hf_family` and the choices."""
  family = FAMILIES.get(name)
  if family is None:
    raise ValueError(f"model.hf_family={name!r} must be one of {tuple(FAMILIES)}")
  return family


def for_model_type(model_type: str, where: str = "config.json") -> Family:
  """The family of an HF `model_type`; a ValueError naming the file and the known types."""
  family = BY_MODEL_TYPE.get(str(model_type).lower())
  if family is None:
    raise ValueError(f"{where} has model_type={model_type!r}, which no model family reads "
                     f"(known: {', '.join(sorted(BY_MODEL_TYPE))})")
  return family


def partition_rules(name: str) -> tuple:
  """The partition rules of family `name` ('' = our own models: the generic rules)."""
  return get(name).partition_rules if name else sharding.PARTITION_RULES
