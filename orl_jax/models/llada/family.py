"""LLaDA-8B (Base / Instruct), `model_type: llada`
(docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm): LLaMA-like, fully bidirectional.

Weight names `model.transformer.{wte, blocks.{i}.{attn_norm, ff_norm, q_proj, k_proj, v_proj,
attn_out, ff_proj (the SiLU gate), up_proj, ff_out}, ln_f, ff_out (head)}`.
"""
from __future__ import annotations

from orl_jax import sharding
from orl_jax.models.family_base import Family, dense_rules, linear, plain
from orl_jax.models import config_json
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


# LLaDAConfig's defaults (the `ModelConfig` dataclass of the official configuration_llada.py),
# for the keys this reader uses
_DEFAULTS = dict(d_model=768, n_heads=12, n_layers=12, mlp_ratio=4, vocab_size=50257,
                 embedding_size=50304, rope_theta=10000.0, rms_norm_eps=1e-5, weight_tying=True)
# settings the official model reads that our LLaMA-style block implements with one value only:
# key -> (the official default, the supported values)
_FIXED = {"rope": (False, (True,)), "alibi": (False, (False,)),
          "block_type": ("sequential", ("llama",)), "activation_type": ("swiglu", ("silu",)),
          "layer_norm_type": ("default", ("rms",)), "layer_norm_with_affine": (True, (True,)),
          "include_bias": (False, (False,)), "include_qkv_bias": (False, (False, None)),
          "bias_for_layer_norm": (None, (False, None)), "attention_layer_norm": (False, (False,)),
          "scale_logits": (False, (False,)), "input_emb_norm": (False, (False,))}


def architecture_from_hf(hf: dict) -> dict:
  """The ModelConfig fields of a LLaDA `config.json` (missing keys: LLaDAConfig's defaults);
  ConfigJsonError naming a field of the wrong type or a setting the model does not implement."""
  config_json.require_all(hf, _FIXED, "the LLaDA-8B checkpoints")
  read, dflt = config_json.read_int, _DEFAULTS
  d, h = read(hf, "d_model", dflt["d_model"]), read(hf, "n_heads", dflt["n_heads"])
  config_json.divides(h, "n_heads", d, "d_model")
  kv = read(hf, "n_kv_heads", None, nullable=True)
  if kv is None:   # LLaDA's `effective_n_kv_heads`
    mqa = hf.get("multi_query_attention") is not None and config_json.read_bool(
        hf, "multi_query_attention", False)
    kv = 1 if mqa else h
  config_json.divides(kv, "n_kv_heads", h, "n_heads")
  mlp = read(hf, "mlp_hidden_size", None, nullable=True) or read(
      hf, "mlp_ratio", dflt["mlp_ratio"]) * d
  vocab = read(hf, "vocab_size", dflt["vocab_size"])
  rows = read(hf, "embedding_size", dflt["embedding_size"], nullable=True) or vocab
  return dict(vocab_size=rows, d_model=d, n_layers=read(hf, "n_layers", dflt["n_layers"]),
              n_heads=h, n_kv_heads=kv, head_dim=d // h, mlp_dim=mlp,
              rope_theta=config_json.rope_theta(hf, dflt["rope_theta"]),
              norm_eps=config_json.read_float(hf, "rms_norm_eps", dflt["rms_norm_eps"]),
              qk_norm=False,
              tie_embeddings=config_json.read_bool(hf, "weight_tying", dflt["weight_tying"]),
              attention="bidirectional")


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
    # ids of LLaDA's tokenizer (docs/models.md#special-tokens-where-each-id-comes-from); EOS =
    # <|eot_id|>, the end of the assistant turn
    special_tokens=dict(mask="126336", eos="126348", pad="126081", bos="126080"),
    # the reference sampler: blocks of 32 (fixed steps, low-confidence remasking); our
    # default rule is the Fast-dLLM threshold 0.9
    # (docs/decoding.md#one-denoising-step)
    # Fast-dLLM's `generate`: blocks start at the prompt's end; the threshold keeps conf >= tau
    decode=dict(block_size=32, rule="threshold", rule_value=0.9,
                block_placement="prompt_end", commit_compare=">="),
    chat="llada",
    # GSAI-ML/LLaDA-8B-Instruct's config.json (modeling_llada.py, configuration_llada.py)
    remote_code={"llada": {"architectures": ["LLaDAModelLM"], "auto_map": {
        "AutoConfig": "configuration_llada.LLaDAConfig",
        "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
        "AutoModel": "modeling_llada.LLaDAModelLM"}}})
