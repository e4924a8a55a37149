"""Qwen3-based block DLMs, `model_type: qwen3 | sdar`
(docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm: SDAR-4B/8B, QwenDLM): block-causal, per-head q/k
RMSNorm before RoPE, HF Qwen3 weight names."""
from __future__ import annotations

from orl_jax import sharding
from orl_jax.models.family_base import Family, dense_rules, linear, plain
from orl_jax.models import config_json
from orl_jax.models.transformer import ModelConfig

_LAYER = (
    plain("model.layers.{i}.input_layernorm.weight", "layers.{i}.input_norm.weight"),
    plain("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attn_norm.weight"),
    linear("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.attn.q_proj.kernel"),
    linear("model.layers.{i}.self_attn.k_proj.weight", "layers.{i}.attn.k_proj.kernel"),
    linear("model.layers.{i}.self_attn.v_proj.weight", "layers.{i}.attn.v_proj.kernel"),
    linear("model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.attn.o_proj.kernel"),
    plain("model.layers.{i}.self_attn.q_norm.weight", "layers.{i}.attn.q_norm.weight"),
    plain("model.layers.{i}.self_attn.k_norm.weight", "layers.{i}.attn.k_norm.weight"),
    linear("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.gate_proj.kernel"),
    linear("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.up_proj.kernel"),
    linear("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.down_proj.kernel"),
)


def tensor_rules(cfg: ModelConfig) -> list:
  layer = [r for r in _LAYER if cfg.qk_norm or not r.ours.endswith(("q_norm.weight",
                                                                     "k_norm.weight"))]
  return dense_rules(cfg, tuple(layer), "model.embed_tokens.weight", "model.norm.weight",
                     "lm_head.weight")


# The defaults of transformers' Qwen3Config (5.24) and of SDAR's SDARConfig (its
# configuration_sdar.py), which agree on every key this reader uses
DEFAULTS = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                head_dim=128, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0)
# settings the official models read that we implement with one value only: key -> (the
# official default, the supported values)
_FIXED = {"attention_bias": (False, (False,)), "hidden_act": ("silu", ("silu",)),
          "use_sliding_window": (False, (False,))}


def architecture_from_hf(hf: dict) -> dict:
  """The ModelConfig fields of a Qwen3 / SDAR `config.json` (missing keys: the official classes'
  defaults); ConfigJsonError names a field of the wrong type or a setting the model does not
  implement."""
  config_json.require_all(hf, _FIXED, "block-diffusion Qwen3 models")
  types = hf.get("layer_types")
  if types is not None and (not isinstance(types, list)
                            or any(t != "full_attention" for t in types)):
    raise config_json.ConfigJsonError(
        f"layer_types={config_json.shown(types)} is not supported: every layer must be "
        "\"full_attention\" (no sliding windows)")
  read, dflt = config_json.read_int, DEFAULTS
  h = read(hf, "num_attention_heads", dflt["num_attention_heads"])
  kv = read(hf, "num_key_value_heads", dflt["num_key_value_heads"], nullable=True) or h
  config_json.divides(kv, "num_key_value_heads", h, "num_attention_heads")
  return dict(vocab_size=read(hf, "vocab_size", dflt["vocab_size"]),
              d_model=read(hf, "hidden_size", dflt["hidden_size"]),
              n_layers=read(hf, "num_hidden_layers", dflt["num_hidden_layers"]), n_heads=h,
              n_kv_heads=kv, head_dim=read(hf, "head_dim", dflt["head_dim"]),
              mlp_dim=read(hf, "intermediate_size", dflt["intermediate_size"]),
              rope_theta=config_json.rope_theta(hf, dflt["rope_theta"]),
              norm_eps=config_json.read_float(hf, "rms_norm_eps", dflt["rms_norm_eps"]),
              qk_norm=True, tie_embeddings=config_json.read_bool(
                  hf, "tie_word_embeddings", dflt["tie_word_embeddings"]),
              attention="block_causal")


def hf_config_json(cfg: ModelConfig) -> dict:
  return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
          "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
          "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
          "head_dim": cfg.head_dim, "intermediate_size": cfg.mlp_dim,
          "vocab_size": cfg.vocab_size, "rope_theta": cfg.rope_theta,
          "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
          "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 32768,
          "mask_token_id": cfg.mask_id}


def _ignored(cfg: ModelConfig) -> frozenset:
  # a tied checkpoint may still store its (identical) head
  return frozenset({"lm_head.weight"}) if cfg.tie_embeddings else frozenset()


FAMILY = Family(
    name="qwen3", model_types=("qwen3", "sdar"), attention="block_causal",
    architecture_from_hf=architecture_from_hf, hf_config_json=hf_config_json,
    tensor_rules=tensor_rules, partition_rules=sharding.PARTITION_RULES,
    # SDAR's mask <|MASK|> (151669); Qwen chat end of turn
    special_tokens=dict(mask="<|MASK|>", eos="<|im_end|>", pad="<|endoftext|>", bos=""),
    # SDAR's `block_diffusion_generate` (JetAstra/SDAR generate.py): block size 4, blocks at
    # absolute positions, `confidence > threshold`; QwenDLM decodes as SDAR
    decode=dict(block_size=4, rule="threshold", rule_value=0.9,
                block_placement="absolute", commit_compare=">"),
    chat="qwen3", ignored_hf=_ignored,
    # JetLM/SDAR-*-Chat's config.json (modeling_sdar.py, configuration_sdar.py); QwenDLM's
    # model_type qwen3 is transformers' own Qwen3ForCausalLM
    remote_code={"sdar": {"architectures": ["SDARForCausalLM"], "auto_map": {
        "AutoConfig": "configuration_sdar.SDARConfig",
        "AutoModel": "modeling_sdar.SDARModel",
        "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"}}})
