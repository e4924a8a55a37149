"""LLaDA2.x-mini (`model_type: llada2_moe`, DESIGN §4): HF config and tensor names <-> ours.

The architecture itself is the shared `Transformer` with switches (per-head q/k RMSNorm before a
partial RoPE, untied head, `norm_head`, dense first layers, `moe` feed-forward). Two layout
choices live here, in the name map, not in the model:

* the fused `attention.query_key_value` ([(H + 2·Hkv)·Dh, D], rows Q | K | V) is split into our
  `q_proj`, `k_proj`, `v_proj` kernels on load and concatenated on export — one matmul or three
  is the same function, and separate kernels keep the `tensor`-axis partition rules of the other
  families (a fused output dimension split over devices would cut across Q/K/V);
* the per-expert `mlp.experts.{e}.{gate,up,down}_proj` are stacked into `[E, in, out]` arrays
  (the layout `ragged_dot` and the `expert` mesh axis want).

`params_from_hf` / `params_to_hf` are pure functions over flat dicts of numpy arrays (our
dot-joined names as in `orl_jax.sharding.path_name`), ready for a family registry.
"""
from __future__ import annotations

import numpy as np

from orl_jax.models.moe import MoEConfig
from orl_jax.models.transformer import ModelConfig

MODEL_TYPE = "llada2_moe"
MASK_ID = 156895
EOS_ID = 156892


def architecture_from_hf(hf: dict, *, impl: str = "dense") -> dict:
  """The ModelConfig fields a LLaDA2 `config.json` determines (field -> value); `impl` picks the
  expert compute (`model.moe.impl`), which config.json does not say."""
  for flag in ("use_qkv_bias", "use_bias"):
    if hf.get(flag, False):
      raise ValueError(f"config.json sets {flag}=true: LLaDA2 projections with biases are not "
                       "supported (the released LLaDA2.x-mini checkpoints have none)")
  heads = hf["num_attention_heads"]
  head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
  moe = MoEConfig(n_experts=hf["num_experts"], top_k=hf["num_experts_per_tok"],
                  expert_dim=hf["moe_intermediate_size"], n_group=hf.get("n_group") or 1,
                  topk_group=hf.get("topk_group") or 1,
                  n_shared=hf.get("num_shared_experts") or 0,
                  routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)), impl=impl)
  return dict(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
              n_layers=hf["num_hidden_layers"], n_heads=heads,
              n_kv_heads=hf.get("num_key_value_heads") or heads, head_dim=head_dim,
              mlp_dim=hf["intermediate_size"], rope_theta=float(hf.get("rope_theta", 6e5)),
              rope_fraction=float(hf.get("partial_rotary_factor", 0.5)),
              norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
              qk_norm=bool(hf.get("use_qk_norm", True)),
              tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
              moe=moe, first_k_dense=int(hf.get("first_k_dense_replace", 0)),
              norm_head=bool(hf.get("norm_head", False)))


def hf_config_json(cfg: ModelConfig) -> dict:
  """A LLaDA2 `config.json` for `cfg` (`architecture_from_hf` inverts it)."""
  moe = cfg.moe
  return {"architectures": ["LLaDA2MoeModelLM"], "model_type": MODEL_TYPE,
          "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
          "intermediate_size": cfg.mlp_dim, "num_hidden_layers": cfg.n_layers,
          "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
          "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta,
          "partial_rotary_factor": cfg.rope_fraction, "rms_norm_eps": cfg.norm_eps,
          "use_qk_norm": cfg.qk_norm, "use_qkv_bias": False, "use_bias": False,
          "tie_word_embeddings": cfg.tie_embeddings, "norm_head": cfg.norm_head,
          "num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k,
          "moe_intermediate_size": moe.expert_dim, "n_group": moe.n_group,
          "topk_group": moe.topk_group, "num_shared_experts": moe.n_shared,
          "routed_scaling_factor": moe.routed_scaling_factor,
          "first_k_dense_replace": cfg.first_k_dense, "score_function": "sigmoid",
          "hidden_act": "silu", "mask_token_id": cfg.mask_id}


