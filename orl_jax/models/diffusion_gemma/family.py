"""DiffusionGemma (`model_type: diffusion_gemma`, docs/models.md#diffusiongemma): a family with its
own model.

Its model is not the shared `Transformer` but `DiffusionGemma` (`model.py` beside this module)
with `DiffusionGemmaConfig` (`config_from_hf` / `build_model`). What the registry records:

* the name map: transformers ties the encoder's text weights, the decoder's and the head, so a
  checkpoint holds the text stack once under `model.decoder.*`, plus the encoder's own
  `layer_scalar` buffers (our `commit_layer_scalar`), and no `lm_head`. The fused stacked
  experts `experts.gate_up_proj` [E, 2F, D] (gate rows first) feed two parameters,
  `moe.gate_proj` and `moe.up_proj` [E, D, F] (stacked `TensorRule`s with row ranges), and
  `experts.down_proj` [E, D, F] is our `moe.down_proj` [E, F, D];
* the vision tower (`model.encoder.vision_tower.*`, `model.encoder.embed_vision.*`) is not
  modelled; an export carries it through unchanged so transformers loads the directory;
* the `layer_scalar`s are HF buffers: frozen (no optimizer update, no moments);
* partition rules: routed experts over `expert`, their [D, F] / [F, D] slices like the dense
  MLP; the router replicated; everything else by the generic rules.
"""
from __future__ import annotations

import dataclasses
import json

from jax.sharding import PartitionSpec as P

from orl_jax import sharding
from orl_jax.models.family_base import Family, linear, plain, TensorRule
from orl_jax.models.diffusion_gemma.decoding import make_sampler
from orl_jax.models.diffusion_gemma.sampler import SamplerSettings
from orl_jax.models.diffusion_gemma.config import (FULL, MODEL_TYPE, SLIDING, AttentionSpec,
                                                   DiffusionGemmaConfig)

DECODER = "model.decoder."
ENCODER_LAYERS = "model.encoder.language_model.layers."
PASSTHROUGH_PREFIXES = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
EXPERT_AXIS = sharding.EXPERT_AXIS

_NORMS = (("input_layernorm", "input_norm"), ("post_attention_layernorm", "post_attn_norm"),
          ("pre_feedforward_layernorm", "pre_mlp_norm"),
          ("post_feedforward_layernorm_1", "post_mlp_norm"),
          ("pre_feedforward_layernorm_2", "pre_moe_norm"),
          ("post_feedforward_layernorm_2", "post_moe_norm"),
          ("post_feedforward_layernorm", "post_ff_norm"))


def _layer_rules(cfg: DiffusionGemmaConfig, i: int) -> list[TensorRule]:
  hf, ours = f"{DECODER}layers.{i}.", f"layers.{i}."
  rules = [plain(hf + f"{h}.weight", ours + f"{o}.weight") for h, o in _NORMS]
  projs = ("q_proj", "k_proj", "o_proj") + (() if cfg.layers[i].k_is_v else ("v_proj",))
  rules += [linear(hf + f"self_attn.{p}.weight", ours + f"attn.{p}.kernel") for p in projs]
  rules += [plain(hf + f"self_attn.{n}.weight", ours + f"attn.{n}.weight")
            for n in ("q_norm", "k_norm")]
  rules += [linear(hf + f"mlp.{p}.weight", ours + f"mlp.{p}.kernel")
            for p in ("gate_proj", "up_proj", "down_proj")]
  f = cfg.expert_dim
  rules += [linear(hf + "router.proj.weight", ours + "moe.router.kernel"),
            plain(hf + "router.scale", ours + "moe.router.scale"),
            plain(hf + "router.per_expert_scale", ours + "moe.router.per_expert_scale"),
            linear(hf + "experts.gate_up_proj", ours + "moe.gate_proj", rows=(0, f),
                   stacked=True),
            linear(hf + "experts.gate_up_proj", ours + "moe.up_proj", rows=(f, 2 * f),
                   stacked=True),
            linear(hf + "experts.down_proj", ours + "moe.down_proj", stacked=True),
            plain(hf + "layer_scalar", ours + "layer_scalar"),
            plain(f"{ENCODER_LAYERS}{i}.layer_scalar", ours + "commit_layer_scalar")]
  return rules


