"""DiffusionGemma architecture (docs/models.md#diffusiongemma): our config dataclass and its
`config.json` mapping.

transformers 5.24 (`models/diffusion_gemma/configuration_diffusion_gemma.py`) is the reference
for every default and quirk reproduced here:
* `layer_types` defaults to five sliding layers then one full layer, the last layer is forced to
  `full_attention`;
* full layers take `head_dim = global_head_dim` (default 512) and, when `attention_k_eq_v`
  is true or absent, `num_key_value_heads = num_global_key_value_heads` — unless `config.json`
  carries an explicit `per_layer_config` ({layer index: overrides}), which wins;
* RoPE per layer type from `rope_parameters` (default: θ 1e4 on sliding layers, proportional
  θ 1e6 with `partial_rotary_factor` 0.25 on full layers);
* `final_logit_softcapping` is a class attribute (30.0) that `config.json` does not carry.

What we do not model (the vision tower, image token ids) is kept verbatim in
`hf_passthrough` (JSON) and written back by `to_hf`, so an exported directory still loads.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax.numpy as jnp

from orl_jax.models import config_json

MODEL_TYPE = "diffusion_gemma"
SLIDING, FULL = "sliding_attention", "full_attention"
ROPE_TYPES = ("default", "proportional")
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")
_DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                 FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                        "rope_theta": 1_000_000.0}}


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """One layer's attention shape and RoPE."""
  kind: str                   # sliding_attention | full_attention
  head_dim: int
  n_kv_heads: int
  rope_type: str = "default"  # default | proportional
  rope_theta: float = 10_000.0
  rope_fraction: float = 1.0  # partial_rotary_factor
  rope_factor: float = 1.0    # divides the frequencies (proportional RoPE's `factor`)

  @property
  def sliding(self) -> bool:
    return self.kind == SLIDING

  @property
  def k_is_v(self) -> bool:
    """Full layers have no `v_proj`: values are the (v-normed) key projection."""
    return not self.sliding


@dataclasses.dataclass(frozen=True)
class DiffusionGemmaConfig:
  vocab_size: int
  d_model: int
  n_heads: int
  mlp_dim: int                       # dense MLP and self-conditioning MLP width
  n_experts: int
  top_k: int
  expert_dim: int                    # moe_intermediate_size
  layers: tuple[AttentionSpec, ...]
  sliding_window: int
  norm_eps: float = 1e-6
  final_softcap: float | None = 30.0
  activation: str = "gelu_pytorch_tanh"
  canvas_length: int = 256
  pad_id: int = 0
  bos_id: int = 2
  eos_ids: tuple[int, ...] = (1,)
  max_positions: int = 131_072
  dtype: str = "float32"             # compute dtype
  param_dtype: str = "float32"
  moe_impl: str = "dense"            # dense | ragged (orl_jax.models.moe expert compute)
  attention_impl: str = "auto"       # packed replay attention (staircase dispatch impl)
  remat: bool = False                # recompute each layer of the replay forward in the backward
  hf_passthrough: str = ""           # JSON of config.json entries we do not model

  def __post_init__(self):
    self.validate()

  @property
  def n_layers(self) -> int:
    return len(self.layers)

  @property
  def hf_family(self) -> str:
    """The model-family registry's name (`orl_jax.models.families`)."""
    return MODEL_TYPE

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def embed_scale(self) -> float:
    return self.d_model ** 0.5

  def validate(self) -> None:
    """Raises ValueError naming the field that is inconsistent."""
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"diffusion_gemma activation must be one of {ACTIVATIONS}, "
                       f"got {self.activation!r}")
    if self.moe_impl not in ("dense", "ragged"):
      raise ValueError(f"diffusion_gemma moe_impl must be 'dense' or 'ragged', got "
                       f"{self.moe_impl!r}")
    if not 1 <= self.top_k <= self.n_experts:
      raise ValueError(f"diffusion_gemma top_k={self.top_k} must be in [1, n_experts="
                       f"{self.n_experts}]")
    for i, spec in enumerate(self.layers):
      _validate_layer(self, i, spec)

  @classmethod
  def from_hf(cls, hf_config: dict, **overrides) -> "DiffusionGemmaConfig":
    """Our config from a DiffusionGemma `config.json` dict; `overrides` set the fields
    config.json does not determine (dtype, param_dtype, moe_impl)."""
    return from_hf(hf_config, **overrides)

  def to_hf(self) -> dict:
    """A `config.json` dict that transformers' `DiffusionGemmaConfig` loads."""
    return to_hf(self)


