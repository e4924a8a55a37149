"""Orbax checkpoints of {train state, data iterator} (docs/training.md#resume-and-changed-settings).

Saves are async and atomic (an interrupted save leaves only a `*.orbax-checkpoint-tmp` folder,
which Orbax ignores); restore targets the abstract, sharded train state so arrays come back
with their shardings.

A finished checkpoint can still be damaged afterwards (a full disk, a bad copy). `restore_latest`
resumes from the newest checkpoint that restores; each newer one that does not is moved aside
to `<directory>-corrupt/` (never deleted), with one warning naming the unreadable file.

Each checkpoint records the run's settings (`run_settings.py`) in its step metadata, written
with the step; a resume under settings that differ stops before anything is restored, naming
the fields, unless the run accepts the change.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator

import grain
import jax
import orbax.checkpoint as ocp

from orl_jax import distributed

from orl_jax.storage import run_settings


class CheckpointRestoreError(RuntimeError):
  """Checkpoints exist but none restores (and not because of damaged files: usually a config
  that changed since they were written); the message names the directory and the reasons."""


class Checkpointer:
  """`settings`: the run's {field: value} each save records and each resume compares (None:
  neither, as for rollout snapshots); `allow_changed`: the fields a resume may find changed."""

  def __init__(self, directory: str, *, every: int, keep: int = 2, settings=None,
               allow_changed: tuple[str, ...] = ()):
    self.every = every
    self.directory = os.path.abspath(directory)
    self.settings = None if settings is None else run_settings.as_recorded(settings)
    self.allow_changed = tuple(allow_changed)
    self.last_saved: int | None = None   # the step this process saved last (None: none yet)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=1,
                                             enable_async_checkpointing=True))

  def latest_step(self) -> int | None:
    """The newest step saved, a write still in flight included (Orbax lists a step when its
    save returns); steps another process left unfinished are not listed."""
    return self.manager.latest_step()

  def should_save(self, step: int, final: bool = False) -> bool:
    return final or (self.every > 0 and step % self.every == 0)

  def save(self, step: int, state, data_iter=None, extra=None) -> None:
    items = {"state": ocp.args.StandardSave(state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    if extra is not None:
      items["extra"] = ocp.args.StandardSave(extra)
    custom = None if self.settings is None else {run_settings.RECORD_KEY: self.settings}
    self.manager.save(step, args=ocp.args.Composite(**items), custom_metadata=custom)
    self.last_saved = step

  def recorded_settings(self, step: int) -> dict | None:
    """The run settings checkpoint `step` records (None: written before they were recorded)."""
    custom = ocp.metadata.get_step_metadata(self.step_dir(step)).custom_metadata or {}
    return custom.get(run_settings.RECORD_KEY)

  def check_settings(self, step: int) -> None:
    """Raises ChangedSettingsError when checkpoint `step` was written under settings this run
    does not accept; logs a warning for accepted changes or a checkpoint that records none."""
    if self.settings is None:
      return
    warning = run_settings.check_resume(self.recorded_settings(step), self.settings,
                                        self.allow_changed,
                                        f"checkpoint step {step} in {self.directory}")
    if warning:
      logging.warning("%s", warning)

  def restore(self, step: int, abstract_state, data_iter=None, abstract_extra=None):
    """Returns (state, extra); `data_iter` is restored in place (after this process's writes
    in flight have finished). `extra` is None when the checkpoint was saved without one."""
    self.wait()
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    with_extra = abstract_extra is not None and os.path.isdir(
        os.path.join(self.step_dir(step), "extra"))
    if with_extra:
      items["extra"] = ocp.args.StandardRestore(abstract_extra)
    out = self.manager.restore(step, args=ocp.args.Composite(**items))
    return out["state"], (out["extra"] if with_extra else None)

  def restore_latest(self, abstract_state, data_iter=None, abstract_extra=None):
    """(step, state, extra) from the newest checkpoint that restores; (0, None, None) when there
    is none. `data_iter` is restored in place (and left as it was when nothing restores).

    A newer checkpoint that fails is moved aside with a warning. When none restores: if every
    failure is a damaged file they are all moved aside and the run starts over; otherwise (e.g.
    the model changed shape) CheckpointRestoreError, and nothing is moved. A checkpoint whose
    recorded settings differ from the run's stops the resume (`check_settings`) before it is
    restored.
    """
    self.wait()
    steps = sorted(self.manager.all_steps(), reverse=True)
    if steps:
      _drop_closed_loop_reports()
    initial_data_state = data_iter.get_state() if data_iter is not None and steps else None
    failures = []   # (step, exception, damaged file or None)
    for step in steps:
      try:
        self.check_settings(step)
        state, extra = self.restore(step, abstract_state, data_iter, abstract_extra)
      except run_settings.ChangedSettingsError:
        raise
      except Exception as e:  # noqa: BLE001  (Orbax/TensorStore raise many kinds)
        failures.append((step, e, damaged_file(self.step_dir(step), e)))
        continue
      self._set_aside(failures, f"resuming from step {step}")
      return step, state, extra
    if failures and all(damaged for _, _, damaged in failures):
      self._set_aside(failures, "no intact checkpoint is left, so the run starts from step 0")
      if data_iter is not None:
        data_iter.set_state(initial_data_state)
      return 0, None, None
    if failures:
      reasons = "; ".join(f"step {step}: {_first_line(e)}" for step, e, _ in failures[:3])
      raise CheckpointRestoreError(
          f"no checkpoint in {self.directory} restores into the configured run ({reasons}); if "
          "the config changed since they were written, use a new config.workdir")
    return 0, None, None

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def _set_aside(self, failures, outcome: str) -> None:
    """Moves each failed step's folder to `<directory>-corrupt/` (process 0), one warning each."""
    if not failures:
      return
    aside = self.directory + "-corrupt"
    for step, e, damaged in failures:
      source = self.step_dir(step)
      target = os.path.join(aside, str(step))
      n = 1
      while os.path.exists(target):
        target, n = os.path.join(aside, f"{step}.{n}"), n + 1
      what = f"{damaged[0]} is damaged ({damaged[1]})" if damaged else _first_line(e)
      logging.warning("checkpoint step %d cannot be restored: %s; moved %s to %s, %s", step, what,
                      source, target, outcome)
      if distributed.is_lead_process():
        os.makedirs(aside, exist_ok=True)
        os.replace(source, target)
    distributed.barrier("checkpoint_set_aside")
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def save_in_background(ckpt: Checkpointer, step: int, state) -> dict[str, float]:
  """Saves `state` as step `step` and returns while it is written: {"sec_wait": the wait for
  the previous save's write to finish, "sec_blocking": the save's own blocking part}.

  Orbax's save returns once the arrays are copied to host memory (its
  `replica_slices.transfer_arrays_to_host` "blocks until completion" and is called before the
  save returns; host arrays are copied too, `NumpyHandler(deepcopy_host_arrays=True)`), so the
  caller may delete, donate or change `state`'s arrays right after; the files are
  written by a background thread and the step's folder is renamed into place only when
  complete (an interrupted write leaves a `*.orbax-checkpoint-tmp*` folder, never listed)."""
  t0 = time.perf_counter()
  ckpt.wait()
  t1 = time.perf_counter()
  ckpt.save(step, state)
  return {"sec_wait": t1 - t0, "sec_blocking": time.perf_counter() - t1}


