"""Shared start-up of the launchers: repo on sys.path, and `run(main)`, which reports mistakes in
the command line or the inputs in one line instead of a traceback."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def user_errors() -> tuple[type, ...]:
  """Exceptions whose message is written for the person who launched the run (it names the
  field or file and what to do): printed alone, without a traceback."""
  from orl_jax.aot.targets import TargetError
  from orl_jax.checkpoint import CheckpointRestoreError
  from orl_jax.config import ConfigError
  from orl_jax.data.hf_tokenizer import TokenizerError
  from orl_jax.data.jsonl import DatasetError, MissingTaskPackage
  from orl_jax.models.hf_read import CheckpointError
  from orl_jax.params_io import ParamsFileError
  from orl_jax.run_settings import ChangedSettingsError
  return (ConfigError, TokenizerError, DatasetError, MissingTaskPackage, CheckpointError,
          ParamsFileError, CheckpointRestoreError, ChangedSettingsError, TargetError)


def _innermost_text(error: BaseException) -> str:
  """ml_collections wraps KeyError('name\\nDid you mean ...') in an AttributeError."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  return str(error.args[0]) if error.args else str(error)


# config fields that were renamed or replaced: `model.x` -> what to set instead
REPLACED_FIELDS = {
    "model.hf_dir": "--config.model.path=DIR (a Hugging Face model directory or an orl_jax "
                    "params folder; its config.json gives the family and every shape)",
}


def override_message(error: BaseException, argv: list[str]) -> str:
  """One line for a `--config.a.b=...` override that names no config field (with what to set
  instead when the field was replaced)."""
  text = _innermost_text(error)
  key = text.splitlines()[0].strip().strip("'\"")
  suggestion = re.search(r'Did you mean "([^"]+)"', text)
  for arg in argv[1:]:
    flag = arg.split("=", 1)[0]
    path = flag.lstrip("-").split(".")
    if flag.startswith("--") and key in path[1:]:
      at = path.index(key, 1)
      parent = ".".join(path[:at])
      line = f"{flag}: {parent} has no field {key!r}"
      replaced = REPLACED_FIELDS.get(".".join(path[1:at + 1]))
      if replaced:
        line += f"; set {replaced} instead"
      elif suggestion:
        line += f"; did you mean --{'.'.join(path[:at] + [suggestion.group(1)] + path[at + 1:])}?"
      return line
  return " ".join(text.split())


def parse_flags(argv: list[str]) -> list[str]:
  from absl import app
  try:
    return app.parse_flags_with_usage(argv)
  except (KeyError, AttributeError) as e:   # what ml_collections raises for an unknown field
    sys.stderr.write(f"{os.path.basename(argv[0])}: {override_message(e, argv)}\n")
    sys.exit(2)


def run(main) -> None:
  """`absl.app.run(main)`; a misspelled override, or a user error raised by `main`, ends the
  process with one line on stderr (exit status 2 or 1)."""
  from absl import app

  def main_reporting_user_errors(argv):
    try:
      return main(argv)
    except user_errors() as e:
      sys.stderr.write(f"{os.path.basename(sys.argv[0])}: {e}\n")
      sys.exit(1)

  app.run(main_reporting_user_errors, flags_parser=parse_flags)
