"""DiffusionGemma (docs/models.md#diffusiongemma): the Gemma 4 text stack as transformers 5.24's
`models/diffusion_gemma/modeling_diffusion_gemma.py` defines it, in Flax NNX.

One set of weights serves two roles:
* the **commit forward** (HF: the encoder) writes committed tokens into the KV cache,
  token-causally (sliding layers: each token sees itself and the `window − 1` tokens before it);
* the **canvas decoder** (HF: the decoder) reads the cache without writing it and attends
  bidirectionally over the canvas; its sliding layers see only the last `window − 1` cached
  tokens (transformers' dynamic sliding-window cache keeps exactly those).
They differ only in the per-layer `layer_scalar` (HF keeps separate encoder and decoder
buffers: `commit_layer_scalar` / `layer_scalar` here) and in the decoder's input, which goes
through the **self-conditioning** block: `post_norm(E[x]·√D + MLP(pre_norm(z)))` with
`z = softmax(previous processed logits) @ E · √D` (zeros on a canvas's first step).

ORL replays both roles in one packed forward (`hidden_states`,
docs/method.md#replay-states-packing-staircase-attention): prompt and clean tokens are the commit
stream (plain embeddings, `commit_layer_scalar`, token-causal), state tokens are decoder canvases
(self-conditioning on the captured z, `layer_scalar`), under the staircase rule with blocks of one
token and the sliding window on sliding layers.

Each layer: attention (q/k RMSNorm with scale, v RMSNorm without, scaling 1.0, K = V on full
layers, default RoPE on sliding layers, proportional RoPE on full layers), then a dense
gated-GELU MLP and a softmax-routed MoE **in parallel** from the same residual, each with its
own pre/post norms, summed, normed again, added, and the whole residual stream multiplied by
`layer_scalar`. Head: tied embedding, logits soft-capped (30). Attention here is plain XLA with
dense masks; the cache keeps every position (sliding layers included) for simplicity.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orl_jax.models.diffusion_gemma.config import AttentionSpec, DiffusionGemmaConfig
from orl_jax.models.moe import (ExpertWeights, RoutedTokens, dense_experts, expert_axis_size,
                                 expert_parallel_experts, ragged_experts)
from orl_jax.models.remat import layer_checkpoint
from orl_jax.residual import Residual, RMSNorm
from pallas_kernels.staircase_attention import KIND_STATE, TokenMeta
from pallas_kernels.staircase_attention import attention as staircase_attention


def rms_normalize(x, eps: float):
  """Scale-free RMSNorm in f32 (HF `with_scale=False`: v-norm, router norm, SC post-norm)."""
  xf = x.astype(jnp.float32)
  return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def gelu(x, approximate: bool):
  """HF `gelu_pytorch_tanh` (approximate) or exact `gelu`."""
  return jax.nn.gelu(x, approximate=approximate)


def rope_inv_freq(spec: AttentionSpec) -> np.ndarray:
  """[head_dim / 2] f32 inverse frequencies. Proportional RoPE: exponents over the *whole*
  head_dim, only the first `partial_rotary_factor · head_dim / 2` non-zero (the rest of each
  half passes through unrotated) — not a RoPE on a leading sub-block."""
  dh, theta = spec.head_dim, np.float32(spec.rope_theta)
  if spec.rope_type == "proportional":
    n_rot = int(spec.rope_fraction * dh // 2)
    inv = 1.0 / theta ** (np.arange(0, 2 * n_rot, 2, dtype=np.float32) / np.float32(dh))
    inv = np.concatenate([inv, np.zeros(dh // 2 - n_rot, np.float32)])
  else:
    inv = 1.0 / theta ** (np.arange(0, dh, 2, dtype=np.float32) / np.float32(dh))
  return (inv / np.float32(spec.rope_factor)).astype(np.float32)


def apply_rope(x, positions, inv_freq: np.ndarray):
  """Half-split RoPE (HF `rotate_half`). x: [B, T, H, Dh]; positions: [B, T] or [T]."""
  positions = jnp.broadcast_to(positions, x.shape[:2])
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)       # [B, T, Dh/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


def attend(q, k, v, visible):
  """Softmax attention with scaling 1.0. q: [B, T, H, Dh]; k, v: [B, S, Hkv, Dh];
  visible: [B, T, S] bool -> [B, T, H·Dh]. Query head h reads kv head h // (H / Hkv)."""
  b, t, h, dh = q.shape
  g = k.shape[2]
  qg = q.reshape(b, t, g, h // g, dh)
  scores = jnp.einsum("btgrd,bsgd->bgrts", qg, k, preferred_element_type=jnp.float32)
  scores = jnp.where(visible[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bgrts,bsgd->btgrd", probs, v)
  return out.reshape(b, t, h * dh)


def _linear(cfg: DiffusionGemmaConfig, i: int, o: int, rngs: nnx.Rngs):
  return nnx.Linear(i, o, use_bias=False, dtype=cfg.compute_dtype,
                    param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs)


def _norm(cfg: DiffusionGemmaConfig, dim: int | None = None):
  return RMSNorm(dim or cfg.d_model, cfg.norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))


class KVCache(NamedTuple):
  """Committed context. Slot p holds position p (positions are slot indices, as transformers
  numbers them, left padding included)."""
  k: tuple          # per layer [B, T_max, Hkv_l, Dh_l] keys after k-norm and RoPE
  v: tuple          # per layer [B, T_max, Hkv_l, Dh_l] values after v-norm
  valid: jax.Array  # [B, T_max] bool: slot holds a committed real (non-padding) token
  length: jax.Array  # [] int32 slots written so far (= position of the next token)


def init_cache(cfg: DiffusionGemmaConfig, batch: int, length: int) -> KVCache:
  shapes = [(batch, length, s.n_kv_heads, s.head_dim) for s in cfg.layers]
  zeros = tuple(jnp.zeros(s, cfg.compute_dtype) for s in shapes)
  return KVCache(zeros, zeros, jnp.zeros((batch, length), bool), jnp.zeros((), jnp.int32))


def commit_visibility(cfg: DiffusionGemmaConfig, spec: AttentionSpec, cache: KVCache, t: int):
  """[B, t, T_max] keys a commit-forward token sees (the cache already holds the new tokens):
  token-causal, real tokens only, within the sliding window on sliding layers."""
  q_pos = cache.length - t + jnp.arange(t)[:, None]                             # [t, 1]
  k_pos = jnp.arange(cache.valid.shape[1])[None, :]                             # [1, T_max]
  rule = k_pos <= q_pos
  if spec.sliding:
    rule &= k_pos > q_pos - cfg.sliding_window
  return rule[None] & cache.valid[:, None, :]


def decode_visibility(cfg: DiffusionGemmaConfig, spec: AttentionSpec, cache: KVCache, c: int):
  """[B, c, T_max + c] keys a canvas token sees: every canvas token, and the cached real tokens
  (on sliding layers only the last `window − 1` slots, the dynamic sliding cache's content)."""
  k_pos = jnp.arange(cache.valid.shape[1])
  cached = cache.valid & (k_pos < cache.length)[None]
  if spec.sliding:
    cached &= (k_pos >= cache.length - (cfg.sliding_window - 1))[None]
  keys = jnp.concatenate([cached, jnp.ones((cached.shape[0], c), bool)], axis=1)
  return jnp.broadcast_to(keys[:, None, :], (keys.shape[0], c, keys.shape[1]))


class Attention(nnx.Module):

  def __init__(self, cfg: DiffusionGemmaConfig, spec: AttentionSpec, rngs: nnx.Rngs):
    self.spec = spec
    self.eps = cfg.norm_eps
    h, g, dh = cfg.n_heads, spec.n_kv_heads, spec.head_dim
    self.q_proj = _linear(cfg, cfg.d_model, h * dh, rngs)
    self.k_proj = _linear(cfg, cfg.d_model, g * dh, rngs)
    if not spec.k_is_v:
      self.v_proj = _linear(cfg, cfg.d_model, g * dh, rngs)
    self.o_proj = _linear(cfg, h * dh, cfg.d_model, rngs)
    self.q_norm = _norm(cfg, dh)
    self.k_norm = _norm(cfg, dh)

  def project(self, x, positions):
    """x: [B, T, D] -> q [B, T, H, Dh], k and v [B, T, Hkv, Dh] (normed, RoPE on q and k)."""
    b, t, _ = x.shape
    dh = self.spec.head_dim
    q = self.q_norm(self.q_proj(x).reshape(b, t, -1, dh))
    k_raw = self.k_proj(x).reshape(b, t, -1, dh)
    v_raw = k_raw if self.spec.k_is_v else self.v_proj(x).reshape(b, t, -1, dh)
    k = self.k_norm(k_raw)
    inv_freq = rope_inv_freq(self.spec)
    q = apply_rope(q, positions, inv_freq)
    k = apply_rope(k, positions, inv_freq)
    return q, k, rms_normalize(v_raw, self.eps)


class MLP(nnx.Module):

  def __init__(self, cfg: DiffusionGemmaConfig, rngs: nnx.Rngs):
    self.approximate = cfg.activation == "gelu_pytorch_tanh"
    self.gate_proj = _linear(cfg, cfg.d_model, cfg.mlp_dim, rngs)
    self.up_proj = _linear(cfg, cfg.d_model, cfg.mlp_dim, rngs)
    self.down_proj = _linear(cfg, cfg.mlp_dim, cfg.d_model, rngs)

  def __call__(self, x):
    return self.down_proj(gelu(self.gate_proj(x), self.approximate) * self.up_proj(x))


class Router(nnx.Module):
  """HF `router`: `proj` kernel [D, E], `scale` [D], `per_expert_scale` [E]."""

  def __init__(self, cfg: DiffusionGemmaConfig, rngs: nnx.Rngs):
    pd = jnp.dtype(cfg.param_dtype)
    self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(),
                                                            (cfg.d_model, cfg.n_experts), pd))
    self.scale = nnx.Param(jnp.ones((cfg.d_model,), pd))
    self.per_expert_scale = nnx.Param(jnp.ones((cfg.n_experts,), pd))
    self.eps, self.top_k, self.dtype = cfg.norm_eps, cfg.top_k, cfg.compute_dtype

  def __call__(self, x, given_ids=None) -> RoutedTokens:
    """x: [N, D] the residual stream (not the experts' normed input). Softmax over all experts
    (f32), top-k, renormalised over the k, times `per_expert_scale`. `given_ids` [N, K] replaces
    the choice of tokens whose first id is >= 0 (captured routes); weights are recomputed."""
    d = x.shape[-1]
    h = rms_normalize(x, self.eps) * self.scale[...].astype(x.dtype) * jnp.asarray(d ** -0.5,
                                                                                    x.dtype)
    logits = jnp.einsum("nd,de->ne", h.astype(self.dtype), self.kernel[...].astype(self.dtype))
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    _, ids = jax.lax.top_k(probs, self.top_k)
    if given_ids is not None:
      ids = jnp.where(given_ids[:, :1] >= 0, given_ids.astype(ids.dtype), ids)
    chosen = jnp.take_along_axis(probs, ids, axis=-1)
    weights = chosen / jnp.sum(chosen, axis=-1, keepdims=True)
    weights = weights * self.per_expert_scale[...].astype(jnp.float32)[ids]
    return RoutedTokens(ids.astype(jnp.int32), weights, probs)