def tensor_rules(cfg: DiffusionGemmaConfig) -> list[TensorRule]:
  sc = DECODER + "self_conditioning."
  rules = [plain(DECODER + "embed_tokens.weight", "embed.embedding"),
           plain(DECODER + "norm.weight", "final_norm.weight"),
           plain(sc + "pre_norm.weight", "self_conditioning.pre_norm.weight")]
  rules += [linear(sc + f"{p}.weight", f"self_conditioning.mlp.{p}.kernel")
            for p in ("gate_proj", "up_proj", "down_proj")]
  for i in range(cfg.n_layers):
    rules += _layer_rules(cfg, i)
  return rules


def frozen(name: str) -> bool:
  """The `layer_scalar`s (decoder and commit): HF buffers, never trained."""
  return name.endswith("layer_scalar")


def architecture_from_hf(hf: dict) -> dict:
  """The `DiffusionGemmaConfig` fields a config.json determines."""
  cfg = DiffusionGemmaConfig.from_hf(hf)
  return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
          if f.name not in ("dtype", "param_dtype", "moe_impl", "attention_impl", "remat")}


def build_model(cfg: DiffusionGemmaConfig, rngs, mesh=None):
  from orl_jax.models.diffusion_gemma.model import DiffusionGemma
  return DiffusionGemma(cfg, rngs=rngs, mesh=mesh)


def layer_specs(n_layers: int, *, head_dim: int, n_kv_heads: int, global_head_dim: int,
                n_global_kv_heads: int, full_every: int, rope_theta: float,
                global_rope_theta: float, global_rope_fraction: float):
  """Gemma 4's layer pattern: every `full_every`-th layer and the last one full attention
  (proportional RoPE, K = V), the others sliding (default RoPE)."""
  full = AttentionSpec(FULL, head_dim=global_head_dim, n_kv_heads=n_global_kv_heads,
                       rope_type="proportional", rope_theta=global_rope_theta,
                       rope_fraction=global_rope_fraction)
  sliding = AttentionSpec(SLIDING, head_dim=head_dim, n_kv_heads=n_kv_heads,
                          rope_theta=rope_theta)
  return tuple(full if (i + 1) % full_every == 0 or i == n_layers - 1 else sliding
               for i in range(n_layers))


# transformers' DiffusionGemma class always builds a vision tower: a model of ours without a
# source directory exports this 1-layer one (its weights absent: transformers initialises them)
MINIMAL_VISION = {"vision_config": {
    "model_type": "gemma4_vision", "image_size": 20, "patch_size": 5, "num_channels": 3,
    "hidden_size": 16, "num_key_value_heads": 1, "num_hidden_layers": 1,
    "num_attention_heads": 4, "intermediate_size": 37}}


def config_from_run(m, *, vocab_size: int, canvas_length: int, eos_ids=(1,), pad_id: int = 0,
                    hf_passthrough: str = json.dumps(MINIMAL_VISION)) -> DiffusionGemmaConfig:
  """The `DiffusionGemmaConfig` of a run's `config.model` (no model.path: random init or
  sizing); `canvas_length` is `decode.block_size`."""
  dg = m.family_settings(ArchitectureSettings, "diffusion_gemma")
  layers = layer_specs(m.n_layers, head_dim=m.head_dim, n_kv_heads=m.n_kv_heads,
                       global_head_dim=dg.global_head_dim, n_global_kv_heads=dg.n_global_kv_heads,
                       full_every=dg.full_every, rope_theta=m.rope_theta,
                       global_rope_theta=dg.global_rope_theta,
                       global_rope_fraction=dg.global_rope_fraction)
  return DiffusionGemmaConfig(
      vocab_size=vocab_size, d_model=m.d_model, n_heads=m.n_heads, mlp_dim=m.mlp_dim,
      n_experts=m.moe.n_experts, top_k=m.moe.top_k, expert_dim=m.moe.expert_dim, layers=layers,
      sliding_window=dg.sliding_window, norm_eps=m.norm_eps, canvas_length=canvas_length,
      pad_id=pad_id, eos_ids=tuple(eos_ids), dtype=m.dtype, param_dtype=m.param_dtype,
      moe_impl=m.moe.impl, attention_impl=m.attention_impl, remat=m.remat,
      hf_passthrough=hf_passthrough)


