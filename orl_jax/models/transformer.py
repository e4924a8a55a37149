"""One NNX transformer for every DLM family (docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm).

Switches: GQA, optional per-head q/k RMSNorm before RoPE (Qwen3, LLaDA2), partial RoPE, tied or
untied head (L2-normalised rows with `norm_head`), embedding scale, residual pathway mode, and a
mixture-of-experts feed-forward after the first `first_k_dense` layers (`moe`, LLaDA2; routes
can be captured and given back for exact replay, see `orl_jax.models.moe`). Attention always
goes through the staircase dispatch with per-token metadata, so training rows, KV-cache decoding
and bidirectional canvases share one code path.

Cache protocol (`cache_mode`):
* ``None``    — self-attention among the given tokens (q_meta == k_meta).
* ``"read"``  — keys are the cache followed by the tokens' own keys; the cache is unchanged
               (a denoising step of the active block).
* ``"write"`` — the tokens' keys are written into the cache at `cache_offset`, then the tokens
               attend to the whole cache (prompt prefill; the commit forward of a finished block).
               `cache_offset` is one offset for every row, or one per row ([B] int32: rows of a
               continuous batch write at their own blocks, `orl_jax.decode.per_row`).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax import residual as residual_lib
from orl_jax.models.moe import MoE, MoEConfig
from orl_jax.models.remat import layer_checkpoint
from orl_jax.residual import Residual, ResidualAdapter, RMSNorm
from pallas_kernels.staircase_attention import KIND_PAD, TokenMeta, attention


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_dim: int
  mask_id: int
  qk_norm: bool                     # RMSNorm on each query and key head (the run config's
                                    # `model.qk_norm`, or config.json's family layout)
  rope_theta: float = 10000.0
  rope_fraction: float = 1.0        # share of head_dim that is rotated (LLaDA2: 0.5)
  norm_eps: float = 1e-6
  tie_embeddings: bool = False
  embed_scale: float = 1.0
  attention: str = "block_causal"   # attention layout: block_causal | bidirectional
  hf_family: str = ""               # registry family (orl_jax.models.families); "" = ours (tiny)
  dtype: str = "float32"            # compute dtype
  param_dtype: str = "float32"
  attention_impl: str = "auto"
  residual_mode: str = "none"       # none | rcd | adapter
  residual_hidden: int = 0          # adapter width F_r (0 -> d_model)
  residual_scale: float = 1.0
  residual_temperature: float = 1.0
  moe: MoEConfig | None = None      # MoE feed-forward on layers >= first_k_dense (LLaDA2)
  first_k_dense: int = 0            # leading dense-MLP layers (HF first_k_dense_replace)
  norm_head: bool = False           # L2-normalise each vocabulary row of the head (LLaDA2)
  remat: bool = False               # recompute each layer in the backward pass (keeps only
                                    # layer inputs alive: replay rows of real models fit HBM)

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  def is_moe_layer(self, i: int) -> bool:
    return self.moe is not None and i >= self.first_k_dense

  @property
  def n_moe_layers(self) -> int:
    return sum(self.is_moe_layer(i) for i in range(self.n_layers))


class KVCache(NamedTuple):
  k: jax.Array      # [L, B, Tc, Hkv, Dh]
  v: jax.Array      # [L, B, Tc, Hkv, Dh]
  meta: TokenMeta   # [B, Tc] metadata of what is stored (KIND_PAD where nothing is)


def init_cache(cfg: ModelConfig, batch: int, length: int) -> KVCache:
  shape = (cfg.n_layers, batch, length, cfg.n_kv_heads, cfg.head_dim)
  zeros = jnp.zeros((batch, length), jnp.int32)
  meta = TokenMeta(segment=zeros, response=zeros - 1, kind=zeros + KIND_PAD, block=zeros,
                   state_id=zeros - 1)
  return KVCache(jnp.zeros(shape, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype), meta)


def write_at(cache, new, offset):
  """`cache` [B, Tc, ...] with `new` [B, T, ...] written at `offset` along axis 1: a scalar
  offset for every row, or one offset per row ([B])."""
  new = new.astype(cache.dtype)
  if jnp.ndim(offset) == 0:
    return jax.lax.dynamic_update_slice_in_dim(cache, new, offset, axis=1)
  row_write = lambda c, n, o: jax.lax.dynamic_update_slice_in_dim(c, n, o, axis=0)
  return jax.vmap(row_write)(cache, new, offset)


def take_span(x, start, length: int):
  """x [B, T, ...] -> [B, length, ...] from `start` along axis 1: one start for every row, or
  one per row ([B])."""
  if jnp.ndim(start) == 0:
    return jax.lax.dynamic_slice_in_dim(x, start, length, axis=1)
  return jax.vmap(lambda r, s: jax.lax.dynamic_slice_in_dim(r, s, length, axis=0))(x, start)


def apply_rope(x, positions, theta: float, fraction: float = 1.0):
  """Half-split (non-interleaved) RoPE in f32. x: [B, T, H, Dh]; positions: [B, T]."""
  dh = x.shape[-1]
  rot = int(dh * fraction) // 2 * 2
  half = rot // 2
  freqs = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2.0 / rot))
  angles = positions.astype(jnp.float32)[..., None] * freqs        # [B, T, half]
  cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
  xf = x.astype(jnp.float32)
  x1, x2, rest = xf[..., :half], xf[..., half:rot], xf[..., rot:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
  return out.astype(x.dtype)


def _linear(cfg: ModelConfig, i: int, o: int, rngs: nnx.Rngs, **kw):
  return nnx.Linear(i, o, use_bias=False, dtype=cfg.compute_dtype,
                    param_dtype=jnp.dtype(cfg.param_dtype), rngs=rngs, **kw)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, mesh=None):
    self.cfg = cfg
    # kernels run per device inside shard_map over its batch axes
    # (docs/scaling.md#attention-kernels-and-accelerators)
    self.mesh = mesh
    self.q_proj = _linear(cfg, cfg.d_model, cfg.n_heads * cfg.head_dim, rngs)
    self.k_proj = _linear(cfg, cfg.d_model, cfg.n_kv_heads * cfg.head_dim, rngs)
    self.v_proj = _linear(cfg, cfg.d_model, cfg.n_kv_heads * cfg.head_dim, rngs)
    self.o_proj = _linear(cfg, cfg.n_heads * cfg.head_dim, cfg.d_model, rngs)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))
      self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, param_dtype=jnp.dtype(cfg.param_dtype))

  def __call__(self, x, positions, meta: TokenMeta, layer_cache, cache_meta, cache_mode,
               cache_offset, keep=None):
    """keep: (start, length) or None: queries (and so outputs) only at those positions; the
    keys and values, and what a "write" stores, still cover every token."""
    cfg = self.cfg
    b, t, _ = x.shape
    k = self.k_proj(x).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
    v = self.v_proj(x).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
    q_x, q_pos, q_meta = x, positions, meta
    if keep is not None:
      q_x, q_pos = take_span(x, *keep), take_span(positions, *keep)
      q_meta = TokenMeta(*(take_span(f, *keep) for f in meta))
    q = self.q_proj(q_x).reshape(b, q_x.shape[1], cfg.n_heads, cfg.head_dim)
    if cfg.qk_norm:  # Qwen3: per-head norm before RoPE
      q, k = self.q_norm(q), self.k_norm(k)
    q = apply_rope(q, q_pos, cfg.rope_theta, cfg.rope_fraction)
    k = apply_rope(k, positions, cfg.rope_theta, cfg.rope_fraction)
    new_cache = layer_cache
    if cache_mode is None:
      keys, values, k_meta = k, v, meta
    elif cache_mode == "read":
      ck, cv = layer_cache
      keys = jnp.concatenate([ck, k.astype(ck.dtype)], axis=1)
      values = jnp.concatenate([cv, v.astype(cv.dtype)], axis=1)
      k_meta = cache_meta.concat(meta)
    elif cache_mode == "write":
      ck, cv = layer_cache
      keys, values = write_at(ck, k, cache_offset), write_at(cv, v, cache_offset)
      k_meta = cache_meta  # already updated by the caller
      new_cache = (keys, values)
    else:
      raise ValueError(f"unknown cache_mode {cache_mode!r}")
    out = attention(q, keys.astype(q.dtype), values.astype(q.dtype), q_meta, k_meta,
                    impl=cfg.attention_impl, mesh=self.mesh)
    return self.o_proj(out.reshape(b, q.shape[1], cfg.n_heads * cfg.head_dim)), new_cache


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, width: int | None = None):
    width = width or cfg.mlp_dim
    self.gate_proj = _linear(cfg, cfg.d_model, width, rngs)
    self.up_proj = _linear(cfg, cfg.d_model, width, rngs)
    self.down_proj = _linear(cfg, width, cfg.d_model, rngs)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, mesh=None, layer_index: int = 0):
    pd = jnp.dtype(cfg.param_dtype)
    self.input_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd)
    self.attn = Attention(cfg, rngs, mesh)
    self.post_attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd)
    self.is_moe = cfg.is_moe_layer(layer_index)
    self.mlp: MoE | MLP
    if self.is_moe:
      moe = cfg.moe
      assert moe is not None, "is_moe_layer is False without cfg.moe"
      shared = MLP(cfg, rngs, moe.n_shared * moe.expert_dim) if moe.n_shared else None
      self.mlp = MoE(moe, cfg.d_model, dtype=cfg.compute_dtype, param_dtype=pd,
                     shared_experts=shared, rngs=rngs)
    else:
      self.mlp = MLP(cfg, rngs)

  def __call__(self, x, positions, meta, layer_cache, cache_meta, cache_mode, cache_offset,
               routes=None, keep=None):
    """-> (x, new layer cache, MoEOutput of an MoE layer or None). keep: (start, length): x
    only at those positions comes out (a dense layer's; see `Attention`)."""
    h, new_cache = self.attn(self.input_norm(x), positions, meta, layer_cache, cache_meta,
                             cache_mode, cache_offset, keep)
    if keep is not None:
      if self.is_moe:
        raise ValueError("keep= runs a dense last layer on part of the tokens; MoE layers "
                         "route every token")
      x = take_span(x, *keep)
    x = x + h
    if not self.is_moe:
      return x + self.mlp(self.post_attn_norm(x)), new_cache, None
    moe_out = self.mlp(self.post_attn_norm(x), routes)
    return x + moe_out.y, new_cache, moe_out


class Routing(NamedTuple):
  """What the MoE layers did in one forward (None for dense models)."""
  expert_ids: jax.Array   # [L_moe, B, T, K] int32 routes taken; give back as `routes` to replay


class ForwardOutput(NamedTuple):
  logits: jax.Array               # [B, T, V] f32
  cache: KVCache | None
  residual_norm_ratio: jax.Array  # scalar, docs/method.md#the-residual-pathway metric
  routing: Routing | None = None


class Transformer(nnx.Module):
  """Decoder stack with the residual pathway on its input embeddings.

  `mesh` (optional): the device mesh the model runs on; attention kernels then run inside
  `shard_map` over its batch axes instead of having XLA gather their operands.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, mesh=None):
    self.cfg = cfg
    pd = jnp.dtype(cfg.param_dtype)
    self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=cfg.compute_dtype, param_dtype=pd,
                           embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.layers = nnx.List([Block(cfg, rngs, mesh, i) for i in range(cfg.n_layers)])
    self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps, param_dtype=pd)
    if not cfg.tie_embeddings:
      self.lm_head = _linear(cfg, cfg.d_model, cfg.vocab_size, rngs)
    if cfg.residual_mode not in residual_lib.MODES:
      raise ValueError(f"model.residual.mode must be one of {residual_lib.MODES}, "
                       f"got {cfg.residual_mode!r}")
    if cfg.residual_mode == "adapter":
      self.adapter = ResidualAdapter(cfg.d_model, cfg.residual_hidden or cfg.d_model, cfg.norm_eps,
                                     dtype=cfg.compute_dtype, param_dtype=pd, rngs=rngs)

  @property
  def embedding_table(self) -> jax.Array:
    """[V, D] input embedding table (unscaled)."""
    return self.embed.embedding[...]

  def embed_inputs(self, tokens, residual: Residual | None):
    cfg = self.cfg
    embeds = self.embed(tokens) * jnp.asarray(cfg.embed_scale, cfg.compute_dtype)
    mask_embed = (self.embedding_table[cfg.mask_id] * cfg.embed_scale).astype(cfg.compute_dtype)
    return residual_lib.residual_inputs(
        cfg.residual_mode, embeds, mask_embed, tokens == cfg.mask_id, residual,
        getattr(self, "adapter", None), cfg.residual_scale)

  def head(self, x):
    if self.cfg.tie_embeddings:
      return jnp.einsum("btd,vd->btv", x, self.embedding_table.astype(x.dtype),
                        preferred_element_type=jnp.float32)
    if self.cfg.norm_head:  # F.normalize of each [D] vocabulary row
      kernel = self.lm_head.kernel[...].astype(jnp.float32)
      kernel = kernel / jnp.maximum(jnp.linalg.norm(kernel, axis=0, keepdims=True), 1e-12)
      return jnp.einsum("btd,dv->btv", x, kernel.astype(x.dtype),
                        preferred_element_type=jnp.float32)
    return self.lm_head(x).astype(jnp.float32)

  def hidden_states(self, tokens, positions, meta: TokenMeta, *, residual: Residual | None = None,
                    cache: KVCache | None = None, cache_mode: str | None = None,
                    cache_offset=0, routes=None, keep=None):
    """Final-normed hidden states [B, T, D] (logits are `head(...)` of these; the chunked
    large-vocabulary losses call this to avoid materialising [B, T, V]). keep: see
    `hidden_states_and_routing`."""
    h, new_cache, norm_ratio, _ = self.hidden_states_and_routing(
        tokens, positions, meta, residual=residual, cache=cache, cache_mode=cache_mode,
        cache_offset=cache_offset, routes=routes, keep=keep)
    return h, new_cache, norm_ratio

  def hidden_states_and_routing(self, tokens, positions, meta: TokenMeta, *,
                                residual: Residual | None = None, cache: KVCache | None = None,
                                cache_mode: str | None = None, cache_offset=0, routes=None,
                                keep=None):
    """`hidden_states` plus the `Routing` of the MoE layers (None for a dense model).
    routes: [L_moe, B, T, K] int32 expert ids to reuse (a token whose first id is -1 is routed
    afresh), or None to route every token. keep: (start, length) -> hidden states [B, length,
    D] of those positions only (start: scalar or [B]); a dense last layer then runs its
    queries, output projection and MLP on them alone (every layer's keys and values, and any
    cache written, still cover all tokens); an MoE last layer runs on every token."""
    x, norm_ratio = self.embed_inputs(tokens, residual)
    cache_meta = None
    if cache is not None:
      cache_meta = cache.meta
      if cache_mode == "write":
        cache_meta = TokenMeta(*(write_at(c, m, cache_offset) for c, m in zip(cache.meta, meta)))
    new_k, new_v = [], []
    taken: list[jax.Array] = []
    last = len(self.layers) - 1
    for i, layer in enumerate(self.layers):
      layer_cache = None if cache is None else (cache.k[i], cache.v[i])
      layer_routes = None if routes is None or not layer.is_moe else routes[len(taken)]
      layer_keep = keep if i == last and not layer.is_moe else None

      def run(layer_state, x, layer_cache, layer_routes, graph=nnx.graphdef(layer),
              keep=layer_keep):
        return nnx.merge(graph, layer_state)(x, positions, meta, layer_cache, cache_meta,
                                             cache_mode, cache_offset, layer_routes, keep)
      # functional (split state in, nothing written back): the frozen reference model of the
      # KL anchor is built outside the gradient's trace and must not be updated from it
      run = layer_checkpoint(run) if self.cfg.remat else run
      x, layer_cache, moe_out = run(nnx.state(layer), x, layer_cache, layer_routes)
      if moe_out is not None:
        taken.append(moe_out.expert_ids)
      if cache_mode == "write":
        new_k.append(layer_cache[0])
        new_v.append(layer_cache[1])
    new_cache = cache
    if cache_mode == "write":
      assert cache_meta is not None, "a write without a cache fails in the layers"
      new_cache = KVCache(jnp.stack(new_k), jnp.stack(new_v), cache_meta)
    routing = Routing(jnp.stack(taken)) if taken else None
    if keep is not None and self.layers[last].is_moe:
      x = take_span(x, *keep)
    return self.final_norm(x), new_cache, norm_ratio, routing

  def __call__(self, tokens, positions, meta: TokenMeta, *, residual: Residual | None = None,
               cache: KVCache | None = None, cache_mode: str | None = None,
               cache_offset=0, routes=None) -> ForwardOutput:
    h, new_cache, norm_ratio, routing = self.hidden_states_and_routing(
        tokens, positions, meta, residual=residual, cache=cache, cache_mode=cache_mode,
        cache_offset=cache_offset, routes=routes)
    return ForwardOutput(self.head(h), new_cache, norm_ratio, routing)


def count_params(model: nnx.Module) -> int:
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
