"""LLaDA2.x-mini (LLaDA2.0-mini / LLaDA2.1-mini), `model_type: llada2_moe` (DESIGN §4).

The architecture is the shared `Transformer` with switches (per-head q/k RMSNorm before a
partial RoPE, untied head, `norm_head`, dense first layers, `moe` feed-forward). Two layout
choices live in the name map, not in the model:

* the fused `attention.query_key_value` ([(H + 2·Hkv)·Dh, D], rows Q | K | V) is three row
  pieces of our `q_proj`, `k_proj`, `v_proj` kernels — one matmul or three is the same
  function, and separate kernels keep the `tensor`-axis partition rules of the other families
  (a fused output dimension split over devices would cut across Q/K/V);
* the per-expert `mlp.experts.{e}.{gate,up,down}_proj` are the slots of stacked `[E, in, out]`
  arrays (the layout `ragged_dot` and the `expert` mesh axis want).
"""
from __future__ import annotations

from orl_jax import sharding
from orl_jax.models import moe as moe_lib
from orl_jax.models.families import base
from orl_jax.models.families.base import Family, linear, plain
from orl_jax.models.moe import MoEConfig
from orl_jax.models.transformer import ModelConfig

MODEL_TYPE = "llada2_moe"
MASK_ID = 156895
EOS_ID = 156892
_SWIGLU = ("gate_proj", "up_proj", "down_proj")


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
              norm_head=bool(hf.get("norm_head", False)), family="block_causal")


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


def _attention_rules(cfg: ModelConfig, i: int) -> list:
  hf, ours = f"model.layers.{i}.attention.", f"layers.{i}.attn."
  q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
  bounds = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
  rules = [linear(hf + "query_key_value.weight", ours + f"{p}.kernel", rows=rows)
           for p, rows in bounds.items()]
  rules.append(linear(hf + "dense.weight", ours + "o_proj.kernel"))
  if cfg.qk_norm:
    rules += [plain(hf + "query_layernorm.weight", ours + "q_norm.weight"),
              plain(hf + "key_layernorm.weight", ours + "k_norm.weight")]
  return rules


def _mlp_rules(cfg: ModelConfig, i: int) -> list:
  hf, ours = f"model.layers.{i}.mlp.", f"layers.{i}.mlp."
  if not cfg.is_moe_layer(i):
    return [linear(hf + f"{p}.weight", ours + f"{p}.kernel") for p in _SWIGLU]
  rules = [linear(hf + "gate.weight", ours + "router.kernel"),
           plain(hf + "gate.expert_bias", ours + "router.expert_bias")]
  rules += [linear(hf + f"experts.{e}.{p}.weight", ours + p, expert=e)
            for p in _SWIGLU for e in range(cfg.moe.n_experts)]
  if cfg.moe.n_shared:
    rules += [linear(hf + f"shared_experts.{p}.weight", ours + f"shared_experts.{p}.kernel")
              for p in _SWIGLU]
  return rules


def tensor_rules(cfg: ModelConfig) -> list:
  rules = []
  for i in range(cfg.n_layers):
    hf, ours = f"model.layers.{i}.", f"layers.{i}."
    rules += [plain(hf + "input_layernorm.weight", ours + "input_norm.weight"),
              plain(hf + "post_attention_layernorm.weight", ours + "post_attn_norm.weight")]
    rules += _attention_rules(cfg, i) + _mlp_rules(cfg, i)
  rules += [plain("model.word_embeddings.weight", "embed.embedding"),
            plain("model.norm.weight", "final_norm.weight")]
  if not cfg.tie_embeddings:
    rules.append(linear("lm_head.weight", "lm_head.kernel"))
  return rules


def params_to_hf(flat: dict, cfg: ModelConfig) -> dict:
  """Our flat params -> official LLaDA2 tensors (PyTorch [out, in] layout)."""
  return base.params_to_hf(flat, tensor_rules(cfg))


def params_from_hf(tensors: dict, cfg: ModelConfig) -> dict:
  """Official LLaDA2 tensors -> our flat params; ValueError naming missing or unexpected
  tensors."""
  return base.params_from_hf(tensors, tensor_rules(cfg))


def params_to_hf_names(cfg: ModelConfig) -> list[str]:
  """Every official tensor name of a LLaDA2 model of `cfg`."""
  return sorted({r.hf for r in tensor_rules(cfg)})


FAMILY = Family(
    name=MODEL_TYPE, model_types=(MODEL_TYPE,), attention="block_causal",
    architecture_from_hf=architecture_from_hf, hf_config_json=hf_config_json,
    tensor_rules=tensor_rules,
    # experts over `expert` first (their names would otherwise match no rule)
    partition_rules=moe_lib.PARTITION_RULES + sharding.PARTITION_RULES,
    special_tokens=dict(mask=str(MASK_ID), eos=str(EOS_ID), pad=str(EOS_ID), bos=""),
    # block-causal, block 32, threshold 0.95 with at-least-one (the official default)
    # the official `generate`: blocks at absolute positions (the prompt's last block shared
    # with the first generated tokens), `confidence > threshold`
    decode=dict(block_size=32, rule="threshold", rule_value=0.95,
                block_placement="absolute", commit_compare=">"),
    # The chat template of LLaDA2.x is not in DESIGN §4 (its tokenizer's <role> markup); none
    # is built in: give prompts already formatted.
    chat="none")
