"""DiffusionGemma rollouts with exact state capture (DESIGN §2.3 for a uniform-noise family).

A state is what one denoising step consumed: the whole canvas **including its noise tokens**
and the self-conditioning input `z`, as stored by the sampler (never recomputed: with a strong
self-conditioning MLP the z-chain amplifies f32 rounding from step to step). The positions a
step did not accept are its *unresolved* positions (the masked positions of the mask families):
the losses train there, towards the verified final tokens.

The sampler's `StepTrace` [N canvases, S steps, B, ...] becomes the shared `Capture`
[B, N·S, ...] (block = canvas index, step = step index, commit = accepted), so the replay plan
and gather of every family read it; `Trajectories` is the shared type too.

Forward counts, both conventions (DESIGN §2.2, §6): `nfe_denoise` is the authors' count
(transformers': denoising forwards only); `nfe` adds one commit forward per decoded canvas, the
last one included (the paper's count, the headline); `nfe_engine` adds the commit forwards the
sampler really ran (none after the last canvas, none once every row has finished). The tokens
of TPF are counted as transformers counts them: the response's non-padding tokens
(`generated_tokens`). Rollouts and evaluation (`make_decoder`) count with the one function
`forward_counts`.

With `orl.capture_routes` the capture also holds the expert ids of every forward the rollout
ran (`decoding.RouteCapture`: each step's canvas, the prompt prefill, each commit forward), which
the replay gather places token by token, as for LLaDA2.
"""
from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax import config as config_lib
from orl_jax import diffusion_gemma_sampler as sampler
from orl_jax import weights as weights_lib
from orl_jax.decoding import Capture, RouteCapture
from orl_jax.models import config_json
from orl_jax.models.diffusion_gemma_config import DiffusionGemmaConfig
from orl_jax.models.families import diffusion_gemma as family
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


def generated_tokens(out: sampler.GenerateOutput, cfg: sampler.SamplerConfig) -> jax.Array:
  """[B] generated tokens as transformers' `tokens_per_forward` counts them: the non-padding
  tokens of the response (every token of the canvases generated when there is no pad id)."""
  if cfg.pad_id is None:
    canvas = out.tokens.shape[1] // cfg.n_canvases
    return jnp.broadcast_to(out.canvases_run * canvas, out.tokens.shape[:1]).astype(jnp.int32)
  return jnp.sum(out.tokens != cfg.pad_id, axis=-1, dtype=jnp.int32)


class Decoded(NamedTuple):
  """Per-row output of the sampler with its forwards counted both ways (DESIGN §2.2, §6)."""
  tokens: jax.Array       # [B, N·C] argmax canvases, padding after EOS
  nfe: jax.Array          # [B] int32 the paper's count: denoising forwards + 1 commit per
                          # decoded canvas
  nfe_engine: jax.Array   # [B] int32 denoising forwards + the commit forwards the sampler ran
  n_generated: jax.Array  # [B] int32 non-padding response tokens (transformers' count)
  finished: jax.Array     # [B] bool an EOS was generated
  nfe_denoise: jax.Array  # [B] int32 denoising forwards only (the authors' / transformers' count)


def forward_counts(out: sampler.GenerateOutput, cfg: sampler.SamplerConfig) -> Decoded:
  """Counts the forwards of `sampler.generate`'s output: a canvas is decoded by a row when
  any of its steps counted for the row (every canvas up to the one holding its EOS)."""
  canvases = jnp.sum(jnp.any(out.trace.counted, axis=1), axis=0, dtype=jnp.int32)     # [B]
  return Decoded(tokens=out.tokens, nfe=out.decoder_forwards + canvases,
                 nfe_engine=out.decoder_forwards + out.commit_forwards - 1,   # less the prefill
                 n_generated=generated_tokens(out, cfg), finished=out.finished,
                 nfe_denoise=out.decoder_forwards)


def rollout(model, prompt_tokens, prompt_valid, key, cfg: sampler.SamplerConfig,
            group_size: int, rollout_step) -> Trajectories:
  """Samples `group_size` responses per prompt (rows of a group adjacent) with capture."""
  reps = lambda x: jnp.repeat(x, group_size, axis=0)
  out = sampler.generate(model, reps(prompt_tokens), key, cfg, prompt_valid=reps(prompt_valid))
  counts = forward_counts(out, cfg)
  return Trajectories(prompt_tokens=prompt_tokens, prompt_valid=prompt_valid,
                      responses=out.tokens, nfe=counts.nfe, nfe_engine=counts.nfe_engine,
                      n_generated=counts.n_generated, finished=out.finished,
                      capture=capture_from_trace(out.trace, out.prompt_routes,
                                                 out.clean_routes),
                      rollout_step=jnp.asarray(rollout_step, jnp.int32),
                      nfe_denoise=counts.nfe_denoise)