def model_config(m, *, block_size: int, vocab_size: int = 0, hf_config: dict | None = None,
                 eos_ids=None, pad_id=None) -> DiffusionGemmaConfig:
  """The run's `DiffusionGemmaConfig`: from a checkpoint's config.json (`hf_config`; the
  run-time fields from `m`, the run's `config.model`), else from `m` (random init or sizing).
  `block_size` is `decode.block_size`, the canvas. The run's resolved special tokens
  (`eos_ids`, `pad_id`) replace config.json's when given. ValueError naming decode.block_size
  when config.json's canvas differs."""
  special = {k: v for k, v in dict(eos_ids=None if eos_ids is None else tuple(eos_ids),
                                   pad_id=pad_id).items() if v is not None}
  if hf_config is None:
    return config_from_run(m, vocab_size=vocab_size or m.vocab_size, canvas_length=block_size,
                           **special)
  cfg = DiffusionGemmaConfig.from_hf(hf_config, dtype=m.dtype, param_dtype=m.param_dtype,
                                     moe_impl=m.moe.impl, attention_impl=m.attention_impl,
                                     remat=m.remat)
  if cfg.canvas_length != block_size:
    raise ValueError(f"canvas_length={cfg.canvas_length}: set decode.block_size="
                     f"{cfg.canvas_length} (it is {block_size})")
  return dataclasses.replace(cfg, **special)


# decode.* field -> (the generation_config.json key that sets it, transformers' default:
# DiffusionGemmaGenerationConfig._get_default_generation_params, the value must be > 0 (float)
# or >= 1 (int))
GENERATION_DEFAULTS = {"gen_length": ("max_new_tokens", 256, True),
                       "max_steps_per_block": ("max_denoising_steps", 48, True),
                       "rule_value": ("sampler_config.entropy_bound", 0.1, True),
                       "t_min": ("t_min", 0.4, False), "t_max": ("t_max", 0.8, True),
                       "stability_threshold": ("stability_threshold", 1, False),
                       "confidence_threshold": ("confidence_threshold", 0.005, True)}


@dataclasses.dataclass(frozen=True)
class ArchitectureSettings:
  """`model.diffusion_gemma`: the layer pattern of a model without a config.json (random init,
  sizing); the release's values by default."""
  sliding_window: int = 1024          # window of the sliding layers
  global_head_dim: int = 512          # head_dim of the full-attention layers (K = V)
  n_global_kv_heads: int = 2          # kv heads of the full-attention layers
  full_every: int = 6                 # every n-th layer (and the last) is full attention
  global_rope_theta: float = 1e6      # proportional RoPE of the full-attention layers
  global_rope_fraction: float = 0.25


PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"moe\.(gate_proj|up_proj)$", P(EXPERT_AXIS, "fsdp", "tensor")),     # [E, D, F]
    (r"moe\.down_proj$", P(EXPERT_AXIS, "tensor", "fsdp")),               # [E, F, D]
    (r"moe\.router\.", P()),
)

FAMILY = Family(
    name=MODEL_TYPE, model_types=(MODEL_TYPE,), attention="token_causal",
    architecture_from_hf=architecture_from_hf,
    hf_config_json=lambda cfg: cfg.to_hf(), tensor_rules=tensor_rules,
    partition_rules=PARTITION_RULES + sharding.PARTITION_RULES,
    # Gemma's <pad> 0, <eos> 1, <bos> 2; uniform noise: no mask token
    special_tokens=dict(mask="", eos="1", pad="0", bos="2"),
    # canvases of 256, transformers' EntropyBoundSampler bound 0.1
    decode=dict(block_size=256, rule="entropy_budget", rule_value=0.1),
    chat="none", config_from_hf=DiffusionGemmaConfig.from_hf, build_model=build_model,
    frozen=frozen, residual_modules=("self_conditioning",),
    passthrough_prefixes=PASSTHROUGH_PREFIXES,
    config_from_run=lambda *a, **kw: model_config(*a, **kw),
    generation_defaults=GENERATION_DEFAULTS, sampler=make_sampler,
    config_sections={"model.diffusion_gemma": ArchitectureSettings, "decode": SamplerSettings})
