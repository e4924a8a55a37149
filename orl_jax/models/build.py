"""The model of a config: its family's own (DiffusionGemma) or the shared `Transformer`.

Checkpoint reading and writing (`orl_jax.models.hf_read`, `orl_jax.models.hf_write`) and the run
set-up both build models here.
"""
from __future__ import annotations

from flax import nnx

from orl_jax.models import families
from orl_jax.models.transformer import Transformer


def build_model(cfg, seed: int = 0, mesh=None) -> nnx.Module:
  """The model of `cfg` initialised from `seed`: its family's own (a family with
  `build_model`) or the shared Transformer (`mesh`: the mesh its attention kernels run on,
  inside `shard_map`)."""
  build = families.of_model(cfg).build_model
  if build is not None:   # the family's `own_model`
    return build(cfg, nnx.Rngs(seed), mesh)
  return Transformer(cfg, rngs=nnx.Rngs(seed), mesh=mesh)


def abstract_params(cfg, seed: int = 0):
  """(graphdef, params State of ShapeDtypeStructs) without allocating the model."""
  return nnx.split(nnx.eval_shape(lambda: build_model(cfg, seed)), nnx.Param)


def init_model_params(model_cfg, seed: int):
  """(graphdef, params) of a freshly initialised model."""
  graphdef, params = nnx.split(build_model(model_cfg, seed), nnx.Param)
  return graphdef, params
