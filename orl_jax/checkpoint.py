"""Orbax checkpoints of {train state, data iterator} (DESIGN §2.8).

Saves are async and atomic (an interrupted save leaves only a `*.orbax-checkpoint-tmp` folder,
which Orbax ignores); restore targets the abstract, sharded train state so arrays come back
with their shardings.
"""
from __future__ import annotations

import os

import grain
import jax
import orbax.checkpoint as ocp


class Checkpointer:

  def __init__(self, directory: str, *, every: int, keep: int = 2):
    self.every = every
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=1,
                                             enable_async_checkpointing=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def should_save(self, step: int, final: bool = False) -> bool:
    return final or (self.every > 0 and step % self.every == 0)

  def save(self, step: int, state, data_iter=None, extra=None) -> None:
    items = {"state": ocp.args.StandardSave(state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    if extra is not None:
      items["extra"] = ocp.args.StandardSave(extra)
    self.manager.save(step, args=ocp.args.Composite(**items))

  def restore(self, step: int, abstract_state, data_iter=None, abstract_extra=None):
    """Returns (state, extra); `data_iter` is restored in place."""
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    if abstract_extra is not None:
      items["extra"] = ocp.args.StandardRestore(abstract_extra)
    out = self.manager.restore(step, args=ocp.args.Composite(**items))
    return out["state"], (out["extra"] if abstract_extra is not None else None)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_like(tree):
  """ShapeDtypeStructs with shardings, the restore target for `tree`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
