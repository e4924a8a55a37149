"""DiffusionGemma uniform-noise decoding (docs/models.md#decoding-a-diffusiongemma-directory,
docs/models.md#diffusiongemma) as transformers 5.24's
`generation_diffusion_gemma.py` defines it, inside `jit`, batched, with per-row stop flags.

For each canvas (block) of `canvas_length` tokens: the canvas starts as uniform random tokens
and the self-conditioning signal as zeros; each denoising step (counting `cur_step` down from
`max_steps` to 1)
1. runs the canvas decoder on (canvas, cache, z) and divides the logits by the linear
   temperature `t_min + (t_max − t_min) · cur_step / max_steps` (0.8 → 0.4);
2. samples a denoiser token at every position from the processed distribution and takes the
   argmax canvas;
3. accepts, over **all** positions (accepted tokens can be re-noised later), the longest prefix
   of positions sorted by ascending entropy H (natural log) with `cumsum(H) − H_k ≤ bound`
   (EB-sampler, bound 0.1); accepted positions take the denoiser token, the others fresh
   uniform tokens;
4. carries `z = softmax(processed logits) @ E · √D` to the next step;
5. stops a row when its argmax canvas equals those of the previous `stability_threshold` steps
   and its mean entropy is below `confidence_threshold` (or after `max_steps`); a stopped row
   keeps its canvas, argmax and z, and its forwards stop counting.
The canvas's output is the argmax canvas; after an EOS the rest of the row is padding, and rows
finished on an earlier canvas emit padding only. Each canvas is then written into the cache by
a commit forward (HF: the encoder over the new tokens), except after the last canvas. Once every
row of the batch has finished (an EOS), no further canvas is generated and no further commit
forward runs, as transformers' `generate` stops (the remaining canvases are padding).

Randomness: the denoiser token is an inverse-CDF sample with a uniform `u` per position and the
re-noise tokens are uniform integers, both drawn from `fold_in(fold_in(key, canvas), step)` —
or given explicitly (`SamplerNoise`), which is how the parity test feeds transformers and us
the same noise.

Route capture (`capture_routes`, exact capture on MoE,
docs/method.md#rollout-with-exact-state-capture): the expert ids every forward chose are
recorded token-major — each denoising step's (in the trace), the prompt prefill's and each
commit forward's — so replay can route every token exactly as the rollout did, even where the
router sits at a near-tie that rounding would flip.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax.models.decoded import ROUTE_DTYPE, token_major_routes
from orl_jax.models.diffusion_gemma.model import DiffusionGemma, KVCache, init_cache


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """transformers' `DiffusionGemmaGenerationConfig` defaults."""
  n_canvases: int = 1               # canvases generated per call (max_new_tokens / canvas_length)
  max_steps: int = 48               # max_denoising_steps
  entropy_bound: float = 0.1
  t_min: float = 0.4
  t_max: float = 0.8
  stability_threshold: int = 1
  confidence_threshold: float = 0.005
  pad_id: int | None = 0            # fills a row after its EOS (None: no padding)
  eos_ids: tuple[int, ...] = (1,)
  top_k: int = 16                   # rollout statistics recorded per position (StepTrace)
  capture_routes: bool = False      # record the MoE expert ids of every forward (exact replay)

  def __post_init__(self):
    if self.max_steps < 1 or self.n_canvases < 1:
      raise ValueError(f"decode.max_steps={self.max_steps} and decode.n_canvases="
                       f"{self.n_canvases} must be >= 1")
    if not 0 <= self.t_min < self.t_max:
      raise ValueError(f"decode.t_min={self.t_min} must be >= 0 and below decode.t_max="
                       f"{self.t_max}")


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
  """The sampler's `decode.*` fields (None: generation_config.json's, else transformers'
  default, `GENERATION_DEFAULTS`)."""
  t_min: float | None = None
  t_max: float | None = None
  stability_threshold: int | None = None
  confidence_threshold: float | None = None


