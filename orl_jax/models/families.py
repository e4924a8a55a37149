"""The model-family registry: one `Family` per HF architecture (`family_base.py`), looked up by our
name (`model.hf_family`) or by a checkpoint's config.json `model_type`, and the default family of
our own models (`ours`, `model.hf_family = ""`).

Each family is a folder `orl_jax/models/<name>/` whose `__init__.py` exports `FAMILY`; adding one
is its folder, one line here and one config file (docs/code.md, "Adding a model family").
"""
from __future__ import annotations

from orl_jax.models import diffusion_gemma, llada, llada2_moe, ours, qwen3
from orl_jax.models.family_base import (ATTENTION_LAYOUTS, Family,  # noqa: F401
                                        TensorRule)

# The Hugging Face families (`model.hf_family` values other than "")
FAMILIES: dict[str, Family] = {f.name: f for f in (llada.FAMILY, qwen3.FAMILY,
                                                    llada2_moe.FAMILY, diffusion_gemma.FAMILY)}
BY_MODEL_TYPE: dict[str, Family] = {t: f for f in FAMILIES.values() for t in f.model_types}
OURS: Family = ours.FAMILY   # the default: models of ours ("")


def get(name: str) -> Family:
  """The family called `name` ('' = ours); a ValueError naming `model.hf_family` and the
  choices."""
  if not name:
    return OURS
  family = FAMILIES.get(name)
  if family is None:
    raise ValueError(f"model.hf_family={name!r} must be '' (a model of ours) or one of "
                     f"{tuple(FAMILIES)}")
  return family


def of_model(model_cfg) -> Family:
  """The family of a model config (its `hf_family`; ours when it has none)."""
  return get(getattr(model_cfg, "hf_family", ""))


def for_model_type(model_type: str, where: str = "config.json") -> Family:
  """The family of an HF `model_type`; a ValueError naming the file and the known types."""
  family = BY_MODEL_TYPE.get(str(model_type).lower())
  if family is None:
    raise ValueError(f"{where} has model_type={model_type!r}, which no model family reads "
                     f"(known: {', '.join(sorted(BY_MODEL_TYPE))})")
  return family
