"""The weights of a training run as they land, for a server that follows the run.

A run leaves two kinds of weights in its work directory: Orbax checkpoints of its `TrainState`
(`<workdir>/checkpoints/<step>/state`, every `checkpoint.every` updates,
`orl_jax.storage.checkpoint`) and, once it finishes, the exported `params/` folder (`params_io`).
A server that serves the run while it trains reads the newest complete checkpoint, and only its
parameters: the optimizer moments are twice the model's size and of no use to a server, so they
are never read (Orbax's partial restore). When the run has finished, its `params/` folder is the
newest weights.

Only complete checkpoints are read. Orbax writes a step into `<step>.orbax-checkpoint-tmp-*`
and renames it to `<step>` when done (on file systems without an atomic rename it writes into
`<step>` and adds `commit_success.txt` last); orbax-checkpoint 0.12 writes `commit_success.txt`
in both cases before the step is final, so a step folder counts only with that file in it.

`WeightsWatcher.poll` tells once whether newer weights landed; the caller polls on its own timer
(no threads here) and loads what was reported with `load_version` (or `load_newest`).
Every process of a multi-process server must load together: an Orbax restore is collective.
"""
from __future__ import annotations

import os
from typing import Callable, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from orl_jax.models import params_io

CHECKPOINT = "checkpoint"   # WeightsVersion.kind: a checkpoint of the run (version: its step)
PARAMS = "params"           # a params folder (version: its meta.json's mtime in nanoseconds)

CHECKPOINTS_DIR = "checkpoints"   # <workdir>/checkpoints/<step>/state: `train.run.prepare_run`
STATE_ITEM = "state"              # the TrainState item of a checkpoint (`Checkpointer.save`)
RUN_PARAMS = "params"             # <workdir>/params: a finished run's export (`weights.RUN_PARAMS`)
COMMIT_FILE = "commit_success.txt"   # Orbax writes it into a step before the step is final
_TRIES = 3   # `load_newest`'s attempts when the run deletes a checkpoint while it is being read


class WeightsVersion(NamedTuple):
  """Which weights: `("checkpoint", step)` or `("params", mtime_ns of its meta.json)`; equal to
  the plain tuple, so callers may compare with one."""
  kind: str
  version: int


class _Found(NamedTuple):
  weights: WeightsVersion
  stamp: int     # mtime (ns) of the file that completed them: what orders checkpoints and params
  folder: str    # the step folder or params folder (gone when the run deleted it meanwhile)


def _step_folder(workdir: str, step: int) -> str:
  return os.path.join(workdir, CHECKPOINTS_DIR, str(step))


def _commit_stamp(step_dir: str) -> int | None:
  """mtime (ns) of the commit marker of a complete step folder; None for a step Orbax has not
  finished (or one that was deleted meanwhile)."""
  try:
    stamp = os.stat(os.path.join(step_dir, COMMIT_FILE)).st_mtime_ns
  except OSError:
    return None
  return stamp if os.path.isdir(os.path.join(step_dir, STATE_ITEM)) else None


def newest_checkpoint(workdir: str) -> int | None:
  """The newest complete checkpoint step of a run's work directory, or None. Folders Orbax is
  still writing (`<step>.orbax-checkpoint-tmp-*`, or a step without its commit marker) and
  anything else in `checkpoints/` are ignored."""
  return _newest_checkpoint_found(workdir)[0]


def _newest_checkpoint_found(workdir: str) -> tuple[int | None, int]:
  """(newest complete step or None, its commit stamp)."""
  try:
    names = os.listdir(os.path.join(workdir, CHECKPOINTS_DIR))
  except OSError:
    return None, -1
  for step in sorted((int(n) for n in names if n.isdigit()), reverse=True):
    stamp = _commit_stamp(_step_folder(workdir, step))
    if stamp is not None:
      return step, stamp
  return None, -1


def _name(path) -> str:
  """Dot-joined parameter name of a pytree path, without the Variable's final `value`."""
  parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
  return ".".join(parts[:-1] if parts and parts[-1] == "value" else parts)


def _shapes(tree) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {_name(path): tuple(leaf.shape) for path, leaf in leaves}