def abstract_like(tree):
  """ShapeDtypeStructs with shardings, the restore target for `tree`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _drop_closed_loop_reports() -> None:
  """After a failed restore, TensorStore reads still in flight call back into the asyncio loop
  Orbax has already closed (an 'Event loop is closed' traceback each), and Orbax's abandoned
  per-array read coroutines report their errors when collected; both go through
  `sys.unraisablehook`, and this drops exactly those (once installed, for the process)."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_closed_loop_reports", False):
    return

  def hook(unraisable):
    if (isinstance(unraisable.exc_value, RuntimeError)
        and str(unraisable.exc_value) == "Event loop is closed"):
      return
    if getattr(unraisable.object, "__qualname__", "") == "_read_array_index_and_device_put":
      return
    previous(unraisable)

  # A marker read above, so the hook is installed once: mypy has no attributes on a function.
  hook.drops_closed_loop_reports = True  # type: ignore[attr-defined]
  sys.unraisablehook = hook


def _chain(e: BaseException | None) -> Iterator[BaseException]:
  while e is not None:
    yield e
    e = e.__cause__ or e.__context__


def _first_line(e: BaseException | str, limit: int = 200) -> str:
  text = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
  return text if len(text) <= limit else text[:limit] + "..."


_JSON_NAMES = ("_METADATA", "_CHECKPOINT_METADATA", "_sharding")
_DECODE_ERROR = re.compile(r'Error decoding local file "([^"]+)"')
_READ_ERROR = re.compile(r'Error reading "([^"/]+)[^"]*" in OCDBT database at local file "([^"]+)"')


def damaged_file(step_dir: str, error: BaseException) -> tuple[str, str] | None:
  """(file, reason) when `error` comes from a damaged file of the checkpoint in `step_dir`:
  a metadata or data-iterator JSON file that does not parse, or array data that TensorStore
  cannot decode or finds truncated. None for other errors (a model that changed shape)."""
  for root, _, names in os.walk(step_dir):
    for name in sorted(names):
      in_array_metadatas = os.path.basename(root) == "array_metadatas"
      if name in _JSON_NAMES or name.endswith(".json") or in_array_metadatas:
        path = os.path.join(root, name)
        try:
          with open(path, encoding="utf-8") as f:
            json.load(f)
        except json.JSONDecodeError as e:
          return path, f"not valid JSON: {str(e).split(' (char')[0]}"
        except UnicodeDecodeError as e:
          return path, f"not valid JSON: {e.reason}"
        except OSError as e:
          return path, e.strerror or str(e)
  for cause in _chain(error):
    text = str(cause)
    m = _DECODE_ERROR.search(text)
    if m:
      detail = text.split(m.group(0))[-1].split(" [tensorstore_spec")[0].lstrip(": ")
      return m.group(1), _first_line(detail or text)
    m = _READ_ERROR.search(text)
    if m:
      detail = text.split(m.group(0))[-1].split(" [tensorstore_spec")[0].lstrip(": ")
      return (m.group(2).rstrip("/"),
              f"the data of array {m.group(1)} is unreadable: {_first_line(detail)}")
  return None
