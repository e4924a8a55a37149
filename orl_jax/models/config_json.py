"""What the families' config.json readers share: typed, range-checked reads of a field
(with the default the official configuration class gives a missing key) and the checks of
settings the shared model does not implement.

Policy (docs/models.md#missing-and-ignored-configjson-keys): a key missing from config.json
takes the official class's default; a key the official modeling code never reads is ignored (the
family lists the ones worth a log line); a value of the wrong type or out of range, or a setting
the model does not implement, raises `ConfigJsonError` naming the field (the reader of the file
adds its path).
"""
from __future__ import annotations

import json
import math

NULLABLE = object()   # `read(..., default=NULLABLE)`: null or missing read as None


class ConfigJsonError(ValueError):
  """A config.json field of the wrong type, out of range, or unsupported; the message names the
  field (and the caller the file)."""


def shown(value) -> str:
  """`value` as config.json writes it (shortened)."""
  text = json.dumps(value, default=str)
  return text if len(text) <= 40 else text[:37] + "..."


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def read_int(hf: dict, key: str, default, *, minimum: int = 1, nullable: bool = False):
  """`hf[key]` as an int >= `minimum` (`default` when missing; None when null and `nullable`)."""
  value = hf.get(key, default)
  if value is None and nullable:
    return None
  if key not in hf and default is None:
    raise ConfigJsonError(f"{key} is missing: it must be an integer >= {minimum}")
  if not _is_int(value) or value < minimum:
    null = " or null" if nullable else ""
    raise ConfigJsonError(f"{key}={shown(value)} must be an integer >= {minimum}{null}")
  return value


def read_float(hf: dict, key: str, default, *, positive: bool = True,
               at_most: float | None = None) -> float:
  """`hf[key]` as a finite number (> 0 when `positive`, <= `at_most`); `default` when missing."""
  value = hf.get(key, default)
  ok = _is_number(value) and (value > 0 or not positive) and (at_most is None
                                                             or value <= at_most)
  if not ok:
    bound = " > 0" if positive else ""
    bound += f" and <= {at_most}" if at_most is not None else ""
    raise ConfigJsonError(f"{key}={shown(value)} must be a finite number{bound}")
  return float(value)


def read_bool(hf: dict, key: str, default) -> bool:
  value = hf.get(key, default)
  if not isinstance(value, bool):
    raise ConfigJsonError(f"{key}={shown(value)} must be true or false")
  return value


def read_str(hf: dict, key: str, default) -> str:
  value = hf.get(key, default)
  if not isinstance(value, str):
    raise ConfigJsonError(f"{key}={shown(value)} must be a string")
  return value


def read_dict(hf: dict, key: str) -> dict:
  """`hf[key]` as an object ({} when missing or null)."""
  value = hf.get(key)
  if value is None:
    return {}
  if not isinstance(value, dict):
    raise ConfigJsonError(f"{key}={shown(value)} must be an object or null")
  return value


def read_ids(hf: dict, key: str, default) -> tuple[int, ...] | None:
  """A token id, or a list of them (`eos_token_id`), as a tuple (None when missing or null)."""
  value = hf.get(key, default)
  if value is None:
    return None
  ids = value if isinstance(value, list) else [value]
  if not ids or not all(_is_int(i) and i >= 0 for i in ids):
    raise ConfigJsonError(f"{key}={shown(value)} must be a token id (an integer >= 0) or a "
                          "list of them")
  return tuple(ids)


def require(hf: dict, key: str, default, supported: tuple, reason: str) -> None:
  """A setting the shared model implements only with the values `supported` (`default`: the
  official class's value of a missing key)."""
  value = hf.get(key, default)
  if value not in supported:
    missing = "" if key in hf else " (missing: the official default)"
    raise ConfigJsonError(f"{key}={shown(value)}{missing} is not supported: {reason}")


def require_all(hf: dict, fixed: dict, checkpoints: str) -> None:
  """`require` for every key of `fixed` ({key: (official default, supported values)}); the
  message says that `checkpoints` use the first supported value."""
  for key, (default, supported) in fixed.items():
    require(hf, key, default, supported, f"{checkpoints} use {key}={shown(supported[0])} and "
            "only that is implemented")


def divides(small: int, small_key: str, big: int, big_key: str) -> None:
  if big % small:
    raise ConfigJsonError(f"{small_key}={small} must divide {big_key}={big}")


def rope_theta(hf: dict, default: float) -> float:
  """`rope_theta` at the top level or inside `rope_parameters` / `rope_scaling`, whose
  `rope_type` must be the default (unscaled) RoPE."""
  params = read_dict(hf, "rope_parameters") or read_dict(hf, "rope_scaling")
  kind = params.get("rope_type", params.get("type", "default"))
  if kind != "default":
    raise ConfigJsonError(f"rope_type={shown(kind)} (rope_parameters / rope_scaling) is not "
                          "supported: only the default, unscaled RoPE is implemented")
  if "rope_theta" in hf:
    return read_float(hf, "rope_theta", default)
  return read_float(params, "rope_theta", default)


def present(hf: dict, keys) -> list[str]:
  """'key=value' for each of `keys` that `hf` sets (for the log line of ignored keys)."""
  return [f"{k}={shown(hf[k])}" for k in keys if k in hf]
