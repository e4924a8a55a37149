"""DiffusionGemma rollouts with exact state capture (DESIGN §2.3 for a uniform-noise family).

A state is what one denoising step consumed: the whole canvas **including its noise tokens**
and the self-conditioning input `z`, as stored by the sampler (never recomputed: with a strong
self-conditioning MLP the z-chain amplifies f32 rounding from step to step). The positions a
step did not accept are its *unresolved* positions (the masked positions of the mask families):
the losses train there, towards the verified final tokens.

The sampler's `StepTrace` [N canvases, S steps, B, ...] becomes the shared `Capture`
[B, N·S, ...] (block = canvas index, step = step index, commit = accepted), so the replay plan
and gather of every family read it; `Trajectories` is the shared type too.

Forward counts, both conventions (DESIGN §2.2, §6): `nfe_decoder` is transformers' count
(denoising forwards only); `nfe` adds one commit forward per decoded canvas, the last one
included (the paper's count); `nfe_engine` adds the commit forwards the sampler really ran
(none after the last canvas). Rollouts and evaluation (`make_decoder`) count them with the one
function `forward_counts`.

With `orl.capture_routes` the capture also holds the expert ids of every forward the rollout
ran (`decoding.RouteCapture`: each step's canvas, the prompt prefill, each commit forward), which
the replay gather places token by token, as for LLaDA2.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax import diffusion_gemma_sampler as sampler
from orl_jax import weights as weights_lib
from orl_jax.decoding import Capture, RouteCapture
from orl_jax.models.diffusion_gemma_config import DiffusionGemmaConfig
from orl_jax.models.families import diffusion_gemma as family
from orl_jax.params_io import read_json
from orl_jax import rollout as rollout_lib
from orl_jax.rollout import Trajectories


def capture_from_trace(trace: sampler.StepTrace, prompt_routes=None,
                       clean_routes=None) -> Capture:
  """[N, S, B, ...] step trace -> [B, N·S, ...] Capture (valid = the step counted for the
  row: it was denoising and had not finished on an earlier canvas); with routes in the trace,
  `prompt_routes` [B, P, L, K] and `clean_routes` [B, N·C, L, K] complete the RouteCapture."""
  n, s, b, c = trace.canvas.shape
  rows = lambda x: jnp.moveaxis(x, 2, 0).reshape((b, n * s) + x.shape[3:])
  valid = rows(trace.counted)
  block = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[:, None, None], (n, s, b))
  step = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32)[None, :, None], (n, s, b))
  routes = (None if trace.routes is None
            else RouteCapture(state=rows(trace.routes), prompt=prompt_routes, clean=clean_routes))
  return Capture(block_tokens=rows(trace.canvas), block=rows(block), step=rows(step),
                 z=rows(trace.z), alpha=jnp.zeros((b, n * s, c), jnp.float32),
                 entropy=rows(trace.entropy), topk_ids=rows(trace.topk_ids),
                 topk_logprobs=rows(trace.topk_logprobs), commit=rows(trace.accepted),
                 valid=valid, n_states=jnp.sum(valid, axis=1, dtype=jnp.int32),
                 overflow=jnp.zeros((b,), bool), routes=routes)


def generated_tokens(tokens, eos_ids) -> jax.Array:
  """[B] tokens through the first EOS (all of them without one)."""
  is_eos = jnp.isin(tokens, jnp.asarray(eos_ids, jnp.int32))
  first = jnp.argmax(is_eos, axis=-1)
  return jnp.where(jnp.any(is_eos, axis=-1), first + 1, tokens.shape[-1]).astype(jnp.int32)


class Decoded(NamedTuple):
  """Per-row output of the sampler with its forwards counted both ways (DESIGN §2.2, §6)."""
  tokens: jax.Array       # [B, N·C] argmax canvases, padding after EOS
  nfe: jax.Array          # [B] int32 the paper's count: decoder forwards + 1 commit per canvas
  nfe_engine: jax.Array   # [B] int32 decoder forwards + the commit forwards the sampler ran
  n_generated: jax.Array  # [B] int32 tokens through the first EOS
  finished: jax.Array     # [B] bool an EOS was generated
  nfe_decoder: jax.Array  # [B] int32 denoising forwards only (transformers' count)


def forward_counts(out: sampler.GenerateOutput, eos_ids) -> Decoded:
  """Counts the forwards of `sampler.generate`'s output: a canvas is decoded by a row when
  any of its steps counted for the row (every canvas up to the one holding its EOS)."""
  canvases = jnp.sum(jnp.any(out.trace.counted, axis=1), axis=0, dtype=jnp.int32)     # [B]
  return Decoded(tokens=out.tokens, nfe=out.decoder_forwards + canvases,
                 nfe_engine=out.decoder_forwards + out.commit_forwards - 1,   # less the prefill
                 n_generated=generated_tokens(out.tokens, eos_ids), finished=out.finished,
                 nfe_decoder=out.decoder_forwards)


def rollout(model, prompt_tokens, prompt_valid, key, cfg: sampler.SamplerConfig,
            group_size: int, rollout_step) -> Trajectories:
  """Samples `group_size` responses per prompt (rows of a group adjacent) with capture."""
  reps = lambda x: jnp.repeat(x, group_size, axis=0)
  out = sampler.generate(model, reps(prompt_tokens), key, cfg, prompt_valid=reps(prompt_valid))
  counts = forward_counts(out, cfg.eos_ids)
  return Trajectories(prompt_tokens=prompt_tokens, prompt_valid=prompt_valid,
                      responses=out.tokens, nfe=counts.nfe, nfe_engine=counts.nfe_engine,
                      n_generated=counts.n_generated, finished=out.finished,
                      capture=capture_from_trace(out.trace, out.prompt_routes,
                                                 out.clean_routes),
                      rollout_step=jnp.asarray(rollout_step, jnp.int32),
                      nfe_denoise=counts.nfe_decoder)


def make_decoder(graphdef, cfg: sampler.SamplerConfig):
  """Jitted `(params, prompt_tokens, prompt_valid, key) -> Decoded`: evaluation's decoder
  (`evaluate.decode_problems`), the rollout's sampler without capture."""

  @jax.jit
  def run(params, prompt_tokens, prompt_valid, key):
    model = nnx.merge(graphdef, params)
    out = sampler.generate(model, prompt_tokens, key, cfg, prompt_valid=prompt_valid)
    return forward_counts(out, cfg.eos_ids)

  return run