def sampler_config(config, *, eos_ids=(1,), pad_id: int = 0, rollout: bool = True,
                   entropy_bound: float | None = None) -> SamplerConfig:
  """The sampler of a run: canvases of `decode.block_size`, `decode.gen_length` tokens, the
  entropy bound (nats) of the rollout rule (`orl.rollout_rule_value`), of `decode.rule_value`
  (rollout=False) or `entropy_bound`; rollouts record routes with `orl.capture_routes`."""
  d = config.decode
  own = d.family_settings(SamplerSettings)
  bound = config.orl.rollout_rule_value if rollout else d.rule_value
  bound = bound if entropy_bound is None else entropy_bound
  return SamplerConfig(
      n_canvases=d.gen_length // d.block_size, max_steps=d.max_steps_per_block,
      entropy_bound=float(bound), t_min=own.t_min, t_max=own.t_max,
      stability_threshold=own.stability_threshold,
      confidence_threshold=own.confidence_threshold,
      pad_id=pad_id, eos_ids=tuple(eos_ids), top_k=d.top_k,
      capture_routes=rollout and bool(config.orl.capture_routes))


class SamplerNoise(NamedTuple):
  """Explicit randomness, leading axes [n_canvases, ...]."""
  initial: jax.Array   # [N, B, C] int32 starting canvases
  uniform: jax.Array   # [N, S, B, C] f32 in [0, 1): inverse-CDF draws of the denoiser tokens
  renoise: jax.Array   # [N, S, B, C] int32 fresh tokens for rejected positions


class StepTrace(NamedTuple):
  """What each denoising step consumed and decided, [N, S, B, ...] (N canvases, S steps): the
  rollout capture of this family (`trajectories.py` beside this module)."""
  canvas: jax.Array     # [N, S, B, C] int32 canvas fed to the step (noise tokens included)
  z: jax.Array          # [N, S, B, C, D] self-conditioning soft embedding consumed
  accepted: jax.Array   # [N, S, B, C] bool positions the step accepted
  active: jax.Array     # [N, S, B] bool the row was still denoising this canvas
  counted: jax.Array    # [N, S, B] bool active and not finished on an earlier canvas (the
                        # step is one of the row's decoder forwards)
  entropy: jax.Array    # [N, S, B, C] f32 normalized entropy (/ log V) of softmax(logits), T = 1
  topk_ids: jax.Array   # [N, S, B, C, K] int32 top-K of the step's prediction (T = 1)
  topk_logprobs: jax.Array  # [N, S, B, C, K] f32 their log-probabilities
  routes: jax.Array | None = None  # [N, S, B, C, L, K_moe] ROUTE_DTYPE expert ids of the step
                                   # (-1 where it did not count); None without capture_routes


class GenerateOutput(NamedTuple):
  tokens: jax.Array         # [B, N·C] argmax canvases, padding after EOS
  decoder_forwards: jax.Array  # [B] int32 denoising forwards (transformers' TPF denominator)
  commit_forwards: jax.Array   # [B] int32 commit forwards run (prompt prefill included)
  canvases_run: jax.Array      # [] int32 canvases generated for the batch (the others skipped:
                               # every row had finished)
  finished: jax.Array       # [B] bool an EOS was generated
  trace: StepTrace
  prompt_routes: jax.Array | None = None  # [B, P, L, K_moe] the prefill's expert ids (-1: padding)
  clean_routes: jax.Array | None = None   # [B, N·C, L, K_moe] each commit forward's (-1: none
                                          # ran for the row, e.g. the last canvas)


def temperature(cfg: SamplerConfig, cur_step):
  """Linear schedule; `cur_step` counts the steps *remaining* (max_steps .. 1)."""
  return cfg.t_min + (cfg.t_max - cfg.t_min) * (cur_step / cfg.max_steps)


