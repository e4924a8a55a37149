"""Offline RCD baseline (`train.mode="rcd_offline"`, docs/method.md#the-on-policy-loop).

Residuals come from a frozen reference model (the base the run starts from) evaluated on the
same noised input; the trained model (residual mode `rcd`) consumes them and is trained with
the 1/t-weighted masked CE of SFT. Off-policy by construction: the residuals a model sees at
inference are its own, not the reference's — which is what ORL fixes.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax.models import params_io
from orl_jax.storage import weights as weights_lib
from orl_jax.residual import Residual, residual_from_logits
from orl_jax.packed_batch import masked_state_tokens
from orl_jax.models.build import init_model_params


def reference_residual_fn(setup):
  """(residual_fn, reference params). The reference is the starting params folder's model with no
  residual pathway; its parameters travel in the batch (`SftExample.rcd_reference_params`,
  replicated), never into the graph."""
  reference_dir = weights_lib.params_dir(setup.config)
  if not reference_dir:
    raise ValueError("train.mode='rcd_offline' needs a params folder in model.path (or "
                     "model.init_from): the frozen reference")
  if setup.model_cfg.residual_mode != "rcd":
    raise ValueError("train.mode='rcd_offline' trains model.residual.mode='rcd', got "
                     f"{setup.model_cfg.residual_mode!r}")
  ref_cfg = dataclasses.replace(setup.model_cfg, residual_mode="none")
  ref_graphdef, ref_params = init_model_params(ref_cfg, setup.config.seed)
  ref_params, _ = params_io.load_params(reference_dir, ref_params)

  def residual_fn(model, pb, batch, key):
    del model, key
    ref = nnx.merge(ref_graphdef, jax.lax.stop_gradient(batch.rcd_reference_params))
    logits = ref(pb.tokens, pb.positions, pb.meta).logits
    res = residual_from_logits(logits, ref.embedding_table, embed_scale=ref.cfg.embed_scale,
                               temperature=ref.cfg.residual_temperature,
                               dtype=ref.cfg.compute_dtype)
    at_state = masked_state_tokens(pb, ref.cfg.mask_id)
    return Residual(jnp.where(at_state[..., None], res.z, 0), jnp.where(at_state, res.alpha, 0))

  return residual_fn, ref_params
