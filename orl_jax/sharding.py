"""Meshes and shardings (DESIGN §3). Named axes: data, fsdp, tensor. No pmap."""
from __future__ import annotations

import re

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


# ----------------------------------------------------------------------------- partition rules

def path_name(path) -> str:
  """Dot-joined name of a pytree path ('layers.0.attn.q_proj.kernel'); Variable `.value`
  attributes and optax container indices keep their keys, so optimizer-state leaves end with
  the same name as the parameter they mirror."""
  parts = []
  for k in path:
    part = getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
    if part == "value" and isinstance(k, jax.tree_util.GetAttrKey):
      continue
    parts.append(str(part))
  return ".".join(parts)


# (regex searched in the parameter's path name, PartitionSpec of the array). Kernels are
# [in, out]: column-parallel layers split `out` over tensor and `in` over fsdp; row-parallel
# layers (o_proj, down_proj) the other way round. Norms and scalars are replicated.
PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"embed\.embedding$", P("tensor", "fsdp")),                           # [V, D]
    (r"attn\.(q_proj|k_proj|v_proj)\.kernel$", P("fsdp", "tensor")),      # [D, H*Dh]
    (r"attn\.o_proj\.kernel$", P("tensor", "fsdp")),                      # [H*Dh, D]
    (r"(mlp|adapter)\.(gate_proj|up_proj)\.kernel$", P("fsdp", "tensor")), # [D, F]
    (r"(mlp|adapter)\.down_proj\.kernel$", P("tensor", "fsdp")),           # [F, D]
    (r"lm_head\.kernel$", P("fsdp", "tensor")),                            # [D, V]
    (r".*", P()),
)


def _fit(spec: P, shape, mesh_shape: dict) -> P:
  """Drops axes that are trivial or do not divide their dimension (that dimension replicates)."""
  axes = (tuple(spec) + (None,) * len(shape))[:len(shape)]
  return P(*(a if a is not None and mesh_shape.get(a, 1) > 1 and shape[i] % mesh_shape[a] == 0
             else None for i, a in enumerate(axes)))


def partition_spec(name: str, shape, mesh_shape: dict, rules=PARTITION_RULES) -> P:
  """The PartitionSpec of the array called `name` (first matching rule), fitted to its shape."""
  if mesh_shape.get("fsdp", 1) == 1 and mesh_shape.get("tensor", 1) == 1:
    return P()
  for pattern, spec in rules:
    if re.search(pattern, name):
      return _fit(spec, shape, mesh_shape)
  return P()


def tree_shardings(tree, mesh, rules=PARTITION_RULES):
  """NamedShardings for every array leaf of `tree` (params, optimizer state, train state) by
  the partition rules; replicated when the mesh has fsdp = tensor = 1."""
  mesh_shape = dict(mesh.shape)

  def one(path, leaf):
    shape = getattr(leaf, "shape", ())
    return NamedSharding(mesh, partition_spec(path_name(path), shape, mesh_shape, rules))

  return jax.tree_util.tree_map_with_path(one, tree)
