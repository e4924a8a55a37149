"""Residual pathway (docs/method.md#the-residual-pathway): what a denoising step passes to the next
step of its block.

The carried state is `Residual(z, alpha)`:
* `z`     [B, T, D] soft embedding `softmax(logits / T_res) @ E * embed_scale` of the previous step
          (zeros on a block's first step: cold start);
* `alpha` [B, T]    normalized entropy of that prediction (RCD's interpolation weight).

Modes: `none` (plain DLM), `rcd` (parameter-free interpolation with E[M]), `adapter` (ORL:
E[x] + s * g(stop_gradient(z)) at masked positions, g zero-initialised at its output).
"""
from __future__ import annotations

import math
import typing
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

ResidualMode = Literal["none", "rcd", "adapter"]
MODES: tuple[str, ...] = typing.get_args(ResidualMode)


class Residual(NamedTuple):
  z: jax.Array       # [B, T, D] soft embedding consumed by a step
  alpha: jax.Array   # [B, T] normalized entropy of the prediction that produced z


def zero_residual(batch: int, length: int, d_model: int, dtype=jnp.float32) -> Residual:
  """Cold start: no previous prediction."""
  return Residual(jnp.zeros((batch, length, d_model), dtype),
                  jnp.zeros((batch, length), jnp.float32))


def normalized_entropy(logits: jax.Array) -> jax.Array:
  """H(softmax(logits)) / log V in [0, 1], computed in f32. logits: [..., V] -> [...]."""
  logits = logits.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  h = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
  return h / math.log(logits.shape[-1])


def residual_from_logits(logits: jax.Array, embedding: jax.Array, *, embed_scale: float,
                         temperature: float, dtype) -> Residual:
  """The residual a step hands to the next one: z = softmax(logits / T_res) @ E, alpha = H(p)."""
  logits = logits.astype(jnp.float32)
  probs = jax.nn.softmax(logits / temperature, axis=-1)
  z = jnp.einsum("btv,vd->btd", probs, embedding.astype(jnp.float32)) * embed_scale
  return Residual(z.astype(dtype), normalized_entropy(logits / temperature))


class RMSNorm(nnx.Module):
  """RMSNorm computed in f32 (weights multiply after normalisation, LLaMA/Qwen convention)."""

  def __init__(self, dim: int, eps: float, *, param_dtype=jnp.float32):
    self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x):
    dtype = x.dtype
    x = x.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
    return (x * self.weight[...].astype(jnp.float32)).astype(dtype)


class ResidualAdapter(nnx.Module):
  """g_phi: RMSNorm -> gated MLP (D -> F -> D, SiLU gate). Output projection starts at zero,
  so an adapter-equipped model equals its base model at initialisation."""

  def __init__(self, d_model: int, hidden: int, eps: float, *, dtype, param_dtype, rngs: nnx.Rngs):
    self.norm = RMSNorm(d_model, eps, param_dtype=param_dtype)
    lin = lambda i, o, **kw: nnx.Linear(i, o, use_bias=False, dtype=dtype, param_dtype=param_dtype,
                                        rngs=rngs, **kw)
    self.gate_proj = lin(d_model, hidden)
    self.up_proj = lin(d_model, hidden)
    self.down_proj = lin(hidden, d_model, kernel_init=nnx.initializers.zeros)

  def __call__(self, z):
    h = self.norm(z)
    return self.down_proj(jax.nn.silu(self.gate_proj(h)) * self.up_proj(h))


def residual_inputs(mode: str, token_embeds, mask_embed, is_masked, residual: Residual | None,
                    adapter: ResidualAdapter | None, scale: float):
  """Input embeddings with the residual pathway applied at masked positions.

  token_embeds: [B, T, D] = E[x] * embed_scale; mask_embed: [D]; is_masked: [B, T] bool.
  Returns (embeds [B, T, D], norm_ratio scalar): the mean over masked positions that carry a
  residual of ||s * g(z)|| / ||E[M]|| (adapter) or ||e~ - E[M]|| / ||E[M]|| (rcd); 0 if none.
  """
  if mode == "none" or residual is None:
    return token_embeds, jnp.zeros((), jnp.float32)
  z = residual.z.astype(token_embeds.dtype)
  carries = is_masked & jnp.any(residual.z != 0, axis=-1)  # cold-start positions carry nothing
  if mode == "rcd":
    alpha = residual.alpha.astype(token_embeds.dtype)[..., None]
    mixed = (1 - alpha) * mask_embed + alpha * z
    delta = jnp.where(carries[..., None], mixed - mask_embed, 0)
    embeds = jnp.where(is_masked[..., None], mask_embed + delta, token_embeds)
  elif mode == "adapter":
    if adapter is None:
      raise ValueError("residual_inputs: mode 'adapter' needs the ResidualAdapter")
    delta = scale * adapter(jax.lax.stop_gradient(z))
    delta = jnp.where(is_masked[..., None], delta, 0)
    embeds = token_embeds + delta
  else:
    raise ValueError(f"model.residual.mode must be one of {MODES}, got {mode!r}")
  ratio = (jnp.linalg.norm(delta.astype(jnp.float32), axis=-1)
           / (jnp.linalg.norm(mask_embed.astype(jnp.float32)) + 1e-12))
  n = jnp.sum(carries)
  norm_ratio = jnp.where(n > 0, jnp.sum(jnp.where(carries, ratio, 0)) / jnp.maximum(n, 1), 0.0)
  return embeds, norm_ratio
