"""LLaDA2.x-mini (LLaDA2.0-mini / LLaDA2.1-mini), `model_type: llada2_moe`
(docs/models.md#moe-llada2x-mini).

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
from orl_jax.models import config_json
from orl_jax.models import family_base as base
from orl_jax.models.family_base import Family, linear, plain
from orl_jax.models.moe import MoEConfig
from orl_jax.models.transformer import ModelConfig

MODEL_TYPE = "llada2_moe"
MASK_ID = 156895
EOS_ID = 156892
_SWIGLU = ("gate_proj", "up_proj", "down_proj")


# LLaDA2MoeConfig's defaults (the official configuration_llada2_moe.py), for the keys this
# reader uses; `num_key_value_heads` 0 means one per query head (as the LLaDA2.1 class maps it;
# the 2.0 class keeps 0 and its model divides by it)
DEFAULTS = dict(vocab_size=30592, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                num_key_value_heads=0, use_qk_norm=True, rms_norm_eps=1e-5,
                tie_word_embeddings=False, rope_theta=10000.0, num_experts=16,
                num_shared_experts=0, num_experts_per_tok=2, n_group=8, topk_group=4,
                routed_scaling_factor=2.5, first_k_dense_replace=0, partial_rotary_factor=0.5)
# settings the official model reads that we implement with one value only: key -> (the
# official default, the supported values)
_FIXED = {"use_qkv_bias": (False, (False,)), "use_bias": (True, (False,)),
          "hidden_act": ("silu", ("silu",))}
# keys released config.json files carry that the official modeling code never reads
IGNORED_KEYS = ("norm_head", "score_function", "norm_topk_prob", "router_dtype",
                "moe_router_enable_expert_bias", "rotary_dim", "use_rmsnorm", "norm_softmax",
                "using_split_qkv_in_self_attention")


def _moe(hf: dict, impl: str) -> MoEConfig | None:
  """The MoE settings (None: `num_experts` null, every layer a dense MLP, as the official model
  builds it)."""
  read, dflt = config_json.read_int, DEFAULTS
  n = read(hf, "num_experts", dflt["num_experts"], nullable=True)
  if n is None:
    return None
  moe = MoEConfig(
      n_experts=n, top_k=read(hf, "num_experts_per_tok", dflt["num_experts_per_tok"]),
      expert_dim=read(hf, "moe_intermediate_size", None),
      n_group=read(hf, "n_group", dflt["n_group"]),
      topk_group=read(hf, "topk_group", dflt["topk_group"]),
      n_shared=read(hf, "num_shared_experts", dflt["num_shared_experts"], minimum=0,
                    nullable=True) or 0,
      routed_scaling_factor=config_json.read_float(hf, "routed_scaling_factor",
                                                   dflt["routed_scaling_factor"]),
      impl=impl)
  config_json.divides(moe.n_group, "n_group", n, "num_experts")
  if not moe.topk_group <= moe.n_group or not moe.top_k <= moe.topk_group * n // moe.n_group:
    raise config_json.ConfigJsonError(
        f"num_experts_per_tok={moe.top_k} and topk_group={moe.topk_group} cannot be chosen "
        f"from num_experts={n} in n_group={moe.n_group} groups")
  return moe


def architecture_from_hf(hf: dict, *, impl: str = "dense") -> dict:
  """The ModelConfig fields a LLaDA2 `config.json` determines (missing keys: LLaDA2MoeConfig's
  defaults; `norm_head` is ignored, as the official model ignores it); `impl` picks the expert
  compute (`model.moe.impl`), which config.json does not say. ConfigJsonError names a field of
  the wrong type or a setting the model does not implement."""
  config_json.require_all(hf, _FIXED, "the released LLaDA2.x-mini checkpoints")
  read, dflt = config_json.read_int, DEFAULTS
  d = read(hf, "hidden_size", dflt["hidden_size"])
  heads = read(hf, "num_attention_heads", dflt["num_attention_heads"])
  kv = read(hf, "num_key_value_heads", dflt["num_key_value_heads"], minimum=0,
            nullable=True) or heads
  config_json.divides(kv, "num_key_value_heads", heads, "num_attention_heads")
  n_layers = read(hf, "num_hidden_layers", dflt["num_hidden_layers"])
  moe = _moe(hf, impl)
  first_dense = n_layers if moe is None else read(hf, "first_k_dense_replace",
                                                  dflt["first_k_dense_replace"], minimum=0)
  mlp = read(hf, "intermediate_size", None, nullable=True)   # only dense layers need it
  if mlp is None and first_dense:
    raise config_json.ConfigJsonError(f"intermediate_size is missing or null but the model has "
                                      f"{min(first_dense, n_layers)} dense MLP layers")
  return dict(vocab_size=read(hf, "vocab_size", dflt["vocab_size"]), d_model=d,
              n_layers=n_layers, n_heads=heads, n_kv_heads=kv,
              head_dim=read(hf, "head_dim", 0, minimum=0, nullable=True) or d // heads,
              mlp_dim=mlp or 0, rope_theta=config_json.rope_theta(hf, dflt["rope_theta"]),
              rope_fraction=config_json.read_float(hf, "partial_rotary_factor",
                                                   dflt["partial_rotary_factor"], at_most=1.0),
              norm_eps=config_json.read_float(hf, "rms_norm_eps", dflt["rms_norm_eps"]),
              qk_norm=config_json.read_bool(hf, "use_qk_norm", dflt["use_qk_norm"]),
              tie_embeddings=config_json.read_bool(hf, "tie_word_embeddings",
                                                   dflt["tie_word_embeddings"]),
              moe=moe, first_k_dense=0 if moe is None else first_dense, norm_head=False,
              attention="block_causal")


def hf_config_json(cfg: ModelConfig) -> dict:
  """A LLaDA2 `config.json` for `cfg` (`architecture_from_hf` inverts it)."""
  if cfg.norm_head:
    raise ValueError("model.norm_head=True cannot be written as a LLaDA2 config.json: the "
                     "official LLaDA2 code ignores norm_head, so the head would load "
                     "unnormalised")
  return {"architectures": ["LLaDA2MoeModelLM"], "model_type": MODEL_TYPE,
          "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
          "intermediate_size": cfg.mlp_dim or None, "num_hidden_layers": cfg.n_layers,
          "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
          "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta,
          "partial_rotary_factor": cfg.rope_fraction, "rms_norm_eps": cfg.norm_eps,
          "use_qk_norm": cfg.qk_norm, "use_qkv_bias": False, "use_bias": False,
          "tie_word_embeddings": cfg.tie_embeddings, "norm_head": False,
          "first_k_dense_replace": cfg.first_k_dense, "score_function": "sigmoid",
          "hidden_act": "silu", "mask_token_id": cfg.mask_id, **_moe_json(cfg.moe)}


def _moe_json(moe: MoEConfig | None) -> dict:
  if moe is None:
    return {"num_experts": None}
  return {"num_experts": moe.n_experts, "num_experts_per_tok": moe.top_k,
          "moe_intermediate_size": moe.expert_dim, "n_group": moe.n_group,
          "topk_group": moe.topk_group, "num_shared_experts": moe.n_shared,
          "routed_scaling_factor": moe.routed_scaling_factor}


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
  assert cfg.moe is not None   # an MoE layer: the model has experts
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


FAMILY = Family(
    name=MODEL_TYPE, model_types=(MODEL_TYPE,), attention="block_causal",
    architecture_from_hf=architecture_from_hf, hf_config_json=hf_config_json,
    tensor_rules=tensor_rules, ignored_keys=IGNORED_KEYS,
    # experts over `expert` first (their names would otherwise match no rule)
    partition_rules=moe_lib.PARTITION_RULES + sharding.PARTITION_RULES,
    special_tokens=dict(mask=str(MASK_ID), eos=str(EOS_ID), pad=str(EOS_ID), bos=""),
    # block-causal, block 32, threshold 0.95 with at-least-one (the official default)
    # the official `generate`: blocks at absolute positions (the prompt's last block shared
    # with the first generated tokens), `confidence > threshold`
    decode=dict(block_size=32, rule="threshold", rule_value=0.95,
                block_placement="absolute", commit_compare=">"),
    # LLaDA2.x's chat template (its tokenizer's <role> markup) is not built in:
    # give prompts already formatted.
    chat="none",
    # inclusionAI/LLaDA2.1-mini's config.json (modeling_llada2_moe.py, configuration_llada2_moe.py)
    remote_code={MODEL_TYPE: {"architectures": ["LLaDA2MoeModelLM"], "auto_map": {
        "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
        "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
        "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"}}})
