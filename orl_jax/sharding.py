"""Meshes and shardings (DESIGN §3). Named axes: data, fsdp, tensor. No pmap."""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> jax.sharding.Mesh:
  """A mesh over all (or the given) devices; one axis size may be -1 (fill)."""
  devices = jax.devices() if devices is None else devices
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError("at most one of mesh.data, mesh.fsdp, mesh.tensor may be -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices cannot be split by the fixed mesh axes {sizes}")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(f"mesh {dict(zip(AXES, sizes))} needs {int(np.prod(sizes))} devices, "
                     f"{len(devices)} available")
  return jax.make_mesh(tuple(sizes), AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=devices)


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh) -> NamedSharding:
  """Leading (batch) dimension split over data and fsdp."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def shard_batch(tree, mesh):
  """Places a host batch (numpy leaves, leading dim = global batch) on the mesh."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)),
                      tree)
