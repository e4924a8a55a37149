"""Shared start-up of the launchers: repo on sys.path, and `run(main)`, which reports mistakes in
the command line or the inputs in one line instead of a traceback."""
import difflib
import os
import re
import signal
import sys
from typing import NoReturn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def user_errors() -> tuple[type, ...]:
  """Exceptions whose message is written for the person who launched the run (it names the
  field or file and what to do): printed alone, without a traceback."""
  from orl_jax.aot.targets import TargetError
  from orl_jax.storage.checkpoint import CheckpointRestoreError
  from orl_jax.errors import ConfigError
  from orl_jax.data.hf_tokenizer import TokenizerError
  from orl_jax.data.jsonl import DatasetError, MissingTaskPackage
  from orl_jax.models.hf_read import CheckpointError
  from orl_jax.models.params_io import ParamsFileError
  from orl_jax.storage.run_settings import ChangedSettingsError
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
    **{name: f"--config.demo.{name} (the demo pipeline's own section)"
       for name in ("compare_offline", "ablations", "stages", "stage_start", "base_checkpoint",
                    "warmup_checkpoint", "seeds", "warmup_seed")},
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


def _defines_get_config(path: str) -> bool:
  """Whether the file at `path` can give ml_collections a `get_config` (defined or imported)."""
  with open(path, encoding="utf-8", errors="replace") as f:
    return "get_config" in f.read()


def config_files(directory: str) -> list[str]:
  """The config files in `directory`: its `*.py` files with a `get_config`."""
  paths = [os.path.join(directory, name) for name in sorted(os.listdir(directory))]
  return [p for p in paths if p.endswith(".py") and os.path.isfile(p) and _defines_get_config(p)]


def config_flag_value(argv: list[str]) -> str | None:
  """The value of the last `--config=...` (or `--config ...`) in `argv`; None without one."""
  value = None
  for i, arg in enumerate(argv[1:], start=1):
    if arg in ("--config", "-config") and i + 1 < len(argv):
      value = argv[i + 1]
    elif arg.startswith(("--config=", "-config=")):
      value = arg.split("=", 1)[1]
  return value


def config_file_message(value: str | None) -> str | None:
  """One line for a `--config` that names no config file (none given, a missing path, a folder,
  a Python file without `get_config`), naming the config files there are; None when it names
  one (ml_collections then loads it, and an unknown variant is `flag_error_message`'s)."""
  ours = os.path.normpath(os.path.join(os.path.relpath(ROOT), "configs"))
  if value is None:
    return (f"--config is missing: give a config file and its variant, e.g. "
            f"--config={os.path.join(ours, 'tiny.py')}:smoke")
  path = value.split(":", 1)[0]
  folder = os.path.dirname(path)
  files = (config_files(folder) if folder and os.path.isdir(folder) else []) or config_files(ours)
  hint = ""
  if os.path.isfile(path):
    if _defines_get_config(path):
      return None
    problem = f"{path} is not a config file (it has no get_config)"
  elif os.path.isdir(path):
    problem = f"{path} is a folder, not a config file"
  else:
    problem = f"{path} does not exist"
    close = difflib.get_close_matches(path, files, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
  return f"--config: {problem}{hint}; the config files are {', '.join(files)}"


def _innermost(error: BaseException) -> BaseException:
  """The exception `error` was raised while handling, innermost: absl re-raises what a
  config's `get_config` raised inside two wrappers."""
  while True:
    inner = error.__cause__ or error.__context__
    if inner is None:
      return error
    error = inner


# what Python's conversions say of a value of the wrong type -> the type the field takes
_WRONG_TYPE = (
    (re.compile(r"invalid literal for int\(\) with base 10: (.*)$"), "an integer"),
    (re.compile(r"could not convert string to float: (.*)$"), "a number"),
    (re.compile(r"\('Non-boolean argument to boolean flag', (.*)\)$"), "True or False"),
)


def flag_error_message(error: BaseException) -> str:
  """One line for a flag absl could not parse: for a config file whose `get_config` refused
  its argument (an unknown variant), the config's own message (which lists the variants); for
  an override of the wrong type, the type the field takes; else absl's message."""
  if "Error whilst parsing config file" in str(error):
    error = _innermost(error)
  text = " ".join(str(error).split())
  override = re.match(r"flag (--config\.[\w.]+)=.*?: ", text)
  if override:
    for pattern, wanted in _WRONG_TYPE:
      value = pattern.search(text[override.end():])
      if value:
        return f"{override.group(1)}: {override.group(1)[2:]} takes {wanted}, not {value.group(1)}"
  return text


_HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "h", "?")


def _exit_usage(argv: list[str], message: str) -> NoReturn:
  sys.stderr.write(f"{os.path.basename(argv[0])}: {message}\n")
  sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing; a mistake on the command line (no config file, or none at that path,
  an unknown variant, a misspelled override, a value of the wrong type, an unknown flag) ends
  the process with one line on stderr and exit status 2."""
  from absl import flags
  asks_help = any(arg.lstrip("-").split("=")[0] in _HELP_FLAGS for arg in argv[1:])
  if "config" in flags.FLAGS and flags.FLAGS["config"].default is None and not asks_help:
    message = config_file_message(config_flag_value(argv))
    if message:
      _exit_usage(argv, message)
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError) as e:   # what ml_collections raises for an unknown field
    _exit_usage(argv, override_message(e, argv))
  except flags.Error as e:
    _exit_usage(argv, flag_error_message(e))


def _say(line: str) -> None:
  sys.stderr.write(f"{os.path.basename(sys.argv[0])}: {line}\n")


def stop_on_signals() -> None:
  """SIGINT and SIGTERM stop a training run at its next step boundary with a checkpoint, and
  the process at once outside a training loop (`orl_jax.train.interrupt`); either way one line
  says where it stopped and how to resume."""
  from orl_jax.train import interrupt
  interrupt.install()


def run(main) -> None:
  """`absl.app.run(main)`; a mistake on the command line, or a user error raised by `main`,
  ends the process with one line on stderr (exit status 2 or 1), and so does an interrupt
  (128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM)."""
  from absl import app
  from orl_jax.train.interrupt import Interrupted, stop_line

  def main_reporting_user_errors(argv):
    try:
      return main(argv)
    except user_errors() as e:
      _say(str(e))
      sys.exit(1)
    except app.UsageError as e:   # absl would print the whole --help text before the line
      _say(" ".join(str(e).split()))
      sys.exit(2)
    except Interrupted as e:      # a training loop's stop (`stop_on_signals`)
      from orl_jax import distributed
      if distributed.is_lead_process():
        sys.stderr.write(stop_line(e) + "\n")
      sys.exit(e.exit_status)
    except KeyboardInterrupt:     # a launcher without `stop_on_signals`
      _say("interrupted (SIGINT)")
      sys.exit(128 + signal.SIGINT)

  app.run(main_reporting_user_errors, flags_parser=parse_flags)