def _differences(stored: dict, wanted: dict, limit: int = 3) -> str:
  """What tells the checkpoint's parameters from the model's, briefly."""
  parts = [f"{k} is {stored[k]} there but {wanted[k]} here"
           for k in sorted(stored.keys() & wanted.keys()) if stored[k] != wanted[k]][:limit]
  for what, names in (("only there", sorted(stored.keys() - wanted.keys())),
                      ("only here", sorted(wanted.keys() - stored.keys()))):
    if names:
      more = f" and {len(names) - limit} more" if len(names) > limit else ""
      parts.append(f"{len(names)} tensor(s) {what}: {', '.join(names[:limit])}{more}")
  return "; ".join(parts)


def _stored_params_shapes(state_dir: str) -> dict[str, tuple[int, ...]]:
  """{name: shape} of the `params` of the TrainState checkpoint item in `state_dir`, read from
  its metadata file alone (no array is read)."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    tree = handler.metadata(epath.Path(state_dir)).tree
  finally:
    handler.close()
  if not isinstance(tree, dict) or "params" not in tree:
    raise ValueError(f"{state_dir} holds no train state parameters (no `params` entry): it is "
                     "not a checkpoint of an orl_jax training run")
  return _shapes(tree["params"])


def checkpoint_params(workdir: str, step: int, params_like):
  """The parameters (`TrainState.params`) of checkpoint `step` of the run in `workdir`, with the
  tree, dtypes (cast when they differ) and shardings of `params_like` (an nnx.State of the
  model's parameters whose leaves are jax arrays or ShapeDtypeStructs with shardings). Only
  the parameters are read: the optimizer state, step and reference stay on disk.

  ValueError naming the folder when the step is not a complete checkpoint or its parameters are
  another model's (other tensors or shapes); FileNotFoundError when the step does not exist.
  """
  workdir = os.path.abspath(workdir)       # Orbax refuses a relative path
  step_dir = _step_folder(workdir, step)
  state_dir = os.path.join(step_dir, STATE_ITEM)
  if not os.path.isdir(step_dir):
    raise FileNotFoundError(f"{step_dir} not found: the run in {workdir} has no checkpoint of "
                            f"step {step} (or deleted it since)")
  if _commit_stamp(step_dir) is None:
    raise ValueError(f"{step_dir} is not a complete checkpoint (no {COMMIT_FILE} or no "
                     f"{STATE_ITEM}/ in it): Orbax is still writing it or it was cut short")
  stored, wanted = _stored_params_shapes(state_dir), _shapes(params_like)
  if stored != wanted:
    raise ValueError(f"{state_dir} holds the parameters of another model than the one given "
                     f"({_differences(stored, wanted)}): build the served model from the run's "
                     "config.json")
  abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
      params_like)
  # Partial restore: Orbax trims the checkpoint's tree to `item`'s entries before it plans
  # any read, so of the TrainState only `params` is read.
  item = {"params": abstract}
  args = ocp.args.PyTreeRestore(item=item,
                                restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                                partial_restore=True)
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
    return checkpointer.restore(epath.Path(state_dir), args=args)["params"]


def params_folder(path: str) -> str:
  """The params folder of `path`: itself when it holds meta.json, else its `params/` (a run's
  work directory; the folder may not exist yet)."""
  if os.path.isfile(os.path.join(path, params_io.META_FILE)):
    return path
  return os.path.join(path, RUN_PARAMS)


def folder_params(folder: str, params_like):
  """The parameters of params folder `folder` (`params_io.load_params`) with the tree, dtypes
  and shardings of `params_like`; residual adapter tensors the folder lacks keep
  `params_like`'s values. ParamsFileError (a ValueError) naming the file on a mismatch."""
  # Zero-strided stand-ins with the model's shapes and dtypes: `load_params` reads each leaf's
  # dtype on the host, which for the real (device, maybe sharded) arrays would copy them all.
  stand_in = jax.tree.map(lambda x: np.broadcast_to(np.zeros((), x.dtype), x.shape), params_like)
  loaded, kept = params_io.load_params(folder, stand_in)
  if kept:
    keep = set(kept)
    loaded = jax.tree_util.tree_map_with_path(
        lambda path, new, old: old if _name(path) in keep else new, loaded, params_like)
  return jax.device_put(loaded, jax.tree.map(lambda x: x.sharding, params_like))


def _newest(path: str) -> _Found | None:
  """The newest weights at `path`: its newest complete checkpoint or its params folder,
  whichever was completed later (a finished run's export is written after its last checkpoint,
  so it wins; a run resumed past its export writes newer checkpoints)."""
  found = []
  step, stamp = _newest_checkpoint_found(path)
  if step is not None:
    found.append(_Found(WeightsVersion(CHECKPOINT, step), stamp, _step_folder(path, step)))
  folder = params_folder(path)
  try:
    mtime = os.stat(os.path.join(folder, params_io.META_FILE)).st_mtime_ns
  except OSError:
    pass
  else:
    if os.path.isfile(os.path.join(folder, params_io.PARAMS_FILE)):
      found.append(_Found(WeightsVersion(PARAMS, mtime), mtime, folder))
  # ties go to the params folder (listed last): on a coarse clock the export still wins
  return max(reversed(found), key=lambda f: f.stamp, default=None)


def load_version(path: str, weights: WeightsVersion, params_like):
  """The parameters of `weights` (as `WeightsWatcher.poll` or `load_newest` reported them) at
  `path`, with the tree, dtypes and shardings of `params_like`. A params folder is read as it is
  now (a newer export than the one reported included)."""
  if weights.kind == CHECKPOINT:
    return checkpoint_params(path, weights.version, params_like)
  if weights.kind == PARAMS:
    return folder_params(params_folder(path), params_like)
  raise ValueError(f"weights of kind {weights.kind!r}: expected {CHECKPOINT!r} or {PARAMS!r}")


def load_newest(path: str, params_like) -> tuple[WeightsVersion, object]:
  """(which weights, parameters) of the newest weights at `path` (a run's work directory or a
  params folder): its newest complete checkpoint or its params folder, whichever is newer,
  with the tree, dtypes and shardings of `params_like`. FileNotFoundError when there are none.

  A checkpoint the run deletes while it is being read (it keeps only its last few) is no error:
  the then newest weights are read instead."""
  for _ in range(_TRIES):
    found = _newest(path)
    if found is None:
      raise FileNotFoundError(f"{path} holds no weights yet: no complete checkpoint in "
                              f"{os.path.join(path, CHECKPOINTS_DIR)} and no params folder "
                              f"({params_io.META_FILE} and {params_io.PARAMS_FILE})")
    try:
      return found.weights, load_version(path, found.weights, params_like)
    except Exception:  # Orbax/TensorStore raise many kinds when files vanish under them
      if os.path.exists(found.folder):
        raise
  raise FileNotFoundError(f"the newest weights at {path} were deleted while being read, "
                          f"{_TRIES} times in a row")


class WeightsWatcher:
  """Reports the newest weights at `path` (a run's work directory or a params folder) once each:
  `poll()` calls `callback(weights)` and returns the WeightsVersion when weights newer than the
  last reported ones (or than `seen`, the ones the caller already serves) have landed, else
  returns None. Weights count as reported only once `callback` returns: when it raises (a
  failed load), the next poll reports them again."""

  def __init__(self, path: str, callback: Callable[[WeightsVersion], object], *,
               seen: WeightsVersion | None = None):
    self.path = path
    self.callback = callback
    self.last: WeightsVersion | None = seen
    self._stamp = -1 if seen is None else self._stamp_of(seen)

  def _stamp_of(self, weights: WeightsVersion) -> int:
    """The completion stamp of weights already served (-1 when that checkpoint is gone: the
    run has newer ones then)."""
    if weights.kind == PARAMS:
      return weights.version
    stamp = _commit_stamp(_step_folder(self.path, weights.version))
    return -1 if stamp is None else stamp

  def poll(self) -> WeightsVersion | None:
    found = _newest(self.path)
    if found is None or found.stamp <= self._stamp:
      return None
    self.callback(found.weights)
    self.last, self._stamp = found.weights, found.stamp
    return found.weights
