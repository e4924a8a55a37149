"""DiffusionGemma rollouts with exact state capture for a uniform-noise family
(docs/method.md#rollout-with-exact-state-capture).

A state is what one denoising step consumed: the whole canvas **including its noise tokens**
and the self-conditioning input `z`, as stored by the sampler (never recomputed: with a strong
self-conditioning MLP the z-chain amplifies f32 rounding from step to step). The positions a
step did not accept are its *unresolved* positions (the masked positions of the mask families):
the losses train there, towards the verified final tokens.

The sampler's `StepTrace` [N canvases, S steps, B, ...] becomes the shared `Capture`
[B, N·S, ...] (block = canvas index, step = step index, commit = accepted), so the replay plan
and gather of every family read it; `Trajectories` is the shared type too.

Forward counts, both conventions (docs/decoding.md#two-forward-counts, docs/method.md#metrics):
`nfe_denoise` is the authors' count (transformers': denoising forwards only); `nfe` adds one commit
forward per decoded canvas, the last one included (the paper's count, the headline); `nfe_engine`
adds the commit forwards the sampler really ran (none after the last canvas, none once every row has
finished). The tokens of TPF are counted as transformers counts them: the response's non-padding
tokens (`generated_tokens`). Rollouts and evaluation (`sampler_decoder`) count with the one function
`forward_counts`. The family's `Sampler` (`decoding.py`) hands both to
`orl_jax.decode.build.make_decoder`, which jits `sampler_trajectories` data-parallel
(`orl_jax.decode.trajectories.make_trajectories`).

With `orl.capture_routes` the capture also holds the expert ids of every forward the rollout
ran (`models.decoded.RouteCapture`: each step's canvas, the prompt prefill, each commit
forward), which the replay gather places token by token, as for LLaDA2.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax.models.decoded import (Capture, DecodeOutput, RouteCapture, Trajectories,
                                   trajectories)
from orl_jax.models.diffusion_gemma import sampler


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


def generated_tokens(out: sampler.GenerateOutput, cfg: sampler.SamplerConfig) -> jax.Array:
  """[B] generated tokens as transformers' `tokens_per_forward` counts them: the non-padding
  tokens of the response (every token of the canvases generated when there is no pad id)."""
  if cfg.pad_id is None:
    canvas = out.tokens.shape[1] // cfg.n_canvases
    return jnp.broadcast_to(out.canvases_run * canvas, out.tokens.shape[:1]).astype(jnp.int32)
  return jnp.sum(out.tokens != cfg.pad_id, axis=-1, dtype=jnp.int32)


def forward_counts(out: sampler.GenerateOutput, cfg: sampler.SamplerConfig,
                   capture: bool = False) -> DecodeOutput:
  """The decoders' output (`models.decoded.DecodeOutput`) of `sampler.generate`'s: tokens [B, N·C]
  (argmax canvases, padding after EOS) and the forwards counted both ways
  (docs/decoding.md#two-forward-counts, docs/method.md#metrics) — a canvas is decoded by a row when
  any of its steps counted for the row (every canvas up to the one holding its EOS); `n_generated`
  the non-padding tokens (transformers' count). With
  `capture`, the trace as a `Capture` (the trajectory page's commit steps)."""
  canvases = jnp.sum(jnp.any(out.trace.counted, axis=1), axis=0, dtype=jnp.int32)     # [B]
  return DecodeOutput(
      tokens=out.tokens, nfe=out.decoder_forwards + canvases,
      nfe_engine=out.decoder_forwards + out.commit_forwards - 1,   # less the prefill
      nfe_denoise=out.decoder_forwards, n_generated=generated_tokens(out, cfg),
      finished=out.finished,
      capture=(capture_from_trace(out.trace, out.prompt_routes, out.clean_routes)
               if capture else None))


def sampler_trajectories(model, prompt_tokens, prompt_valid, key, cfg: sampler.SamplerConfig,
            group_size: int, rollout_step) -> Trajectories:
  """Samples `group_size` responses per prompt (rows of a group adjacent) with capture."""
  reps = lambda x: jnp.repeat(x, group_size, axis=0)
  out = sampler.generate(model, reps(prompt_tokens), key, cfg, prompt_valid=reps(prompt_valid))
  return trajectories(forward_counts(out, cfg, capture=True), prompt_tokens,
                      prompt_valid, rollout_step)


def sampler_decoder(graphdef, cfg: sampler.SamplerConfig, capture: bool = False):
  """Jitted `(params, prompt_tokens, prompt_valid, key) -> models.decoded.DecodeOutput`: the
  sampler of evaluation and of the decode launcher (`decoding.UniformNoiseSampler`), with its
  trace as a `Capture` when `capture`."""

  @jax.jit
  def run(params, prompt_tokens, prompt_valid, key):
    model = nnx.merge(graphdef, params)
    out = sampler.generate(model, prompt_tokens, key, cfg, prompt_valid=prompt_valid)
    return forward_counts(out, cfg, capture)

  return run
