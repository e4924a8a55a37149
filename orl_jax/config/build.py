"""The run config, typed and resolved once: `build(config)` is the boundary below which no module
reads the command line's `ml_collections.ConfigDict`.

`configs/*.py` and `--config.a.b=v` stay the surface a user writes; `build`

1. turns each section into its frozen dataclass (`orl_jax.config.sections`: `Model`, `Decode`,
   `Train`, `Orl`, `Replay`, `Loss`, `Task`, `Eval`, `Checkpoint`, `Mesh`, `Distributed`), a
   field the config leaves out taking the default written there, a field no section has refused
   with the nearest names, a registry family's own settings added (`Family.config_sections`);
2. resolves the weights' family (a Hugging Face `model.path`'s config.json names it) and fills
   the `decode.*` fields its generation defaults cover and the config leaves unset (None), from
   the directory's generation_config.json, else the official defaults (logged);
3. checks every rule (`orl_jax.config.derive.validate`), all problems in one `ConfigError`.
"""
from __future__ import annotations

import logging

from orl_jax.config import derive as config_lib
from orl_jax.storage import weights as weights_lib
from orl_jax.config.sections import ConfigError, RunConfig, convert
from orl_jax.models import families, hf_read

__all__ = ["ConfigError", "RunConfig", "build", "convert", "fill_decode_defaults"]


def build(config, *, rules: bool = True) -> RunConfig:
  """The run config of `config`, resolved once: converted (`convert`), the weights' family's
  sections added and its generation defaults filled into `decode` (logged), and with `rules`
  every rule checked (`orl_jax.config.derive.validate`; the dry run and the compile command size a
  layout whose batch does not divide yet without them). A RunConfig is not resolved again."""
  if isinstance(config, RunConfig):
    if rules:
      config_lib.validate(config)
    return config
  run = convert(config)
  hf_dir = weights_lib.hf_dir(run)
  family = _family_of(run, hf_dir)
  if family != run.model.hf_family:      # the weights' family may declare other fields
    run = convert(config, other_family=family)
  run = fill_decode_defaults(run, hf_dir, family)
  if rules:
    config_lib.validate(run)
  return run


def _family_of(run: RunConfig, hf_dir: str) -> str:
  if hf_dir:
    return hf_read.family_of(hf_dir)
  return run.model.hf_family


def fill_decode_defaults(run: RunConfig, hf_dir: str, family: str) -> RunConfig:
  """`run` with the `decode.*` fields that registry family `family`'s generation defaults
  cover and the config leaves unset (None) filled from `hf_dir`'s generation_config.json,
  else the official defaults (DiffusionGemma's: transformers'); logged."""
  try:
    fam = families.get(family)
  except ValueError:                     # an unknown family: `validate` names it
    return run
  if not fam.generation_defaults:
    return run
  values, origins = hf_read.decode_defaults(run.decode, hf_dir, fam.generation_defaults)
  if not values:
    return run
  logging.warning("decode settings the config leaves unset: %s", ", ".join(
      f"decode.{k}={values[k]} ({v})" for k, v in origins.items()))
  return run.replace(**{f"decode.{k}": v for k, v in values.items()})
