"""Meshes and shardings (docs/scaling.md#meshes-and-sharding). Named axes: data, fsdp, tensor,
expert. No pmap.

`expert` splits the routed experts of MoE models (their partition rules, from the model family)
and, like `data` and `fsdp`, the batch: an expert-parallel group works on its own rows and
exchanges tokens only inside the MoE layers. `fill_axis_sizes`, `hybrid_shapes` and `mesh.dcn`
cover the first three axes; `expert` is a fixed size (default 1) inside a granule.
"""
from __future__ import annotations

import contextlib
import math
import re

import jax
import numpy as np
from jax.experimental import mesh_utils, multihost_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
EXPERT_AXIS = "expert"
MESH_AXES = AXES + (EXPERT_AXIS,)
BATCH_AXES = ("data", "fsdp", EXPERT_AXIS)   # axes that split the batch (rows)


def fill_axis_sizes(sizes, n_devices: int) -> list[int]:
  """`[data, fsdp, tensor]` with the one -1 entry (if any) filled so they multiply to
  `n_devices`; a ValueError naming the mesh fields otherwise."""
  sizes = list(sizes)
  if sizes.count(-1) > 1:
    raise ValueError("at most one of mesh.data, mesh.fsdp, mesh.tensor may be -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if n_devices % known:
      raise ValueError(f"{n_devices} devices cannot be split by the fixed mesh axes {sizes}")
    sizes[sizes.index(-1)] = n_devices // known
  if int(np.prod(sizes)) != n_devices:
    raise ValueError(f"mesh {dict(zip(AXES, sizes))} needs {int(np.prod(sizes))} devices, "
                     f"{n_devices} available")
  return sizes


def hybrid_shapes(sizes, dcn, n_granules: int) -> tuple[list[int], list[int]]:
  """(per-granule ICI shape, DCN shape) for total axis sizes `sizes` of which `dcn` ways cross
  the slow network between `n_granules` granules (TPU slices, or processes)."""
  dcn = dcn_sizes(dcn)
  if any(d < 1 for d in dcn) or any(t % d for t, d in zip(sizes, dcn)):
    raise ValueError(f"mesh.dcn {dict(zip(AXES, dcn))} must be positive and divide the mesh "
                     f"axes {dict(zip(AXES, sizes))}")
  if int(np.prod(dcn)) != n_granules:
    raise ValueError(f"mesh.dcn {dict(zip(AXES, dcn))} spans {int(np.prod(dcn))} granules "
                     f"(slices or processes) but the job has {n_granules}")
  return [t // d for t, d in zip(sizes, dcn)], dcn


def dcn_sizes(dcn) -> list[int]:
  """`[data, fsdp, tensor]` DCN ways from None (all 1), a `{axis: ways}` mapping or a
  3-sequence."""
  if dcn is None:
    return [1] * len(AXES)
  if hasattr(dcn, "keys"):
    unknown = set(dcn.keys()) - set(AXES)
    if unknown:
      raise ValueError(f"mesh.dcn has unknown axes {sorted(unknown)}; use {AXES}")
    dcn = [dcn.get(a, 1) for a in AXES]
  if len(dcn) != len(AXES):
    raise ValueError(f"mesh.dcn needs one size per axis {AXES}; got {dcn}")
  return [int(d) for d in dcn]


def _granules(devices) -> tuple[int, bool]:
  """(number of granules, process_is_granule): TPU slices when the devices report more than
  one `slice_index`, processes otherwise (CPU, GPU and single-slice TPU report one slice)."""
  slices = {getattr(d, "slice_index", 0) for d in devices}
  if len(slices) > 1:
    return len(slices), False
  return len({d.process_index for d in devices}), True


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None,
              dcn=None, expert: int = 1) -> jax.sharding.Mesh:
  """A mesh over all (or the given) devices with axes `MESH_AXES`; one of data, fsdp, tensor
  may be -1 (fill).

  `data`, `fsdp`, `tensor`, `expert` are the total axis sizes. `dcn` (a `{axis: ways}` mapping
  or a 3-sequence, default none) says how many ways of data, fsdp, tensor cross the data-center
  network between slices (or processes, where devices have no slice index); the mesh is then
  built by `mesh_utils.create_hybrid_device_mesh` so the remaining ways stay inside a granule.
  """
  devices = jax.devices() if devices is None else devices
  if expert < 1 or len(devices) % expert:
    raise ValueError(f"mesh.expert={expert} must be positive and divide the {len(devices)} "
                     "devices")
  sizes = fill_axis_sizes([data, fsdp, tensor], len(devices) // expert)
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  dcn = dcn_sizes(dcn)
  if all(d == 1 for d in dcn):   # nothing crosses the DCN: the plain mesh
    shape = tuple(sizes) + (expert,)
    try:
      return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    except NotImplementedError:
      # an axis that is no product of the TPU torus' axes (expert=8 on a 4x4x4 v5p slice):
      # that axis then spans part of a physical axis
      grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
      return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)
  n_granules, process_is_granule = _granules(devices)
  ici, dcn = hybrid_shapes(sizes, dcn, n_granules)
  grid = mesh_utils.create_hybrid_device_mesh(ici + [expert], dcn + [1], devices,
                                              process_is_granule=process_is_granule,
                                              allow_split_physical_axes=True)
  return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


def mesh_from_config(config, devices=None) -> jax.sharding.Mesh:
  """The mesh of `config.mesh` (`data`, `fsdp`, `tensor`, `expert`, optional `dcn`)."""
  m = config.mesh
  dcn = m.dcn
  dcn = dcn.to_dict() if hasattr(dcn, "to_dict") else dcn
  return make_mesh(m.data, m.fsdp, m.tensor, devices=devices, dcn=dcn,
                   expert=m.expert)


def fitting_mesh(sizes: dict, n_devices: int) -> dict:
  """{axis: size} of the `mesh.*` settings to change so that `sizes` (data, fsdp, tensor,
  expert; one of the first three may be -1) fit `n_devices`, each axis cut to what divides
  what is left: the advice of a mesh that does not fit (a config written for 8 expert ways,
  run on one device). {} when they fit."""
  out = dict(sizes)
  out[EXPERT_AXIS] = math.gcd(max(int(sizes[EXPERT_AXIS]), 1), n_devices)
  left = n_devices // out[EXPERT_AXIS]
  fill = next((a for a in AXES if sizes[a] == -1), None)
  for axis in reversed(AXES):          # tensor, fsdp, data: the data axis keeps the rest
    if axis != fill:
      out[axis] = math.gcd(max(int(sizes[axis]), 1), left)
      left //= out[axis]
  if left > 1 and fill is None:
    out["data"] = -1
  return {a: out[a] for a in MESH_AXES if out[a] != sizes[a]}


def mesh_error(config, n_devices: int, error: Exception) -> str:
  """One sentence for a `config.mesh` that `make_mesh` refused on `n_devices` devices, with the
  `--config.mesh.*` settings that fit them (`fitting_mesh`) when the axis sizes are at fault."""
  m = config.mesh
  sizes = {a: getattr(m, a) for a in MESH_AXES}
  advice = fitting_mesh(sizes, n_devices)
  devices = f"{n_devices} device{'s' if n_devices != 1 else ''}"
  if not advice:
    return f"config.mesh does not fit the {devices} the run has: {error}"
  named = ", ".join(f"{a}={v}" for a, v in sizes.items())
  settings = " ".join(f"--config.mesh.{a}={v}" for a, v in advice.items())
  return (f"config.mesh ({named}) does not fit the {devices} the run has: set {settings} "
          "(data x fsdp x tensor x expert must equal the device count; -1 takes the rest)")


def tracing_mesh(mesh):
  """A context in which programs are traced on `mesh`'s abstract mesh
  (`jax.sharding.use_abstract_mesh`) when it splits experts (`expert` > 1): the MoE layers read
  it when they are traced, to run their experts inside `shard_map` where the weights are
  (`orl_jax.models.moe`). Eager operations keep their devices (a concrete `jax.set_mesh` would
  move them onto the mesh, which for a compile target has no runnable devices). Other meshes:
  nothing is set."""
  if dict(mesh.shape).get(EXPERT_AXIS, 1) > 1:
    return jax.sharding.use_abstract_mesh(mesh.abstract_mesh)
  return contextlib.nullcontext()


def n_batch_shards(mesh_shape) -> int:
  """How many ways the batch is split: the product of the `BATCH_AXES` sizes."""
  shape = dict(mesh_shape)
  return int(np.prod([shape.get(a, 1) for a in BATCH_AXES]))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def batch_sharding(mesh) -> NamedSharding:
  """Leading (batch) dimension split over the batch axes (data, fsdp, expert) of the mesh."""
  return NamedSharding(mesh, P(tuple(a for a in BATCH_AXES if a in mesh.axis_names)))


def process_rows(mesh, global_batch: int) -> tuple[int, ...]:
  """The rows of a `global_batch`-row batch (split by `batch_sharding`) that this process's
  devices hold, ascending: the rows this process loads, in the order
  `make_array_from_process_local_data` expects them."""
  index_map = batch_sharding(mesh).addressable_devices_indices_map((global_batch,))
  rows: set[int] = set()
  for idx in index_map.values():
    assert idx is not None, "a NamedSharding gives every device an index"
    rows.update(range(*idx[0].indices(global_batch)))
  return tuple(sorted(rows))


def shard_batch(tree, mesh, global_batch: int | None = None):
  """Global arrays from this process's rows of a batch (numpy leaves, leading dim = rows).

  `global_batch` is the batch size over all processes; each process passes the rows
  `process_rows(mesh, global_batch)` names. None: every process holds an equal share (one process:
  the whole batch).
  """
  sharding = batch_sharding(mesh)

  def one(x):
    x = np.asarray(x)
    shape = None if global_batch is None else (global_batch,) + x.shape[1:]
    return jax.make_array_from_process_local_data(sharding, x, shape)

  return jax.tree.map(one, tree)


def to_host(tree):
  """Numpy copies of (possibly globally sharded) arrays, identical on every process: the
  process-spanning ones are all-gathered, so host-side logic (the replay plan, verification,
  metrics) sees the whole batch everywhere."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


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
  """The PartitionSpec of the array called `name` (first matching rule), fitted to its shape;
  replicated when only `data` has more than one device."""
  if all(size == 1 for axis, size in mesh_shape.items() if axis != "data"):
    return P()
  for pattern, spec in rules:
    if re.search(pattern, name):
      return _fit(spec, shape, mesh_shape)
  return P()


def tree_shardings(tree, mesh, rules=PARTITION_RULES):
  """NamedShardings for every array leaf of `tree` (params, optimizer state, train state) by
  the partition rules (a model family's: `Family.partition_rules`, `orl_jax.models.families`);
  replicated when only `data` has more than one device."""
  mesh_shape = dict(mesh.shape)

  def one(path, leaf):
    shape = getattr(leaf, "shape", ())
    return NamedSharding(mesh, partition_spec(path_name(path), shape, mesh_shape, rules))

  return jax.tree_util.tree_map_with_path(one, tree)
