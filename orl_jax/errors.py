"""The error a config that cannot run raises, and the check of a setting its family may fill.

A leaf module: the run config's sections (`orl_jax.config`) and the owners of the settings they
hold (`decode/`, `replay/`, the losses) raise the same `ConfigError` without importing each other.
"""
from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
  """A config that cannot run; the message names the fields."""


def required(value: T | None, field: str) -> T:
  """The value of a setting the model's family may fill (`decode.gen_length`, ...); ConfigError
  when it is still unset."""
  if value is None:
    raise ConfigError(f"invalid config: {field} is unset and the model's family has no "
                      f"generation default for it: set --config.{field}")
  return value
