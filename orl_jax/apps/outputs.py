"""Where a training run, an evaluation and a decode write (docs/training.md#work-directories).

One folder per run and per evaluation:

* a training run's default work directory is its config variant's (`work_dirs/llada_debug_jsonl`)
  when it trains on the variant's own task, and that name with the task file's added
  (`work_dirs/llada_debug_jsonl_my_train`) when the command line points `task.path` at another
  file, so "the example, then my data" are two runs; `--config.workdir` names one outright;
* an evaluation or a decode of one run's weights (its work directory, its `params/` or its
  `hf/` export) writes beside them, into `<run>/eval` or `<run>/trajectories.html`; other
  weights (a Hugging Face directory, several models side by side) get a folder named for them
  under `work_dirs/`; never the config variant's run folder. `--config.workdir` wins;
* an evaluation with another set-up (task, number of problems, decoder settings) than the table
  already in that folder goes to `eval_2`, `eval_3`, ... and says so: the old table stays;
* an evaluation of one run scores the task the run was trained on (recorded in its params
  folder's meta.json) unless the command line sets `task.*`.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterable, Sequence

from orl_jax.models import params_io
from orl_jax.storage import trained_run
from orl_jax.storage import weights as weights_lib

OUTPUTS = "work_dirs"    # where folders of outputs that belong to no run go
EVAL_DIR = "eval"        # <run>/eval: a run's evaluations
HF_EXPORT = "hf"         # <run>/hf: the export every Hugging Face run writes
PAGE = "trajectories.html"


def slug(text: str) -> str:
  """A folder-name-safe version of `text` (letters, digits, `.`, `-`, `_`)."""
  return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def _overrides(overridden: Iterable[str], field: str) -> bool:
  return any(field == o or field.startswith(o + ".") or o.startswith(field + ".")
             for o in overridden)


def train_workdir(config, overridden: Iterable[str]) -> str:
  """The work directory of a training run: `config.workdir` as the command line or the config
  variant set it, with the task file's name added when the command line (not the variant)
  chose `task.path` and left `workdir` alone."""
  overridden = frozenset(overridden)
  path = config.task.get("path", "")
  if "workdir" in overridden or not path or not _overrides(overridden, "task.path"):
    return config.workdir
  stem = os.path.splitext(os.path.basename(path))[0]
  return f"{config.workdir.rstrip('/')}_{slug(stem)}"


def owning_run(path: str) -> str | None:
  """The work directory of the training run that `path` (weights) belongs to: the run's own
  folder, its `params/` or its `hf/` export; None for anything else (a Hugging Face directory,
  a bare params folder, 'random')."""
  if path == trained_run.RANDOM_INIT or not os.path.isdir(path):
    return None
  folder = os.path.normpath(os.path.abspath(path))
  if os.path.basename(folder) in (weights_lib.RUN_PARAMS, HF_EXPORT):
    parent = os.path.dirname(folder)
    if os.path.isfile(os.path.join(parent, weights_lib.RUN_PARAMS, "meta.json")):
      return _shown(parent)
  if os.path.isfile(os.path.join(folder, weights_lib.RUN_PARAMS, "meta.json")):
    return _shown(folder)
  return None


def _named_folder(models: Sequence[tuple[str, str]]) -> str:
  return os.path.join(OUTPUTS, "_vs_".join(slug(name) for _, name in models))


def eval_base(config, models: Sequence[tuple[str, str]], overridden: Iterable[str]) -> str:
  """The folder an evaluation of `models` ((weights, name) pairs) writes into, before the
  set-up picks `eval_2`, ... (`evaluation_folder`)."""
  if "workdir" in frozenset(overridden):
    return config.workdir
  run = owning_run(models[0][0]) if len(models) == 1 else None
  if run is not None:
    return os.path.join(run, EVAL_DIR)
  return os.path.join(_named_folder(models), EVAL_DIR)


def page_path(config, models: Sequence[tuple[str, str]], overridden: Iterable[str]) -> str:
  """Where a decode's trajectory page goes: beside one run's weights, or in a folder named for
  the models decoded; `config.workdir` when the command line set it."""
  if "workdir" in frozenset(overridden):
    return os.path.join(config.workdir, PAGE)
  run = owning_run(models[0][0]) if len(models) == 1 else None
  return os.path.join(run if run is not None else _named_folder(models), PAGE)


def _recorded_setup(folder: str) -> str | None:
  from orl_jax.evaluate import SETUP_FILE   # evaluate imports JAX: only when asked
  try:
    with open(os.path.join(folder, SETUP_FILE)) as f:
      return json.load(f).get("setup")
  except (OSError, ValueError):
    return None


def evaluation_folder(base: str, setup: str) -> tuple[str, str]:
  """(folder, note): `base` when it holds no table or one made with `setup`
  (`evaluate.evaluation_setup`), else the first of `base_2`, `base_3`, ... that does; the note
  says where the new table goes and that the old one stays ('' when `base` is used)."""
  from orl_jax.evaluate import SETUP_FILE
  folder, k = base, 1
  while os.path.isfile(os.path.join(folder, SETUP_FILE)) and _recorded_setup(folder) != setup:
    k += 1
    folder = f"{base.rstrip('/')}_{k}"
  if folder == base:
    return folder, ""
  return folder, (f"{base} holds an evaluation with another set-up (task, eval.n_problems or "
                  f"decode.*), which stays there; this one goes to {folder}")


def trained_task(path: str) -> dict[str, str]:
  """{config field: value} of the task the weights at `path` were trained on (a run's folder or
  params folder records it in meta.json); {} when nothing is recorded."""
  if path == trained_run.RANDOM_INIT:
    return {}
  try:
    kind, folder = weights_lib.resolve(path)
  except weights_lib.ConfigError:
    return {}
  if kind != weights_lib.PARAMS:
    return {}
  task = params_io.read_meta(folder).get(trained_run.RUN_KEY, {}).get("task", {})
  return {f"task.{k}": v for k, v in task.items() if k in ("name", "path")}


def _shown(path: str) -> str:
  """`path` relative to the working directory when it lies below it, else as it is."""
  relative = os.path.relpath(path)
  return path if relative.startswith("..") else relative


def use_trained_task(config, models: Sequence[tuple[str, str]],
                     overridden: Iterable[str]) -> str:
  """Sets `config.task` to the task the one model in `models` was trained on, unless the
  command line set `task.*` or several models are compared (they share the config's task);
  returns a line saying so ('' when nothing changed)."""
  overridden = frozenset(overridden)
  if len(models) != 1 or any(o == "task" or o.startswith("task.") for o in overridden):
    return ""
  task = trained_task(models[0][0])
  here = config.task.get("path", "")
  if here and os.path.abspath(here) == task.get("task.path"):
    task["task.path"] = here          # the same file, spelled as the config spells it
  if task.get("task.path"):
    task["task.path"] = _shown(task["task.path"])
  if task.get("task.path") and not os.path.isfile(task["task.path"]):
    return (f"{models[0][1]} was trained on {task['task.path']}, which is gone: evaluating "
            f"config.task ({config.task.name}) instead")
  if not trained_run.apply_settings(config, task):
    return ""
  what = task.get("task.path") or task.get("task.name", "")
  return (f"task: {what}, the one {models[0][1]} was trained on (--config.task.path or "
          "--config.task.name to evaluate another)")