def _layer_pairs(cfg: ModelConfig, i: int) -> list[tuple[str, str, bool]]:
  """(HF name, our name, transpose) of layer i's one-to-one tensors."""
  hf, ours = f"model.layers.{i}.", f"layers.{i}."
  pairs = [(hf + "input_layernorm.weight", ours + "input_norm.weight", False),
           (hf + "post_attention_layernorm.weight", ours + "post_attn_norm.weight", False),
           (hf + "attention.dense.weight", ours + "attn.o_proj.kernel", True)]
  if cfg.qk_norm:
    pairs += [(hf + "attention.query_layernorm.weight", ours + "attn.q_norm.weight", False),
              (hf + "attention.key_layernorm.weight", ours + "attn.k_norm.weight", False)]
  if not cfg.is_moe_layer(i):
    return pairs + [(hf + f"mlp.{p}.weight", ours + f"mlp.{p}.kernel", True)
                    for p in ("gate_proj", "up_proj", "down_proj")]
  pairs += [(hf + "mlp.gate.weight", ours + "mlp.router.kernel", True),
            (hf + "mlp.gate.expert_bias", ours + "mlp.router.expert_bias", False)]
  if cfg.moe.n_shared:
    pairs += [(hf + f"mlp.shared_experts.{p}.weight", ours + f"mlp.shared_experts.{p}.kernel",
               True) for p in ("gate_proj", "up_proj", "down_proj")]
  return pairs


def _global_pairs(cfg: ModelConfig) -> list[tuple[str, str, bool]]:
  pairs = [("model.word_embeddings.weight", "embed.embedding", False),
           ("model.norm.weight", "final_norm.weight", False)]
  if not cfg.tie_embeddings:
    pairs.append(("lm_head.weight", "lm_head.kernel", True))
  return pairs


def params_to_hf(flat: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Our flat params -> official LLaDA2 tensors (PyTorch [out, in] layout)."""
  out = {}
  for i in range(cfg.n_layers):
    for hf, ours, transpose in _layer_pairs(cfg, i):
      out[hf] = flat[ours].T if transpose else flat[ours]
    attn = f"layers.{i}.attn."
    out[f"model.layers.{i}.attention.query_key_value.weight"] = np.concatenate(
        [flat[attn + f"{p}.kernel"].T for p in ("q_proj", "k_proj", "v_proj")], axis=0)
    if cfg.is_moe_layer(i):
      for p in ("gate_proj", "up_proj", "down_proj"):
        stacked = flat[f"layers.{i}.mlp.{p}"]                       # [E, in, out]
        for e in range(cfg.moe.n_experts):
          out[f"model.layers.{i}.mlp.experts.{e}.{p}.weight"] = stacked[e].T
  for hf, ours, transpose in _global_pairs(cfg):
    out[hf] = flat[ours].T if transpose else flat[ours]
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def params_from_hf(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, np.ndarray]:
  """Official LLaDA2 tensors -> our flat params. Raises ValueError naming missing or unexpected
  tensors."""
  expected = set(params_to_hf_names(cfg))
  missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
  if missing or unexpected:
    raise ValueError(f"LLaDA2 tensors do not match the configured model: missing {missing[:8]}, "
                     f"unexpected {unexpected[:8]} (check the model.* shapes against "
                     "config.json)")
  flat = {}
  q_rows = cfg.n_heads * cfg.head_dim
  kv_rows = cfg.n_kv_heads * cfg.head_dim
  for i in range(cfg.n_layers):
    for hf, ours, transpose in _layer_pairs(cfg, i):
      flat[ours] = tensors[hf].T if transpose else tensors[hf]
    qkv = tensors[f"model.layers.{i}.attention.query_key_value.weight"]
    q, k, v = np.split(qkv, [q_rows, q_rows + kv_rows], axis=0)
    for p, w in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
      flat[f"layers.{i}.attn.{p}.kernel"] = w.T
    if cfg.is_moe_layer(i):
      for p in ("gate_proj", "up_proj", "down_proj"):
        flat[f"layers.{i}.mlp.{p}"] = np.stack(
            [tensors[f"model.layers.{i}.mlp.experts.{e}.{p}.weight"].T
             for e in range(cfg.moe.n_experts)])
  for hf, ours, transpose in _global_pairs(cfg):
    flat[ours] = tensors[hf].T if transpose else tensors[hf]
  return {k: np.ascontiguousarray(v) for k, v in flat.items()}


def params_to_hf_names(cfg: ModelConfig) -> list[str]:
  """Every official tensor name of a LLaDA2 model of `cfg`."""
  names = []
  for i in range(cfg.n_layers):
    names += [hf for hf, _, _ in _layer_pairs(cfg, i)]
    names.append(f"model.layers.{i}.attention.query_key_value.weight")
    if cfg.is_moe_layer(i):
      names += [f"model.layers.{i}.mlp.experts.{e}.{p}.weight"
                for e in range(cfg.moe.n_experts) for p in ("gate_proj", "up_proj", "down_proj")]
  return names + [hf for hf, _, _ in _global_pairs(cfg)]