class MoE(nnx.Module):
  """Routed gated-GELU experts: `gate_proj`, `up_proj` [E, D, F], `down_proj` [E, F, D]
  (HF stores `gate_up_proj` [E, 2F, D] and `down_proj` [E, D, F])."""

  def __init__(self, cfg: DiffusionGemmaConfig, rngs: nnx.Rngs):
    pd = jnp.dtype(cfg.param_dtype)
    init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    e, d, f = cfg.n_experts, cfg.d_model, cfg.expert_dim
    self.router = Router(cfg, rngs)
    self.gate_proj = nnx.Param(init(rngs.params(), (e, d, f), pd))
    self.up_proj = nnx.Param(init(rngs.params(), (e, d, f), pd))
    self.down_proj = nnx.Param(init(rngs.params(), (e, f, d), pd))
    self.approximate = cfg.activation == "gelu_pytorch_tanh"
    self.impl, self.dtype = cfg.moe_impl, cfg.compute_dtype

  def __call__(self, route_input, expert_input, routes=None):
    """route_input, expert_input: [B, T, D]; routes: [B, T, K] int32 or None ->
    (y [B, T, D], expert ids [B, T, K])."""
    b, t, d = expert_input.shape
    given = None if routes is None else routes.reshape(b * t, -1)
    routed = self.router(route_input.reshape(b * t, d), given)
    w = ExpertWeights(*(p[...].astype(self.dtype)
                        for p in (self.gate_proj, self.up_proj, self.down_proj)))
    flat = expert_input.reshape(b * t, d).astype(self.dtype)
    act = functools.partial(gelu, approximate=self.approximate)
    if self.impl != "ragged":
      y = dense_experts(flat, routed, w, act=act)
    elif expert_axis_size() > 1:     # experts split over the mesh: exchange the tokens
      y = expert_parallel_experts(flat, routed, w, act=act)
    else:
      y = ragged_experts(flat, routed, w, act=act)
    return y.reshape(b, t, d), routed.expert_ids.reshape(b, t, -1)