def _validate_layer(cfg: DiffusionGemmaConfig, i: int, spec: AttentionSpec) -> None:
  where = f"diffusion_gemma layer {i} ({spec.kind})"
  if spec.kind not in (SLIDING, FULL):
    raise ValueError(f"{where}: layer type must be {SLIDING!r} or {FULL!r}")
  if cfg.n_heads % spec.n_kv_heads:
    raise ValueError(f"{where}: n_kv_heads={spec.n_kv_heads} must divide n_heads={cfg.n_heads}")
  if spec.rope_type not in ROPE_TYPES:
    raise ValueError(f"{where}: rope_type {spec.rope_type!r} is not supported ({ROPE_TYPES})")
  if spec.rope_type == "default" and spec.rope_fraction != 1.0:
    raise ValueError(f"{where}: default RoPE with partial_rotary_factor={spec.rope_fraction} "
                     "does not cover the head (transformers fails on it too)")
  if spec.head_dim % 2:
    raise ValueError(f"{where}: head_dim={spec.head_dim} must be even")


# ----------------------------------------------------------------------------- config.json


# transformers' DiffusionGemmaTextConfig defaults (5.24) of the keys read here
TEXT_DEFAULTS = dict(vocab_size=262_144, hidden_size=2304, intermediate_size=9216,
                     num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=256, hidden_activation="gelu_pytorch_tanh",
                     max_position_embeddings=131_072, rms_norm_eps=1e-6, pad_token_id=0,
                     eos_token_id=1, bos_token_id=2, sliding_window=512, global_head_dim=512,
                     final_logit_softcapping=30.0)
CANVAS_LENGTH = 256   # DiffusionGemmaConfig.canvas_length


def _layer_types(text: dict) -> list[str]:
  n = config_json.read_int(text, "num_hidden_layers", TEXT_DEFAULTS["num_hidden_layers"])
  types = text.get("layer_types")
  if types is None:
    types = [SLIDING if (i + 1) % 6 else FULL for i in range(n)]
  if not isinstance(types, list) or len(types) != n or any(t not in (SLIDING, FULL)
                                                           for t in types):
    raise config_json.ConfigJsonError(
        f"layer_types={config_json.shown(types)} must list {n} (num_hidden_layers) "
        f"entries, each {SLIDING!r} or {FULL!r}")
  types = list(types)
  types[-1] = FULL  # transformers forces the last layer to full attention
  return types


def _layer_overrides(text: dict, types: list[str]) -> dict[int, dict]:
  """{layer: {head_dim?, num_key_value_heads?}} as transformers resolves `per_layer_config`."""
  explicit = text.get("per_layer_config")
  if explicit is not None:
    if not isinstance(explicit, dict) or not all(
        isinstance(v, dict) and str(k).isdigit() for k, v in explicit.items()):
      raise config_json.ConfigJsonError("per_layer_config must map layer indices to objects "
                                        "of head_dim / num_key_value_heads")
    return {int(k): dict(v) for k, v in explicit.items()}
  over = {"head_dim": config_json.read_int(text, "global_head_dim",
                                          TEXT_DEFAULTS["global_head_dim"])}
  kv = config_json.read_int(text, "num_global_key_value_heads", None, nullable=True)
  if config_json.read_bool(text, "attention_k_eq_v", True) and kv is not None:
    over["num_key_value_heads"] = kv
  return {i: over for i, t in enumerate(types) if t == FULL}


