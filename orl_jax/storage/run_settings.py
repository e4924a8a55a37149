"""The settings a run's checkpoints were written under, and the check a resume makes.

A run's settings are {field: resolved value} of what decides its rollouts and how they are
replayed and scored (the table: `orl_jax/setup/recorded.py`). Each checkpoint records them as
readable JSON (its step's `_CHECKPOINT_METADATA`, under `custom_metadata.run_settings`), so a
resume under other values stops and names every field that differs, with the recorded and the
new value. `checkpoint.allow_changed` (fields separated by commas) accepts the changes a user
means; a checkpoint that records no settings (written before they were recorded) resumes with
a warning.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

RECORD_KEY = "run_settings"            # its key in a checkpoint's custom metadata
ALLOW_FIELD = "checkpoint.allow_changed"


class ChangedSettingsError(ValueError):
  """A resume under settings that differ from its checkpoint's in fields the run does not
  accept; the message names each field (recorded -> now) and the flag that accepts them."""


def as_recorded(settings: Mapping[str, Any]) -> dict:
  """`settings` as a checkpoint holds them (JSON: tuples become lists), so that a value read
  back compares equal to the one written."""
  return json.loads(json.dumps(dict(settings)))


def allowed_fields(text: str, settings: Mapping[str, Any]) -> tuple[str, ...]:
  """The fields `checkpoint.allow_changed` names (separated by commas); a ChangedSettingsError
  for a name that is not one of the recorded settings."""
  names = tuple(n.strip() for n in text.split(",") if n.strip())
  unknown = [n for n in names if n not in settings]
  if unknown:
    raise ChangedSettingsError(
        f"{ALLOW_FIELD}={text!r} names {', '.join(unknown)}, which a checkpoint does not "
        f"record; the recorded settings are {', '.join(settings)}")
  return names


def changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple]:
  """(field, recorded value, current value) of each field whose value differs, in the order of
  `current`; a field only one side holds (a setting recorded since) is not compared."""
  return [(k, recorded[k], v) for k, v in current.items() if k in recorded and recorded[k] != v]


def check_resume(recorded: Mapping[str, Any] | None, current: Mapping[str, Any],
                 allowed: Sequence[str], where: str) -> str | None:
  """The warning a resume of the checkpoint `where` logs (None: nothing to say), or a
  ChangedSettingsError when a setting changed that `allowed` does not name. `recorded`: the
  checkpoint's settings (None: it records none); `current`: this run's (`as_recorded`)."""
  if recorded is None:
    return (f"{where} records no run settings (it was written before checkpoints recorded "
            "them): resuming without checking that the model, tokenizer, decoding, capture and "
            "loss settings are the ones it was trained with")
  found = changes(recorded, current)
  refused = [c for c in found if c[0] not in allowed]
  if refused:
    accept = list(allowed) + [field for field, _, _ in refused]
    raise ChangedSettingsError(
        f"{where} was written under other settings (recorded -> now):\n{_lines(refused)}\n"
        f"To resume it with these changes, add\n  --config.{ALLOW_FIELD}={','.join(accept)}\n"
        "or start the changed run in a new config.workdir.")
  if found:
    return (f"resuming {where} with changed settings that {ALLOW_FIELD} accepts (recorded -> "
            f"now):\n{_lines(found)}")
  return None


def _lines(found: list[tuple]) -> str:
  return "\n".join(f"  {field}: {json.dumps(old)} -> {json.dumps(new)}"
                   for field, old, new in found)