class Layer(nnx.Module):

  def __init__(self, cfg: DiffusionGemmaConfig, spec: AttentionSpec, rngs: nnx.Rngs):
    pd = jnp.dtype(cfg.param_dtype)
    self.attn = Attention(cfg, spec, rngs)
    self.mlp = MLP(cfg, rngs)
    self.moe = MoE(cfg, rngs)
    for name in ("input_norm", "post_attn_norm", "pre_mlp_norm", "post_mlp_norm",
                 "pre_moe_norm", "post_moe_norm", "post_ff_norm"):
      setattr(self, name, _norm(cfg))
    # Buffers in HF (never trained: the family registry marks them frozen).
    self.layer_scalar = nnx.Param(jnp.ones((1,), pd))         # canvas decoder
    self.commit_layer_scalar = nnx.Param(jnp.ones((1,), pd))  # commit forward (HF encoder)

  def __call__(self, x, attention_fn, scalar, routes=None):
    """attention_fn: normed x -> [B, T, H·Dh] attention output (before o_proj)."""
    h = self.attn.o_proj(attention_fn(self.input_norm(x)))
    x = x + self.post_attn_norm(h)
    dense = self.post_mlp_norm(self.mlp(self.pre_mlp_norm(x)))
    routed, ids = self.moe(x, self.pre_moe_norm(x), routes)
    x = x + self.post_ff_norm(dense + self.post_moe_norm(routed))
    return x * scalar[...].astype(x.dtype), ids