def _attention_spec(text: dict, kind: str, over: dict) -> AttentionSpec:
  rope = config_json.read_dict(text, "rope_parameters") or _DEFAULT_ROPE
  rope = rope.get(kind) or _DEFAULT_ROPE[kind]
  if not isinstance(rope, dict):
    raise config_json.ConfigJsonError(f"rope_parameters.{kind} must be an object")
  shape = {"head_dim": text.get("head_dim", TEXT_DEFAULTS["head_dim"]),
           "num_key_value_heads": text.get("num_key_value_heads",
                                           TEXT_DEFAULTS["num_key_value_heads"]), **over}
  return AttentionSpec(
      kind=kind, head_dim=config_json.read_int(shape, "head_dim", None),
      n_kv_heads=config_json.read_int(shape, "num_key_value_heads", None),
      rope_type=config_json.read_str(rope, "rope_type", "default"),
      rope_theta=config_json.read_float(rope, "rope_theta", None),
      rope_fraction=config_json.read_float(rope, "partial_rotary_factor", 1.0, at_most=1.0),
      rope_factor=config_json.read_float(rope, "factor", 1.0))


def _check_supported(hf_config: dict, text: dict) -> None:
  if hf_config.get("model_type", MODEL_TYPE) != MODEL_TYPE:
    raise ValueError(f"config.json model_type={hf_config.get('model_type')!r}: expected "
                     f"{MODEL_TYPE!r}")
  if not (config_json.read_bool(hf_config, "tie_word_embeddings", True)
          and config_json.read_bool(text, "tie_word_embeddings", True)):
    raise ValueError("config.json sets tie_word_embeddings=false: DiffusionGemma's head is the "
                     "embedding table")
  if config_json.read_bool(text, "attention_bias", False):
    raise ValueError("config.json text_config.attention_bias=true is not supported")
  if text.get("use_bidirectional_attention") == "all":
    raise ValueError("config.json text_config.use_bidirectional_attention='all' (bidirectional "
                     "encoder) is not supported: the commit forward is token-causal")
  for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
    if not text.get(key):
      raise ValueError(f"config.json text_config.{key} is missing: DiffusionGemma layers "
                       "always run the MoE block")


def _text_fields(text: dict) -> dict:
  """The DiffusionGemmaConfig fields of `text_config` besides the layers (typed, defaults of
  transformers' class for missing keys)."""
  read, dflt = config_json.read_int, TEXT_DEFAULTS
  soft = text.get("final_logit_softcapping", dflt["final_logit_softcapping"])
  return dict(
      vocab_size=read(text, "vocab_size", dflt["vocab_size"]),
      d_model=read(text, "hidden_size", dflt["hidden_size"]),
      n_heads=read(text, "num_attention_heads", dflt["num_attention_heads"]),
      mlp_dim=read(text, "intermediate_size", dflt["intermediate_size"]),
      n_experts=read(text, "num_experts", None), top_k=read(text, "top_k_experts", None),
      expert_dim=read(text, "moe_intermediate_size", None),
      sliding_window=read(text, "sliding_window", dflt["sliding_window"]),
      norm_eps=config_json.read_float(text, "rms_norm_eps", dflt["rms_norm_eps"]),
      final_softcap=None if soft is None else config_json.read_float(
          text, "final_logit_softcapping", soft),
      activation=config_json.read_str(text, "hidden_activation", dflt["hidden_activation"]),
      pad_id=read(text, "pad_token_id", dflt["pad_token_id"], minimum=0),
      bos_id=read(text, "bos_token_id", dflt["bos_token_id"], minimum=0),
      eos_ids=config_json.read_ids(text, "eos_token_id", dflt["eos_token_id"]) or (),
      max_positions=read(text, "max_position_embeddings", dflt["max_position_embeddings"]))


def from_hf(hf_config: dict, **overrides) -> DiffusionGemmaConfig:
  """Our config from a DiffusionGemma `config.json` dict (missing keys: the defaults of
  transformers' classes); ValueError (`ConfigJsonError` for a field of the wrong type or value)
  naming the field."""
  text = dict(config_json.read_dict(hf_config, "text_config"))
  _check_supported(hf_config, text)
  try:
    types = _layer_types(text)
    over = _layer_overrides(text, types)
    layers = tuple(_attention_spec(text, t, over.get(i, {})) for i, t in enumerate(types))
    fields = _text_fields(text)
  except config_json.ConfigJsonError as e:
    raise config_json.ConfigJsonError(f"text_config.{e}") from None
  passthrough = {k: v for k, v in hf_config.items()
                 if k not in ("text_config", "model_type", "architectures", "canvas_length",
                              "tie_word_embeddings", "transformers_version", "dtype",
                              "torch_dtype")}
  return DiffusionGemmaConfig(
      **fields, layers=layers,
      canvas_length=config_json.read_int(hf_config, "canvas_length", CANVAS_LENGTH),
      hf_passthrough=json.dumps(passthrough, sort_keys=True) if passthrough else "",
      **overrides)