def make_rollout(graphdef, cfg: sampler.SamplerConfig, group_size: int, mesh=None):
  """Jitted `(params, prompt_tokens, prompt_valid, key, rollout_step) -> Trajectories`."""
  return rollout_lib.make_rollout(graphdef, cfg, group_size, mesh, rollout_fn=rollout)


# ----------------------------------------------------------------------------- run config


def sampler_config(config, *, eos_ids=(1,), pad_id: int = 0, rollout: bool = True,
                   entropy_bound: float | None = None) -> sampler.SamplerConfig:
  """The sampler of a run: canvases of `decode.block_size`, `decode.gen_length` tokens, the
  entropy bound (nats) of the rollout rule (`orl.rollout_rule_value`), of `decode.rule_value`
  (rollout=False) or `entropy_bound`; rollouts record routes with `orl.capture_routes`."""
  d = config.decode
  bound = config.orl.rollout_rule_value if rollout else d.rule_value
  bound = bound if entropy_bound is None else entropy_bound
  return sampler.SamplerConfig(
      n_canvases=d.gen_length // d.block_size, max_steps=d.max_steps_per_block,
      entropy_bound=float(bound), t_min=d.t_min, t_max=d.t_max,
      stability_threshold=d.stability_threshold, confidence_threshold=d.confidence_threshold,
      pad_id=pad_id, eos_ids=tuple(eos_ids), top_k=d.top_k,
      capture_routes=rollout and bool(config.orl.get("capture_routes", False)))


def model_config(config, vocab_size: int = 0, **fields):
  """The run's `DiffusionGemmaConfig`: from `model.path`'s config.json when it is a Hugging Face
  directory (run-time fields from the config; `fields` ignored), else from `config.model`."""
  m = config.model
  runtime = dict(dtype=m.dtype, param_dtype=m.param_dtype, moe_impl=m.moe.impl,
                 attention_impl=m.attention_impl)
  hf_dir = weights_lib.hf_dir(config)
  if hf_dir:
    cfg = DiffusionGemmaConfig.from_hf(read_json(os.path.join(hf_dir, "config.json")),
                                       **runtime)
    if cfg.canvas_length != config.decode.block_size:
      raise ValueError(f"{hf_dir}/config.json has canvas_length={cfg.canvas_length}; set "
                       f"decode.block_size={cfg.canvas_length} (it is {config.decode.block_size})")
    return cfg
  return family.config_from_run(m, vocab_size=vocab_size or m.vocab_size,
                                canvas_length=config.decode.block_size, **fields)
