"""Local Hugging Face checkpoints <-> our Transformer (DESIGN §4).

A model directory holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and `tokenizer.json`. Nothing here imports torch or touches the
network: tensors are read with the safetensors numpy API, one slice per device shard
(`jax.make_array_from_callback`), so no process ever holds a full host copy of the model.

Families and their weight names:
* ``llada``  — `model.transformer.{wte, blocks.{i}.{attn_norm, ff_norm, q_proj, k_proj, v_proj,
  attn_out, ff_proj (gate), up_proj, ff_out}, ln_f, ff_out (head)}`; fully bidirectional.
* ``qwen3``  — HF Qwen3 names (`model.embed_tokens`, `model.layers.{i}.self_attn.*`, ...,
  `lm_head`); block-causal DLMs (SDAR, QwenDLM).

PyTorch `Linear` weights are `[out, in]`; our NNX kernels are `[in, out]` (transposed on load
and on export). Export writes the same HF layout back, with the residual adapter (which no HF
model has) in a separate `adapter.safetensors` under our own names.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Callable, NamedTuple

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from orl_jax.models.transformer import ModelConfig
from orl_jax.params_io import open_safetensors, read_json
from orl_jax.sharding import path_name

FAMILIES = ("llada", "qwen3")
CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ADAPTER_FILE = "adapter.safetensors"
ADAPTER_PREFIX = "adapter."


class CheckpointError(ValueError):
  """A model directory that does not match the configured model; the message names the file."""


class TensorRule(NamedTuple):
  hf: str           # HF name template with {i} for the layer index
  ours: str         # our flat (dot-joined) parameter name template
  transpose: bool   # PyTorch Linear [out, in] <-> NNX kernel [in, out]


def _linear(hf, ours):
  return TensorRule(hf, ours, True)


def _plain(hf, ours):
  return TensorRule(hf, ours, False)


_LLADA_LAYER = (
    _plain("model.transformer.blocks.{i}.attn_norm.weight", "layers.{i}.input_norm.weight"),
    _plain("model.transformer.blocks.{i}.ff_norm.weight", "layers.{i}.post_attn_norm.weight"),
    _linear("model.transformer.blocks.{i}.q_proj.weight", "layers.{i}.attn.q_proj.kernel"),
    _linear("model.transformer.blocks.{i}.k_proj.weight", "layers.{i}.attn.k_proj.kernel"),
    _linear("model.transformer.blocks.{i}.v_proj.weight", "layers.{i}.attn.v_proj.kernel"),
    _linear("model.transformer.blocks.{i}.attn_out.weight", "layers.{i}.attn.o_proj.kernel"),
    _linear("model.transformer.blocks.{i}.ff_proj.weight", "layers.{i}.mlp.gate_proj.kernel"),
    _linear("model.transformer.blocks.{i}.up_proj.weight", "layers.{i}.mlp.up_proj.kernel"),
    _linear("model.transformer.blocks.{i}.ff_out.weight", "layers.{i}.mlp.down_proj.kernel"),
)
_LLADA_GLOBAL = (
    _plain("model.transformer.wte.weight", "embed.embedding"),
    _plain("model.transformer.ln_f.weight", "final_norm.weight"),
    _linear("model.transformer.ff_out.weight", "lm_head.kernel"),
)
_QWEN3_LAYER = (
    _plain("model.layers.{i}.input_layernorm.weight", "layers.{i}.input_norm.weight"),
    _plain("model.layers.{i}.post_attention_layernorm.weight", "layers.{i}.post_attn_norm.weight"),
    _linear("model.layers.{i}.self_attn.q_proj.weight", "layers.{i}.attn.q_proj.kernel"),
    _linear("model.layers.{i}.self_attn.k_proj.weight", "layers.{i}.attn.k_proj.kernel"),
    _linear("model.layers.{i}.self_attn.v_proj.weight", "layers.{i}.attn.v_proj.kernel"),
    _linear("model.layers.{i}.self_attn.o_proj.weight", "layers.{i}.attn.o_proj.kernel"),
    _plain("model.layers.{i}.self_attn.q_norm.weight", "layers.{i}.attn.q_norm.weight"),
    _plain("model.layers.{i}.self_attn.k_norm.weight", "layers.{i}.attn.k_norm.weight"),
    _linear("model.layers.{i}.mlp.gate_proj.weight", "layers.{i}.mlp.gate_proj.kernel"),
    _linear("model.layers.{i}.mlp.up_proj.weight", "layers.{i}.mlp.up_proj.kernel"),
    _linear("model.layers.{i}.mlp.down_proj.weight", "layers.{i}.mlp.down_proj.kernel"),
)
_QWEN3_GLOBAL = (
    _plain("model.embed_tokens.weight", "embed.embedding"),
    _plain("model.norm.weight", "final_norm.weight"),
    _linear("lm_head.weight", "lm_head.kernel"),
)


def tensor_rules(family: str, cfg: ModelConfig) -> list[TensorRule]:
  """Every (HF name, our name, transpose) of a base model of `cfg` (no adapter)."""
  if family == "llada":
    layer, glob = _LLADA_LAYER, _LLADA_GLOBAL
  elif family == "qwen3":
    layer, glob = _QWEN3_LAYER, _QWEN3_GLOBAL
  else:
    raise ValueError(f"model.hf_family={family!r} must be one of {FAMILIES}")
  rules = []
  for i in range(cfg.n_layers):
    for r in layer:
      if not cfg.qk_norm and ("q_norm" in r.ours or "k_norm" in r.ours):
        continue
      rules.append(TensorRule(r.hf.format(i=i), r.ours.format(i=i), r.transpose))
  for r in glob:
    if cfg.tie_embeddings and r.ours == "lm_head.kernel":
      continue
    rules.append(r)
  return rules


# ----------------------------------------------------------------------------- config.json


def _rope_theta(hf: dict, default: float) -> float:
  params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  return float(hf.get("rope_theta", params.get("rope_theta", default)))


def architecture_from_hf(hf: dict, family: str) -> dict:
  """The ModelConfig fields a HF `config.json` determines (dict of field -> value)."""
  if family == "llada":
    d, h = hf["d_model"], hf["n_heads"]
    return dict(vocab_size=int(hf.get("embedding_size") or hf["vocab_size"]), d_model=d,
                n_layers=hf["n_layers"], n_heads=h, n_kv_heads=hf.get("n_kv_heads") or h,
                head_dim=d // h, mlp_dim=hf["mlp_hidden_size"],
                rope_theta=_rope_theta(hf, 10000.0), norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                qk_norm=False, tie_embeddings=bool(hf.get("weight_tying", False)))
  if family == "qwen3":
    h = hf["num_attention_heads"]
    return dict(vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                n_layers=hf["num_hidden_layers"], n_heads=h,
                n_kv_heads=hf.get("num_key_value_heads") or h,
                head_dim=hf.get("head_dim") or hf["hidden_size"] // h,
                mlp_dim=hf["intermediate_size"], rope_theta=_rope_theta(hf, 1e6),
                norm_eps=float(hf.get("rms_norm_eps", 1e-6)), qk_norm=True,
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
  raise ValueError(f"model.hf_family={family!r} must be one of {FAMILIES}")


def hf_config_json(cfg: ModelConfig, family: str, extra: dict | None = None) -> dict:
  """A HF `config.json` for `cfg` (what `export` writes; `architecture_from_hf` inverts it)."""
  if family == "llada":
    out = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": cfg.d_model,
           "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
           "mlp_hidden_size": cfg.mlp_dim, "vocab_size": cfg.vocab_size,
           "embedding_size": cfg.vocab_size, "rope_theta": cfg.rope_theta,
           "rms_norm_eps": cfg.norm_eps, "weight_tying": cfg.tie_embeddings,
           "mask_token_id": cfg.mask_id, "layer_norm_type": "rms", "include_bias": False,
           "rope": True, "activation_type": "silu", "block_type": "llama"}
  elif family == "qwen3":
    out = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
           "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads,
           "head_dim": cfg.head_dim, "intermediate_size": cfg.mlp_dim,
           "vocab_size": cfg.vocab_size, "rope_theta": cfg.rope_theta,
           "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
           "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 32768}
  else:
    raise ValueError(f"model.hf_family={family!r} must be one of {FAMILIES}")
  out["torch_dtype"] = {"bfloat16": "bfloat16", "float32": "float32"}.get(cfg.param_dtype,
                                                                           cfg.param_dtype)
  out.update(extra or {})
  return out


def read_hf_config(hf_dir: str) -> dict:
  path = os.path.join(hf_dir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise CheckpointError(f"{path} not found: model.hf_dir must be a local Hugging Face model "
                          "directory (config.json, *.safetensors, tokenizer.json)")
  return read_json(path)


def check_architecture(cfg: ModelConfig, hf_dir: str, family: str) -> None:
  """Raises CheckpointError naming every model.* field that disagrees with config.json."""
  hf = read_hf_config(hf_dir)
  try:
    want = architecture_from_hf(hf, family)
  except KeyError as e:
    raise CheckpointError(f"{os.path.join(hf_dir, CONFIG_FILE)}: missing key {e} for a "
                          f"{family!r} model (is model.hf_family right?)") from None
  bad = []
  for field, value in want.items():
    ours = getattr(cfg, field)
    same = (abs(float(ours) - float(value)) <= 1e-12 * max(1.0, abs(float(value)))
            if isinstance(value, float) else ours == value)
    if not same:
      bad.append(f"model.{field}={ours!r} but config.json says {value!r}")
  if bad:
    raise CheckpointError(f"{os.path.join(hf_dir, CONFIG_FILE)} does not match the config: "
                          + "; ".join(bad))


# ----------------------------------------------------------------------------- tensors


def weight_files(hf_dir: str) -> dict[str, str]:
  """{HF tensor name: file path} from the index (sharded) or the single safetensors file."""
  index = os.path.join(hf_dir, INDEX_FILE)
  if os.path.isfile(index):
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{index} has no \"weight_map\" object naming each tensor's file")
    return {name: os.path.join(hf_dir, fname) for name, fname in weight_map.items()}
  single = os.path.join(hf_dir, SINGLE_FILE)
  if os.path.isfile(single):
    with open_safetensors(single) as f:
      return {name: single for name in f.keys()}
  raise CheckpointError(f"{hf_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} found")


class _Reader:
  """Lazily opened safetensors files; `read(name, index)` reads one slice only."""

  def __init__(self, files: dict[str, str]):
    self.files = files
    self._open = {}

  def _handle(self, path):
    if path not in self._open:
      if not os.path.isfile(path):
        raise CheckpointError(f"{path} not found: {INDEX_FILE} names it as a weight file")
      self._open[path] = open_safetensors(path)
    return self._open[path]

  def shape(self, name) -> tuple[int, ...]:
    return tuple(self._handle(self.files[name]).get_slice(name).get_shape())

  def read(self, name, index=None) -> np.ndarray:
    sl = self._handle(self.files[name]).get_slice(name)
    return sl[index] if index is not None else sl[:]


def _flat_params(params: nnx.State) -> dict:
  """{our dot-joined name ('layers.0.attn.q_proj.kernel'): leaf}."""
  return {path_name(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


def _transposed_index(index):
  """The index into an [out, in] tensor that yields kernel[index].T for kernel = tensor.T."""
  if index is None:
    return None
  return tuple(reversed(tuple(index)))


def load_hf_params(hf_dir: str, family: str, abstract_params: nnx.State,
                   shardings=None, *, allow_missing: Callable[[str], bool] | None = None):
  """Reads a HF checkpoint into a params State shaped like `abstract_params`.

  Args:
    hf_dir: local model directory.
    family: 'llada' or 'qwen3'.
    abstract_params: `nnx.State` of the configured model (ShapeDtypeStructs or arrays).
    shardings: a matching tree of `jax.sharding.Sharding` (None: default device placement).
      Each device shard is read from disk on its own; no full host copy is made.
    allow_missing: our names that may be absent (kept from `abstract_params`, which must then
      hold arrays); by default the residual adapter (`adapter.*`).

  Returns:
    (params, kept): the State with loaded arrays, and names that kept their given value.

  Raises:
    CheckpointError: listing missing, unexpected and mis-shaped tensors.
  """
  allow_missing = allow_missing or (lambda name: name.startswith(ADAPTER_PREFIX))
  leaves = _flat_params(abstract_params)
  files = weight_files(hf_dir)
  adapter_path = os.path.join(hf_dir, ADAPTER_FILE)
  adapter_names = set()
  if os.path.isfile(adapter_path):
    with open_safetensors(adapter_path) as f:
      adapter_names = set(f.keys())
    files.update({n: adapter_path for n in adapter_names})
  reader = _Reader(files)
  sources = _tensor_sources(hf_dir, family, leaves, files, adapter_names, reader, allow_missing)
  flat_sh = _flat_params(shardings) if shardings is not None else {}
  kept = sorted(name for name in leaves if name not in sources)
  loaded = {name: _load_leaf(reader, sources.get(name), leaf, flat_sh.get(name))
            for name, leaf in leaves.items()}
  return _unflatten_like(abstract_params, loaded), kept


def _tensor_sources(hf_dir: str, family: str, leaves: dict, files: dict, adapter_names: set,
                    reader, allow_missing) -> dict:
  """{our name: (file tensor name, transpose)} for every parameter the files hold; raises
  CheckpointError listing missing, unexpected and mis-shaped tensors."""
  cfg_like = _infer_cfg(leaves)
  rules = {r.ours: r for r in tensor_rules(family, cfg_like)}
  tied_extra = {"lm_head.weight"} if family == "qwen3" and cfg_like.tie_embeddings else set()
  expected_hf = {r.hf for r in rules.values()}
  unexpected = sorted(set(files) - expected_hf - adapter_names - tied_extra)
  missing, bad_shape = [], []
  sources = {}
  for name, leaf in leaves.items():
    rule = rules.get(name)
    if rule is not None and rule.hf in files:
      sources[name] = (rule.hf, rule.transpose)
    elif name in adapter_names:
      sources[name] = (name, False)
    elif not allow_missing(name):
      missing.append(rule.hf if rule is not None else name)
      continue
    if name in sources:
      src, transpose = sources[name]
      shape = reader.shape(src)
      shape = tuple(reversed(shape)) if transpose else shape
      if shape != tuple(leaf.shape):
        bad_shape.append(f"{src}: file {shape if not transpose else tuple(reversed(shape))} "
                         f"vs model {tuple(leaf.shape)}{' (transposed)' if transpose else ''}")
  problems = []
  if missing:
    problems.append(f"missing tensors {missing[:10]}{' ...' if len(missing) > 10 else ''}")
  if unexpected:
    problems.append(f"unexpected tensors {unexpected[:10]}"
                    f"{' ...' if len(unexpected) > 10 else ''}")
  if bad_shape:
    problems.append(f"mis-shaped tensors {bad_shape[:10]}")
  if problems:
    raise CheckpointError(f"{hf_dir} does not match the configured {family!r} model: "
                          + "; ".join(problems) + " (check model.hf_family and the model.* "
                          "shapes against config.json)")
  return sources


def _load_leaf(reader, source, leaf, sharding):
  """One parameter: read shard by shard from its file tensor (`source` = (name, transpose)),
  or, without a source, `leaf` itself (placed on `sharding`)."""
  if source is None:
    return leaf if sharding is None else jax.device_put(leaf, sharding)
  src, transpose = source
  dtype = leaf.dtype

  def callback(index):
    block = reader.read(src, _transposed_index(index) if transpose else index)
    block = block.T if transpose else block
    return np.ascontiguousarray(block).astype(dtype)

  if sharding is None:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.make_array_from_callback(tuple(leaf.shape), sharding, callback)


def _infer_cfg(leaves: dict) -> ModelConfig:
  """The few ModelConfig facts the name rules need, read off the parameter tree."""
  n_layers = len({n.split(".")[1] for n in leaves if n.startswith("layers.")})
  qk_norm = any(".attn.q_norm." in n for n in leaves)
  tied = "lm_head.kernel" not in leaves
  return ModelConfig(vocab_size=0, d_model=0, n_layers=n_layers, n_heads=1, n_kv_heads=1,
                     head_dim=0, mlp_dim=0, mask_id=0, qk_norm=qk_norm, tie_embeddings=tied)


def _unflatten_like(tree: nnx.State, flat: dict) -> nnx.State:
  def pick(path, _):
    return flat[path_name(path)]
  return jax.tree_util.tree_map_with_path(pick, tree)


# ----------------------------------------------------------------------------- export


def export_hf(out_dir: str, params: nnx.State, cfg: ModelConfig, family: str, *,
              tokenizer_file: str | None = None, extra_config: dict | None = None,
              max_shard_bytes: int = 0) -> str:
  """Writes `params` as a HF model directory (config.json + safetensors, adapter separately).

  `max_shard_bytes > 0` splits the weights into `model-0000i-of-0000n.safetensors` files with an
  index. Writes into a temporary sibling folder, then renames it into place.
  """
  leaves = {n: np.asarray(jax.device_get(v)) for n, v in _flat_params(params).items()}
  rules = tensor_rules(family, cfg)
  base = {}
  for r in rules:
    if r.ours not in leaves:
      raise CheckpointError(f"export: parameter {r.ours!r} missing from the model state")
    x = leaves[r.ours]
    base[r.hf] = np.ascontiguousarray(x.T if r.transpose else x)
  ours = {r.ours for r in rules}
  adapter = {n: np.ascontiguousarray(v) for n, v in leaves.items() if n not in ours}
  not_adapter = [n for n in adapter if not n.startswith(ADAPTER_PREFIX)]
  if not_adapter:
    raise CheckpointError(f"export: parameters with no {family!r} name: {not_adapter[:8]}")
  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".hf-export-tmp-", dir=parent)
  _write_weights(tmp, base, max_shard_bytes)
  if adapter:
    save_file(adapter, os.path.join(tmp, ADAPTER_FILE))
  with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
    json.dump(hf_config_json(cfg, family, extra_config), f, indent=2)
  if tokenizer_file:
    import shutil
    shutil.copy(tokenizer_file, os.path.join(tmp, "tokenizer.json"))
  if os.path.exists(out_dir):
    import shutil
    old = out_dir.rstrip("/") + ".old"
    os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    shutil.rmtree(old, ignore_errors=True)
  else:
    os.replace(tmp, out_dir)
  return out_dir


def _write_weights(directory: str, tensors: dict[str, np.ndarray], max_shard_bytes: int):
  if max_shard_bytes <= 0:
    save_file(tensors, os.path.join(directory, SINGLE_FILE), metadata={"format": "pt"})
    return
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensors[name]
    size += nbytes
  shards.append(current)
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(directory, fname), metadata={"format": "pt"})
    weight_map.update({n: fname for n in shard})
  total = sum(t.nbytes for t in tensors.values())
  with open(os.path.join(directory, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def abstract_params(cfg: ModelConfig, seed: int = 0):
  """(graphdef, params State of ShapeDtypeStructs) without allocating the model."""
  from orl_jax.models.transformer import Transformer
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(seed)))
  return nnx.split(model, nnx.Param)


def load_model_params(hf_dir: str, family: str, cfg: ModelConfig, *, shardings=None,
                      seed: int = 0, check_config: bool = True):
  """(graphdef, params) of `cfg` with weights from `hf_dir`; a residual adapter absent from the
  directory keeps its zero-output initialisation (so the model equals the base model)."""
  from orl_jax.models.transformer import Transformer
  if check_config:
    check_architecture(cfg, hf_dir, family)
  graphdef, abstract = abstract_params(cfg, seed)
  if cfg.residual_mode == "adapter":
    # Only the adapter is initialised for real (it is small); everything else is read.
    fresh = nnx.state(Transformer(dataclasses.replace(cfg, n_layers=0, vocab_size=8,
                                                      tie_embeddings=True),
                                  rngs=nnx.Rngs(seed)), nnx.Param)
    fresh_flat = _flat_params(fresh)
    flat = _flat_params(abstract)
    for n in flat:
      if n.startswith(ADAPTER_PREFIX):
        flat[n] = fresh_flat[n]
    abstract = _unflatten_like(abstract, flat)
  params, _ = load_hf_params(hf_dir, family, abstract, shardings)
  return graphdef, params