def _rope_parameters(cfg: DiffusionGemmaConfig) -> dict:
  out: dict[str, dict] = {}
  for spec in cfg.layers:
    rope = {"rope_type": spec.rope_type, "rope_theta": spec.rope_theta}
    if spec.rope_fraction != 1.0:
      rope["partial_rotary_factor"] = spec.rope_fraction
    if spec.rope_factor != 1.0:
      rope["factor"] = spec.rope_factor
    if out.setdefault(spec.kind, rope) != rope:
      raise ValueError(f"diffusion_gemma: layers of type {spec.kind} disagree on RoPE; "
                       "config.json has one rope_parameters entry per layer type")
  return out


def to_hf(cfg: DiffusionGemmaConfig) -> dict:
  base = cfg.layers[0]
  per_layer = {str(i): {"head_dim": s.head_dim, "num_key_value_heads": s.n_kv_heads}
               for i, s in enumerate(cfg.layers)
               if (s.head_dim, s.n_kv_heads) != (base.head_dim, base.n_kv_heads)}
  text = {"model_type": "diffusion_gemma_text", "vocab_size": cfg.vocab_size,
          "hidden_size": cfg.d_model, "intermediate_size": cfg.mlp_dim,
          "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
          "num_key_value_heads": base.n_kv_heads, "head_dim": base.head_dim,
          "hidden_activation": cfg.activation, "rms_norm_eps": cfg.norm_eps,
          "pad_token_id": cfg.pad_id, "bos_token_id": cfg.bos_id,
          "eos_token_id": list(cfg.eos_ids) if len(cfg.eos_ids) > 1 else cfg.eos_ids[0],
          "tie_word_embeddings": True, "rope_parameters": _rope_parameters(cfg),
          "attention_bias": False, "sliding_window": cfg.sliding_window,
          "layer_types": [s.kind for s in cfg.layers], "per_layer_config": per_layer,
          "num_experts": cfg.n_experts, "top_k_experts": cfg.top_k,
          "moe_intermediate_size": cfg.expert_dim, "use_bidirectional_attention": "vision",
          "max_position_embeddings": cfg.max_positions}
  if cfg.final_softcap != 30.0:
    text["final_logit_softcapping"] = cfg.final_softcap
  out = json.loads(cfg.hf_passthrough) if cfg.hf_passthrough else {}
  out.update({"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": MODEL_TYPE,
              "text_config": text, "canvas_length": cfg.canvas_length,
              "tie_word_embeddings": True,
              "dtype": "bfloat16" if cfg.param_dtype == "bfloat16" else "float32"})
  return out


def release_26b_a4b(**overrides) -> DiffusionGemmaConfig:
  """The shapes of `google/diffusiongemma-26B-A4B-it` (docs/models.md#diffusiongemma; Gemma 4
  26B-A4B text stack): 30 layers, full attention on every sixth (5, 11, ..., 29), sliding window
  1024."""
  full = AttentionSpec(FULL, head_dim=512, n_kv_heads=2, rope_type="proportional",
                       rope_theta=1e6, rope_fraction=0.25)
  sliding = AttentionSpec(SLIDING, head_dim=256, n_kv_heads=8, rope_theta=1e4)
  layers = tuple(full if (i + 1) % 6 == 0 else sliding for i in range(30))
  fields: dict[str, Any] = dict(
      vocab_size=262_144, d_model=2816, n_heads=16, mlp_dim=2112, n_experts=128, top_k=8,
      expert_dim=704, layers=layers, sliding_window=1024, canvas_length=256, eos_ids=(1, 106),
      dtype="bfloat16", param_dtype="bfloat16")
  fields.update(overrides)
  return DiffusionGemmaConfig(**fields)