def token_entropy(logits):
  """Entropy (nats) of softmax(logits), f32. [..., V] -> [...]."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def entropy_bound_accept(entropy, bound: float):
  """[B, C] -> [B, C] bool: the lowest-entropy positions with `cumsum(H) − H_k ≤ bound`."""
  order = jnp.argsort(entropy, axis=-1, stable=True)
  sorted_h = jnp.take_along_axis(entropy, order, axis=-1)
  selected = jnp.cumsum(sorted_h, axis=-1) - sorted_h <= bound
  rows = jnp.arange(entropy.shape[0])[:, None]
  return jnp.zeros(entropy.shape, bool).at[rows, order].set(selected)


def inverse_cdf_sample(probs, u):
  """Token whose CDF interval holds `u · total`: [..., V] f32, [...] -> [...] int32."""
  cdf = jnp.cumsum(probs, axis=-1)
  idx = jnp.sum(cdf <= u[..., None] * cdf[..., -1:], axis=-1)
  return jnp.minimum(idx, probs.shape[-1] - 1).astype(jnp.int32)


class _Denoise(NamedTuple):
  step: jax.Array       # [] int32 steps taken
  canvas: jax.Array     # [B, C] int32
  argmax: jax.Array     # [B, C] int32
  z: jax.Array          # [B, C, D]
  history: jax.Array    # [K, B, C] int32 argmax canvases of the last K steps (-1: none yet)
  stopped: jax.Array    # [B] bool
  forwards: jax.Array   # [B] int32
  trace: StepTrace      # [S, B, ...]


def _step_noise(key, noise: SamplerNoise | None, c, s, shape, vocab: int):
  """(u [B, C], renoise tokens [B, C]) of canvas c, step s."""
  if noise is not None:
    return noise.uniform[c, s], noise.renoise[c, s]
  k_u, k_tok = jax.random.split(jax.random.fold_in(jax.random.fold_in(key, c), s))
  return (jax.random.uniform(k_u, shape, jnp.float32),
          jax.random.randint(k_tok, shape, 0, vocab, jnp.int32))


def _denoise_step(model: DiffusionGemma, cache: KVCache, cfg: SamplerConfig, done_rows, draw,
                  d: _Denoise) -> _Denoise:
  """One denoising step of every row (stopped rows keep their state)."""
  out = model.decode_forward(d.canvas, cache, d.z)
  logits = out.logits
  processed = logits / temperature(cfg, cfg.max_steps - d.step)
  u, renoise = draw(d.step)
  denoised = inverse_cdf_sample(jax.nn.softmax(processed, axis=-1), u)
  entropy = token_entropy(processed)
  accepted = entropy_bound_accept(entropy, cfg.entropy_bound)
  keep = d.stopped[:, None]
  canvas = jnp.where(keep, d.canvas, jnp.where(accepted, denoised, renoise))
  argmax = jnp.where(keep, d.argmax, jnp.argmax(processed, axis=-1).astype(jnp.int32))
  z = jnp.where(keep[..., None], d.z, model.soft_embedding(processed))
  stable = jnp.all(d.history == argmax[None], axis=(0, 2))
  history = (jnp.concatenate([d.history, argmax[None]], axis=0)[1:] if d.history.shape[0]
             else d.history)
  stopped = d.stopped | (stable & (jnp.mean(entropy, axis=-1) < cfg.confidence_threshold))
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  top_lp, top_ids = jax.lax.top_k(logp, cfg.top_k)
  normalized = -jnp.sum(jnp.exp(logp) * logp, axis=-1) / jnp.log(jnp.float32(logits.shape[-1]))
  counted = ~(d.stopped | done_rows)
  routes = None
  if cfg.capture_routes:
    routes = jnp.where(counted[:, None, None, None], token_major_routes(out.expert_ids), -1)
  trace = jax.tree.map(lambda buf, x: buf.at[d.step].set(x.astype(buf.dtype)), d.trace,
                       StepTrace(d.canvas, d.z, accepted, ~d.stopped, counted, normalized,
                                 top_ids.astype(jnp.int32), top_lp, routes))
  forwards = d.forwards + counted.astype(jnp.int32)
  return _Denoise(d.step + 1, canvas, argmax, z, history, stopped, forwards, trace)


def denoise_canvas(model: DiffusionGemma, cache: KVCache, canvas, cfg: SamplerConfig, draw,
                   done_rows):
  """Denoises one canvas [B, C] against the read-only cache -> (argmax canvas [B, C],
  forwards [B], StepTrace [S, B, ...]). `draw(step) -> (u, renoise)`; `done_rows` [B] rows
  finished on an earlier canvas (they still run, batched, but their forwards do not count)."""
  b, c = canvas.shape
  s = cfg.max_steps
  init = _Denoise(jnp.int32(0), canvas, canvas, jnp.zeros((b, c, model.cfg.d_model),
                                                          model.cfg.compute_dtype),
                  jnp.full((cfg.stability_threshold, b, c), -1, jnp.int32),
                  jnp.zeros((b,), bool), jnp.zeros((b,), jnp.int32),
                  empty_trace(model, cfg, b, c))
  out = jax.lax.while_loop(lambda d: (d.step < s) & ~jnp.all(d.stopped),
                           lambda d: _denoise_step(model, cache, cfg, done_rows, draw, d), init)
  return out.argmax, out.forwards, out.trace


def empty_trace(model: DiffusionGemma, cfg: SamplerConfig, b: int, c: int) -> StepTrace:
  """The trace of a canvas no step ran for ([S, B, ...] zeros; routes -1)."""
  s, k, d_model = cfg.max_steps, cfg.top_k, model.cfg.d_model
  routes = (_no_routes(model, (s, b, c)) if cfg.capture_routes else None)
  return StepTrace(jnp.zeros((s, b, c), jnp.int32),
                   jnp.zeros((s, b, c, d_model), model.cfg.compute_dtype),
                   jnp.zeros((s, b, c), bool), jnp.zeros((s, b), bool),
                   jnp.zeros((s, b), bool), jnp.zeros((s, b, c), jnp.float32),
                   jnp.zeros((s, b, c, k), jnp.int32), jnp.zeros((s, b, c, k), jnp.float32),
                   routes)


def _no_routes(model: DiffusionGemma, lead: tuple):
  """A route buffer [*lead, L, K_moe] of -1 (no forward routed these tokens)."""
  mcfg = model.cfg
  return jnp.full(lead + (len(mcfg.layers), mcfg.top_k), -1, ROUTE_DTYPE)


def check_route_capture(model: DiffusionGemma, cfg: SamplerConfig) -> None:
  if cfg.capture_routes and model.cfg.n_experts > jnp.iinfo(ROUTE_DTYPE).max:
    raise ValueError(f"orl.capture_routes stores expert ids as {jnp.dtype(ROUTE_DTYPE).name}: "
                     f"{model.cfg.n_experts} experts do not fit")


def finalize_canvas(argmax, done_rows, cfg: SamplerConfig):
  """(canvas tokens [B, C], rows finished now or before [B]): transformers' `_finalize_canvas`:
  rows done before become padding, padding follows the first EOS."""
  is_eos = jnp.isin(argmax, jnp.asarray(cfg.eos_ids, jnp.int32))
  finished = done_rows | jnp.any(is_eos, axis=-1)
  if cfg.pad_id is None:
    return argmax, finished
  seen = jnp.cumsum(is_eos, axis=-1)
  after_eos = (seen > 0) & ~((seen == 1) & is_eos)
  pad = after_eos | done_rows[:, None]
  return jnp.where(pad, cfg.pad_id, argmax).astype(jnp.int32), finished


def generate(model: DiffusionGemma, prompt, key, cfg: SamplerConfig, *, prompt_valid=None,
             noise: SamplerNoise | None = None) -> GenerateOutput:
  """Generates up to `n_canvases` canvases after the prompts [B, P] (left padding:
  `prompt_valid` False), stopping once every row has finished. Call under `jax.jit` (see
  `make_generator`)."""
  check_route_capture(model, cfg)
  b, p = prompt.shape
  c, vocab = model.cfg.canvas_length, model.cfg.vocab_size
  valid = jnp.ones((b, p), bool) if prompt_valid is None else prompt_valid
  cache = init_cache(model.cfg, b, p + cfg.n_canvases * c)
  prefill = model.commit_forward(prompt, cache, valid)
  capture = cfg.capture_routes
  no_routes = _no_routes(model, (b, c)) if capture else None

  def commit(tokens, cache, live):
    """The commit forward of a canvas -> (cache, its routes [B, C, L, K] for `live` rows)."""
    out = model.commit_forward(tokens, cache)
    if not capture:
      return out.cache, None
    ids = token_major_routes(out.expert_ids)
    return out.cache, jnp.where(live[:, None, None, None], ids, no_routes)

  def run_canvas(cache, done, ci):
    """(cache, rows finished, decoder forwards [B], commit ran, (tokens, trace, routes)) of
    canvas `ci`: denoised, finalized and, unless it is the last or it finished every row,
    committed."""
    initial = (noise.initial[ci] if noise is not None else jax.random.randint(
        jax.random.fold_in(jax.random.fold_in(key, ci), cfg.max_steps), (b, c), 0, vocab,
        jnp.int32))
    draw = lambda s: _step_noise(key, noise, ci, s, (b, c), vocab)
    argmax, n_fwd, trace = denoise_canvas(model, cache, initial, cfg, draw, done)
    tokens, finished = finalize_canvas(argmax, done, cfg)
    stop = (ci == cfg.n_canvases - 1) | jnp.all(finished)
    cache, routes = jax.lax.cond(stop, lambda k: (k, no_routes),
                                 lambda k: commit(tokens, k, ~done), cache)
    return cache, finished, n_fwd, ~stop, (tokens, trace, routes)

  def skip_canvas(cache, done, ci):
    """A canvas after every row finished: padding, no forward."""
    del ci
    fill = cfg.eos_ids[0] if cfg.pad_id is None else cfg.pad_id
    tokens = jnp.full((b, c), fill, jnp.int32)
    return (cache, done, jnp.zeros((b,), jnp.int32), jnp.bool_(False),
            (tokens, empty_trace(model, cfg, b, c), no_routes))

  def one_canvas(carry, ci):
    cache, done, forwards, commits, ran = carry
    skip = jnp.all(done)
    cache, done, n_fwd, committed, out = jax.lax.cond(skip, skip_canvas, run_canvas, cache,
                                                      done, ci)
    counts = (forwards + n_fwd, commits + committed.astype(jnp.int32),
              ran + (~skip).astype(jnp.int32))
    return (cache, done) + counts, out

  zeros = jnp.zeros((b,), jnp.int32)
  init = (prefill.cache, jnp.zeros((b,), bool), zeros, jnp.int32(1), jnp.int32(0))
  (_, finished, forwards, commits, ran), (tokens, trace, routes) = jax.lax.scan(
      one_canvas, init, jnp.arange(cfg.n_canvases))
  by_row = lambda x: jnp.moveaxis(x, 1, 0).reshape((b, cfg.n_canvases * c) + x.shape[3:])
  prompt_routes = clean_routes = None
  if capture:
    prompt_routes = jnp.where(valid[:, :, None, None], token_major_routes(prefill.expert_ids),
                              -1).astype(ROUTE_DTYPE)
    clean_routes = by_row(routes)
  return GenerateOutput(by_row(tokens), forwards, jnp.broadcast_to(commits, (b,)), ran,
                        finished, trace, prompt_routes, clean_routes)


def make_generator(graphdef, cfg: SamplerConfig):
  """Jitted `(params_state, prompt, key, prompt_valid, noise) -> GenerateOutput`."""

  @jax.jit
  def run(state, prompt, key, prompt_valid=None, noise=None):
    model = nnx.merge(graphdef, state)
    return generate(model, prompt, key, cfg, prompt_valid=prompt_valid, noise=noise)

  return run