class SelfConditioning(nnx.Module):
  """HF `self_conditioning`: `post_norm(embeds + down(act(gate(n)) · up(n)))`, n = pre_norm(z);
  the post-norm has no scale."""

  def __init__(self, cfg: DiffusionGemmaConfig, rngs: nnx.Rngs):
    self.pre_norm = _norm(cfg)
    self.mlp = MLP(cfg, rngs)
    self.eps = cfg.norm_eps

  def __call__(self, embeds, z):
    return rms_normalize(embeds + self.delta(z), self.eps)

  def delta(self, z):
    """What the pathway adds to the embeddings: MLP(pre_norm(z))."""
    return self.mlp(self.pre_norm(z))


class CommitOutput(NamedTuple):
  hidden: jax.Array      # [B, T, D] final-normed hidden states (logits: `model.head(hidden)`)
  cache: KVCache
  expert_ids: jax.Array  # [L, B, T, K] int32 routes taken


class DecoderOutput(NamedTuple):
  logits: jax.Array      # [B, C, V] f32, soft-capped
  expert_ids: jax.Array  # [L, B, C, K] int32 routes taken


class DiffusionGemma(nnx.Module):

  def __init__(self, cfg: DiffusionGemmaConfig, *, rngs: nnx.Rngs, mesh=None):
    self.cfg = cfg
    self.mesh = mesh   # where packed-replay attention kernels run (inside shard_map)
    pd = jnp.dtype(cfg.param_dtype)
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype, param_dtype=pd,
                           embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.layers = nnx.List([Layer(cfg, spec, rngs) for spec in cfg.layers])
    self.final_norm = _norm(cfg)
    self.self_conditioning = SelfConditioning(cfg, rngs)

  @property
  def embedding_table(self) -> jax.Array:
    """[V, D] the (tied) embedding table, unscaled."""
    return self.embed.embedding[...]

  def _embed_scale(self, dtype):
    # HF casts √D to the weight dtype first (√2816 is not exact in bf16).
    return jnp.asarray(self.cfg.embed_scale, self.embedding_table.dtype).astype(dtype)

  def embed_tokens(self, tokens):
    x = self.embed(tokens)
    return x * self._embed_scale(x.dtype)

  def soft_embedding(self, logits, row_mask=None):
    """z = softmax(logits) @ E · √D: [B, C, V] (the previous step's processed logits) ->
    [B, C, D] compute dtype; rows where `row_mask` [B] is False get zeros."""
    table = self.embedding_table
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1).astype(table.dtype)
    z = jnp.einsum("bcv,vd->bcd", probs, table) * self._embed_scale(table.dtype)
    if row_mask is not None:
      z = z * row_mask.astype(z.dtype)[:, None, None]
    return z.astype(self.cfg.compute_dtype)

  def head(self, hidden):
    """Tied head with the final logit soft-cap: [B, T, D] -> [B, T, V] f32."""
    logits = jnp.einsum("btd,vd->btv", hidden, self.embedding_table.astype(hidden.dtype),
                        preferred_element_type=jnp.float32)
    cap = self.cfg.final_softcap
    return logits if cap is None else jnp.tanh(logits / cap) * cap

  def commit_forward(self, tokens, cache: KVCache, valid=None, routes=None) -> CommitOutput:
    """Writes `tokens` [B, T] at slots `cache.length ..` (token-causal); `valid` [B, T] marks
    real tokens (False: left padding, never attended). routes: [L, B, T, K] or None."""
    b, t = tokens.shape
    valid = jnp.ones((b, t), bool) if valid is None else valid
    positions = cache.length + jnp.arange(t, dtype=jnp.int32)
    slot_valid = jax.lax.dynamic_update_slice_in_dim(cache.valid, valid, cache.length, axis=1)
    grown = KVCache(cache.k, cache.v, slot_valid, cache.length + t)
    x = self.embed_tokens(tokens)
    new_k, new_v, taken = [], [], []
    for i, layer in enumerate(self.layers):
      visible = commit_visibility(self.cfg, layer.attn.spec, grown, t)
      slot: dict[str, jax.Array] = {}

      def attention_fn(h, i=i, layer=layer, visible=visible, slot=slot):
        q, k, v = layer.attn.project(h, positions)
        write = lambda c, new: jax.lax.dynamic_update_slice_in_dim(c, new.astype(c.dtype),
                                                                  cache.length, axis=1)
        slot["k"], slot["v"] = write(cache.k[i], k), write(cache.v[i], v)
        return attend(q, slot["k"].astype(q.dtype), slot["v"].astype(q.dtype), visible)

      x, ids = layer(x, attention_fn, layer.commit_layer_scalar,
                     None if routes is None else routes[i])
      new_k.append(slot["k"])
      new_v.append(slot["v"])
      taken.append(ids)
    new_cache = KVCache(tuple(new_k), tuple(new_v), slot_valid, cache.length + t)
    return CommitOutput(self.final_norm(x), new_cache, jnp.stack(taken))

  def decode_forward(self, canvas, cache: KVCache, z=None, routes=None) -> DecoderOutput:
    """One denoising forward of the canvas [B, C] over the read-only cache. z: [B, C, D]
    self-conditioning soft embedding (None: zeros, a canvas's first step)."""
    b, c = canvas.shape
    positions = cache.length + jnp.arange(c, dtype=jnp.int32)
    embeds = self.embed_tokens(canvas)
    z = jnp.zeros_like(embeds) if z is None else z.astype(embeds.dtype)
    x = self.self_conditioning(embeds, z)
    taken = []
    for i, layer in enumerate(self.layers):
      visible = decode_visibility(self.cfg, layer.attn.spec, cache, c)

      def attention_fn(h, i=i, layer=layer, visible=visible):
        q, k, v = layer.attn.project(h, positions)
        keys = jnp.concatenate([cache.k[i].astype(q.dtype), k], axis=1)
        values = jnp.concatenate([cache.v[i].astype(q.dtype), v], axis=1)
        return attend(q, keys, values, visible)

      x, ids = layer(x, attention_fn, layer.layer_scalar, None if routes is None else routes[i])
      taken.append(ids)
    return DecoderOutput(self.head(self.final_norm(x)), jnp.stack(taken))

  def hidden_states(self, tokens, positions, meta: TokenMeta, *, residual: Residual | None = None,
                    routes=None, mesh=None):
    """The packed replay forward -> (final-normed hidden [R, T, D], None, residual norm ratio).

    tokens, positions: [R, T]; meta: staircase metadata with `block = position` on context
    tokens and the canvas's first position on state tokens; residual.z [R, T, D] the captured
    self-conditioning input of each state token; routes [L, R, T, K] or None. The norm ratio
    is ‖MLP(pre_norm(z))‖ / ‖E[x]·√D‖ over state tokens whose z is not zero
    (docs/method.md#the-residual-pathway)."""
    cfg = self.cfg
    is_state = meta.kind == KIND_STATE
    embeds = self.embed_tokens(tokens)
    z = (jnp.zeros_like(embeds) if residual is None else residual.z.astype(embeds.dtype))
    delta = self.self_conditioning.delta(z)
    conditioned = rms_normalize(embeds + delta, cfg.norm_eps)
    x = jnp.where(is_state[..., None], conditioned, embeds)
    norm = lambda a: jnp.linalg.norm(a.astype(jnp.float32), axis=-1)
    carrying = is_state & jnp.any(z != 0, axis=-1)
    norm_ratio = (jnp.sum(jnp.where(carrying, norm(delta) / jnp.maximum(norm(embeds), 1e-12), 0))
                  / jnp.maximum(jnp.sum(carrying), 1))
    b, t = tokens.shape
    mesh = mesh or self.mesh
    for i, layer in enumerate(self.layers):
      window = cfg.sliding_window if layer.attn.spec.sliding else 0

      def run(layer_state, x, layer_routes, graph=nnx.graphdef(layer), window=window):
        layer = nnx.merge(graph, layer_state)

        def attention_fn(h):
          q, k, v = layer.attn.project(h, positions)
          out = staircase_attention(q, k, v, meta, meta, impl=cfg.attention_impl, scale=1.0,
                                    mesh=mesh, window=window)
          return out.reshape(b, t, -1)

        scalar = jnp.where(is_state[..., None], layer.layer_scalar[...],
                           layer.commit_layer_scalar[...])
        return layer(x, attention_fn, scalar, layer_routes)[0]
      # functional (split state in, nothing written back), as the block-diffusion transformer:
      # the frozen reference of the KL anchor is built outside the gradient's trace
      run = layer_checkpoint(run) if cfg.remat else run
      x = run(nnx.state(layer), x, None if routes is None else routes[i])
    return self.final_norm(x), None, norm_ratio
