"""LLaDA-8B (Base / Instruct), `model_type: llada` (DESIGN §4): LLaMA-like, fully bidirectional.

Weight names `model.transformer.{wte, blocks.{i}.{attn_norm, ff_norm, q_proj, k_proj, v_proj,
attn_out, ff_proj (the SiLU gate), up_proj, ff_out}, ln_f, ff_out (head)}`.
"""
from __future__ import annotations

from orl_jax import sharding
from orl_jax.models.families.base import Family, dense_rules, linear, plain
from orl_jax.models.families.common import rope_theta
from orl_jax.models.transformer import ModelConfig

_LAYER = (
    plain("model.transformer.blocks.{i}.attn_norm.weight", "layers.{i}.input_norm.weight"),
    plain("model.transformer.blocks.{i}.ff_norm.weight", "layers.{i}.post_attn_norm.weight"),
    linear("model.transformer.blocks.{i}.q_proj.weight", "layers.{i}.attn.q_proj.kernel"),
    linear("model.transformer.blocks.{i}.k_proj.weight", "layers.{i}.attn.k_proj.kernel"),
    linear("model.transformer.blocks.{i}.v_proj.weight", "layers.{i}.attn.v_proj.kernel"),
    linear("model.transformer.blocks.{i}.attn_out.weight", "layers.{i}.attn.o_proj.kernel"),
    linear("model.transformer.blocks.{i}.ff_proj.weight", "layers.{i}.mlp.gate_proj.kernel"),
    linear("model.transformer.blocks.{i}.up_proj.weight", "layers.{i}.mlp.up_proj.kernel"),
    linear("model.transformer.blocks.{i}.ff_out.weight", "layers.{i}.mlp.down_proj.kernel"),
)


def tensor_rules(cfg: ModelConfig) -> list:
  return dense_rules(cfg, _LAYER, "model.transformer.wte.weight",
                     "model.transformer.ln_f.weight", "model.transformer.ff_out.weight")


def architecture_from_hf(hf: dict) -> dict:
  d, h = hf["d_model"], hf["n_heads"]
  return dict(vocab_size=int(hf.get("embedding_size") or hf["vocab_size"]), d_model=d,
              n_layers=hf["n_layers"], n_heads=h, n_kv_heads=hf.get("n_kv_heads") or h,
              head_dim=d // h, mlp_dim=hf["mlp_hidden_size"],
              rope_theta=rope_theta(hf, 10000.0), norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
              qk_norm=False, tie_embeddings=bool(hf.get("weight_tying", False)),
              family="bidirectional")


def hf_config_json(cfg: ModelConfig) -> dict:
  return {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": cfg.d_model,
          "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
          "mlp_hidden_size": cfg.mlp_dim, "vocab_size": cfg.vocab_size,
          "embedding_size": cfg.vocab_size, "rope_theta": cfg.rope_theta,
          "rms_norm_eps": cfg.norm_eps, "weight_tying": cfg.tie_embeddings,
          "mask_token_id": cfg.mask_id, "layer_norm_type": "rms", "include_bias": False,
          "rope": True, "activation_type": "silu", "block_type": "llama"}


FAMILY = Family(
    name="llada", model_types=("llada",), attention="bidirectional",
    architecture_from_hf=architecture_from_hf, hf_config_json=hf_config_json,
    tensor_rules=tensor_rules, partition_rules=sharding.PARTITION_RULES,
    # ids of LLaDA's tokenizer (DESIGN §4); EOS = <|eot_id|>, the end of the assistant turn
    special_tokens=dict(mask="126336", eos="126348", pad="126081", bos="126080"),
    # the reference sampler: blocks of 32 (fixed steps, low-confidence remasking); our
    # default rule is the Fast-dLLM threshold 0.9 (DESIGN §2.2 baseline)
    # Fast-dLLM's `generate`: blocks start at the prompt's end; the threshold keeps conf >= tau
    decode=dict(block_size=32, rule="threshold", rule_value=0.9,
                block_placement="prompt_end", commit_compare=">="),
    chat="llada")
