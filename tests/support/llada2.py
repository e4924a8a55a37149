"""LLaDA2.x-mini helpers of the tests: an independent float64 numpy forward
(docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm) written from the architecture description over
the *official* HF tensor names (fused `query_key_value`, per-expert weights,
`mlp.gate.expert_bias`), so it shares nothing with the JAX model but the weights; random flat params
and a model holding them; a tiny random LLaDA2 HF directory."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from orl_jax.data.hf_tokenizer import byte_level_tokenizer
from orl_jax.models.moe import MoEConfig
from orl_jax.models.transformer import ModelConfig, Transformer
from orl_jax.sharding import path_name

ROUTER_MARGIN = 1e-4   # f32 vs f64 router scores differ by ~1e-7; choices closer than this are ties


# ----------------------------------------------------------------------------- numpy reference


def _rms(x, w, eps):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _swiglu(x, gate_w, up_w, down_w):          # PyTorch [out, in] weights
  g = x @ gate_w.T
  return ((g / (1.0 + np.exp(-g))) * (x @ up_w.T)) @ down_w.T


def _rotate_half(x):
  half = x.shape[-1] // 2
  return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _partial_rope(x, positions, theta, fraction):
  """x: [T, H, Dh]. RoPE with rotate_half on the first fraction·Dh dims, the rest untouched."""
  rot = int(x.shape[-1] * fraction)
  inv_freq = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
  freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]        # [T, rot/2]
  emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :]                 # [T, 1, rot]
  x_rot, x_pass = x[..., :rot], x[..., rot:]
  return np.concatenate([x_rot * np.cos(emb) + _rotate_half(x_rot) * np.sin(emb), x_pass], -1)


def reference_route(x, gate_w, expert_bias, moe):
  """x: [T, D] -> (ids [T, K], weights [T, K], margin): sigmoid scores, bias for selection,
  groups by the sum of their top-2 biased scores, top-k inside kept groups, weights from the
  unbiased scores normalised and scaled. `margin` is the smallest gap at a selection boundary."""
  scores = 1.0 / (1.0 + np.exp(-(x @ gate_w.T)))
  biased = scores + expert_bias
  t, e = scores.shape
  per = e // moe.n_group
  ids = np.zeros((t, moe.top_k), np.int64)
  weights = np.zeros((t, moe.top_k))
  margin = np.inf
  for i in range(t):
    group_score = np.array([np.sum(np.sort(biased[i, g * per:(g + 1) * per])[-2:])
                            for g in range(moe.n_group)])
    order = np.argsort(-group_score)
    kept = order[:moe.topk_group]
    if moe.topk_group < moe.n_group:
      last_kept, first_dropped = order[moe.topk_group - 1], order[moe.topk_group]
      margin = min(margin, group_score[last_kept] - group_score[first_dropped])
    candidates = np.concatenate([np.arange(g * per, (g + 1) * per) for g in kept])
    ranked = candidates[np.argsort(-biased[i, candidates])]
    if len(ranked) > moe.top_k:
      margin = min(margin, biased[i, ranked[moe.top_k - 1]] - biased[i, ranked[moe.top_k]])
    ids[i] = ranked[:moe.top_k]
    chosen = scores[i, ids[i]]
    weights[i] = chosen / (chosen.sum() + 1e-20) * moe.routed_scaling_factor
  return ids, weights, margin


def reference_forward(t: dict, hf: dict, tokens, block_size):
  """float64 LLaDA2 forward of one sequence over official tensors `t` and config.json `hf`,
  block-causal (bidirectional inside a block). Returns (logits [T, V], per-MoE-layer ids,
  smallest router margin)."""
  t = {k: np.asarray(v, np.float64) for k, v in t.items()}
  eps, h_q, h_kv = hf["rms_norm_eps"], hf["num_attention_heads"], hf["num_key_value_heads"]
  dh = hf["head_dim"]
  n = len(tokens)
  pos = np.arange(n)
  visible = (pos[None, :] // block_size) <= (pos[:, None] // block_size)   # [q, k]
  x = t["model.word_embeddings.weight"][tokens]
  routes, margin = [], np.inf
  for i in range(hf["num_hidden_layers"]):
    p = f"model.layers.{i}."
    a = _rms(x, t[p + "input_layernorm.weight"], eps)
    qkv = (a @ t[p + "attention.query_key_value.weight"].T).reshape(n, h_q + 2 * h_kv, dh)
    q, k, v = qkv[:, :h_q], qkv[:, h_q:h_q + h_kv], qkv[:, h_q + h_kv:]
    q = _rms(q, t[p + "attention.query_layernorm.weight"], eps)
    k = _rms(k, t[p + "attention.key_layernorm.weight"], eps)
    q = _partial_rope(q, pos, hf["rope_theta"], hf["partial_rotary_factor"])
    k = _partial_rope(k, pos, hf["rope_theta"], hf["partial_rotary_factor"])
    heads = []
    for h in range(h_q):
      kv = h // (h_q // h_kv)
      s = q[:, h] @ k[:, kv].T / np.sqrt(dh)
      s = np.where(visible, s, -np.inf)
      w = np.exp(s - s.max(-1, keepdims=True))
      heads.append((w / w.sum(-1, keepdims=True)) @ v[:, kv])
    x = x + np.concatenate(heads, axis=-1) @ t[p + "attention.dense.weight"].T
    m = _rms(x, t[p + "post_attention_layernorm.weight"], eps)
    if i < hf["first_k_dense_replace"]:
      x = x + _swiglu(m, *(t[p + f"mlp.{w}.weight"] for w in ("gate_proj", "up_proj", "down_proj")))
      continue
    moe = MoEConfig(n_experts=hf["num_experts"], top_k=hf["num_experts_per_tok"],
                    expert_dim=hf["moe_intermediate_size"], n_group=hf["n_group"],
                    topk_group=hf["topk_group"],
                    routed_scaling_factor=hf["routed_scaling_factor"])
    ids, weights, layer_margin = reference_route(m, t[p + "mlp.gate.weight"],
                                                 t[p + "mlp.gate.expert_bias"], moe)
    routes.append(ids)
    margin = min(margin, layer_margin)
    y = _swiglu(m, *(t[p + f"mlp.shared_experts.{w}.weight"]
                     for w in ("gate_proj", "up_proj", "down_proj")))
    for tok in range(n):
      for slot in range(moe.top_k):
        e = ids[tok, slot]
        y[tok] += weights[tok, slot] * _swiglu(
            m[tok:tok + 1], *(t[p + f"mlp.experts.{e}.{w}.weight"]
                              for w in ("gate_proj", "up_proj", "down_proj")))[0]
    x = x + y
  x = _rms(x, t["model.norm.weight"], eps)
  head = t["lm_head.weight"]
  if hf.get("norm_head"):
    head = head / np.linalg.norm(head, axis=-1, keepdims=True)
  return x @ head.T, routes, margin


# ----------------------------------------------------------------------------- random models


def random_flat_params(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
  """Our flat params with every tensor random (norm weights around 1, expert biases large
  enough to change selections)."""
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  flat = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param)):
    name = path_name(path)
    if name.endswith("norm.weight"):
      x = 1.0 + 0.2 * rng.standard_normal(leaf.shape)
    elif name.endswith("expert_bias"):
      x = 0.3 * rng.standard_normal(leaf.shape)
    else:
      fan_in = leaf.shape[-2] if len(leaf.shape) > 1 else 1
      x = rng.standard_normal(leaf.shape) / np.sqrt(fan_in)
      if name == "embed.embedding":
        x = rng.standard_normal(leaf.shape)
    flat[name] = x.astype(np.float32)
  return flat


def build_model(cfg: ModelConfig, flat: dict[str, np.ndarray]) -> Transformer:
  """A model holding `flat` (built abstractly: eager initialisation compiles every op)."""
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  params = jax.tree_util.tree_map_with_path(lambda p, _: jnp.asarray(flat[path_name(p)]), params)
  return nnx.merge(graphdef, params)


# ----------------------------------------------------------------------------- LLaDA2 directory

LLADA2_MOE = MoEConfig(n_experts=8, top_k=2, expert_dim=12, n_group=2, topk_group=1,
                       n_shared=1, routed_scaling_factor=2.5, impl="dense")
LLADA2 = ModelConfig(vocab_size=300, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2,
                     head_dim=8, mlp_dim=40, mask_id=257, rope_theta=6e5, rope_fraction=0.5,
                     qk_norm=True, moe=LLADA2_MOE, first_k_dense=1, hf_family="llada2_moe")


def write_llada2_dir(path: str, seed: int = 0, n_layers: int = 3) -> dict:
  """A random tiny LLaDA2 HF directory written with the official names (PyTorch
  [out, in] shapes, fused Q|K|V rows, per-expert tensors) and the byte-level tokenizer."""
  rng = np.random.default_rng(seed)
  d, hq, hkv, dh, f, e, fe, v = 32, 4, 2, 8, 40, 8, 12, 300
  w = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)
  t = {"model.word_embeddings.weight": w(v, d), "model.norm.weight": 1 + w(d),
       "lm_head.weight": w(v, d)}
  for i in range(n_layers):
    p = f"model.layers.{i}."
    t.update({p + "input_layernorm.weight": 1 + w(d),
              p + "post_attention_layernorm.weight": 1 + w(d),
              p + "attention.query_key_value.weight": w((hq + 2 * hkv) * dh, d),
              p + "attention.query_layernorm.weight": 1 + w(dh),
              p + "attention.key_layernorm.weight": 1 + w(dh),
              p + "attention.dense.weight": w(d, hq * dh)})
    if i == 0:
      t.update({p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
                p + "mlp.down_proj.weight": w(d, f)})
      continue
    t.update({p + "mlp.gate.weight": w(e, d), p + "mlp.gate.expert_bias": w(e)})
    for x in range(e):
      t.update({p + f"mlp.experts.{x}.gate_proj.weight": w(fe, d),
                p + f"mlp.experts.{x}.up_proj.weight": w(fe, d),
                p + f"mlp.experts.{x}.down_proj.weight": w(d, fe)})
    t.update({p + "mlp.shared_experts.gate_proj.weight": w(fe, d),
              p + "mlp.shared_experts.up_proj.weight": w(fe, d),
              p + "mlp.shared_experts.down_proj.weight": w(d, fe)})
  os.makedirs(path, exist_ok=True)
  save_file(t, os.path.join(path, "model.safetensors"))
  tok = byte_level_tokenizer()
  tok.backend.save(os.path.join(path, "tokenizer.json"))
  config = {"model_type": "llada2_moe", "vocab_size": v, "hidden_size": d,
            "intermediate_size": f, "num_hidden_layers": n_layers, "num_attention_heads": hq,
            "num_key_value_heads": hkv, "head_dim": dh, "rope_theta": 600000.0,
            "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-6, "use_qk_norm": True,
            "use_qkv_bias": False, "use_bias": False, "tie_word_embeddings": False,
            "norm_head": False, "num_experts": e, "num_experts_per_tok": 2,
            "moe_intermediate_size": fe, "n_group": 2, "topk_group": 1, "num_shared_experts": 1,
            "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "score_function": "sigmoid",
            "mask_token_id": tok.mask_id}
  with open(os.path.join(path, "config.json"), "w") as fh:
    json.dump(config, fh)
  return t