def make_decoder(graphdef, cfg: sampler.SamplerConfig):
  """Jitted `(params, prompt_tokens, prompt_valid, key) -> Decoded`: evaluation's decoder
  (`evaluate.decode_problems`), the rollout's sampler without capture."""

  @jax.jit
  def run(params, prompt_tokens, prompt_valid, key):
    model = nnx.merge(graphdef, params)
    out = sampler.generate(model, prompt_tokens, key, cfg, prompt_valid=prompt_valid)
    return forward_counts(out, cfg)

  return run


def make_rollout(graphdef, cfg: sampler.SamplerConfig, group_size: int, mesh=None):
  """Jitted `(params, prompt_tokens, prompt_valid, key, rollout_step) -> Trajectories`."""
  return rollout_lib.make_rollout(graphdef, cfg, group_size, mesh, rollout_fn=rollout)


# ----------------------------------------------------------------------------- run config

# decode.* field -> (the generation_config.json key that sets it, transformers' default:
# DiffusionGemmaGenerationConfig._get_default_generation_params)
GENERATION_DEFAULTS = {"gen_length": ("max_new_tokens", 256),
                       "max_steps_per_block": ("max_denoising_steps", 48),
                       "rule_value": ("sampler_config.entropy_bound", 0.1),
                       "t_min": ("t_min", 0.4), "t_max": ("t_max", 0.8),
                       "stability_threshold": ("stability_threshold", 1),
                       "confidence_threshold": ("confidence_threshold", 0.005)}


def generation_config(hf_dir: str) -> dict:
  """{decode field: value} that `hf_dir`'s generation_config.json sets ({} without one), each
  typed and range-checked; CheckpointError naming the file and field otherwise."""
  from orl_jax.models import hf
  path = os.path.join(hf_dir, hf.GENERATION_CONFIG_FILE) if hf_dir else ""
  if not path or not os.path.isfile(path):
    return {}
  data = hf.read_json_object(path)
  try:
    nested = config_json.read_dict(data, "sampler_config")
    flat = dict(data, **{f"sampler_config.{k}": v for k, v in nested.items()})
    return {field: _generation_value(flat, key, default)
            for field, (key, default) in GENERATION_DEFAULTS.items() if key in flat}
  except ValueError as e:
    raise hf.CheckpointError(f"{path}: {e}") from None


def _generation_value(flat: dict, key: str, default):
  if isinstance(default, float):
    return config_json.read_float(flat, key, default, positive=key != "t_min")
  return config_json.read_int(flat, key, default, minimum=int(key != "stability_threshold"))


def fill_decode_defaults(config, hf_dir: str) -> dict:
  """Sets every `decode.*` field the config leaves unset (None) from `hf_dir`'s
  generation_config.json, else transformers' default; `decode.gen_length` is rounded up to
  whole canvases (`decode.block_size`). Returns {field: where its value came from}."""
  from_file = generation_config(hf_dir)
  d, origins = config.decode, {}
  for field, (key, default) in GENERATION_DEFAULTS.items():
    if d.get(field) is not None:
      continue
    value, origins[field] = ((from_file[field], f"generation_config.json {key}")
                             if field in from_file else (default, "transformers' default"))
    if field == "gen_length":
      value = -(-value // d.block_size) * d.block_size
    d[field] = value
  return origins


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


def model_config(config, vocab_size: int = 0, *, eos_ids=None, pad_id=None, **fields):
  """The run's `DiffusionGemmaConfig`: from `model.path`'s config.json when it is a Hugging Face
  directory (run-time fields from the config; `fields` ignored), else from `config.model`. The
  run's resolved special tokens (`eos_ids`, `pad_id`: model.special_tokens, else
  generation_config.json, else config.json) replace config.json's when given."""
  from orl_jax.models import hf
  m = config.model
  runtime = dict(dtype=m.dtype, param_dtype=m.param_dtype, moe_impl=m.moe.impl,
                 attention_impl=m.attention_impl)
  special = {k: v for k, v in dict(eos_ids=None if eos_ids is None else tuple(eos_ids),
                                   pad_id=pad_id).items() if v is not None}
  hf_dir = weights_lib.hf_dir(config)
  if not hf_dir:
    return family.config_from_run(m, vocab_size=vocab_size or m.vocab_size,
                                  canvas_length=config.decode.block_size, **special, **fields)
  cfg = hf.parse_config_json(hf_dir, lambda j: DiffusionGemmaConfig.from_hf(j, **runtime))
  if cfg.canvas_length != config.decode.block_size:
    raise config_lib.ConfigError(
        f"{hf_dir}/config.json has canvas_length={cfg.canvas_length}; set "
        f"decode.block_size={cfg.canvas_length} (it is {config.decode.block_size})")
  return dataclasses.replace(cfg, **special)
