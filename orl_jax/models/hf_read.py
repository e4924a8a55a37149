"""Reading a local Hugging Face model directory into our Transformer
(docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm), for every registered family: config.json,
generation_config.json, the special tokens a directory declares, the family a directory holds, and
its weights.

A model directory holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and `tokenizer.json`. Nothing here imports torch or touches the
network: tensors are read with the safetensors numpy API, one slice per device shard
(`jax.make_array_from_callback`), so no process ever holds a full host copy of the model.

What differs between families (config.json keys, tensor names, transposes, fused QKV, stacked
experts) is in each family's folder (`orl_jax/models/<family>/`, listed in
`orl_jax.models.families`); this module only reads files (`hf_write` writes them). PyTorch
`Linear` weights are `[out, in]`; our NNX kernels are `[in, out]` (transposed on load). The
residual adapter (which no HF model has) is read from a separate `adapter.safetensors` under
our own names when the directory has one.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import os
import time
from typing import Any, Callable, cast

import jax
import numpy as np
from flax import nnx

from orl_jax.models import config_json, families
from orl_jax.models.build import abstract_params
from orl_jax.models import family_base
from orl_jax.models.family_base import AnyModelConfig, TensorRule
from orl_jax.models.moe import RUNTIME_FIELDS
from orl_jax.models.transformer import ModelConfig
from orl_jax.models.params_io import open_safetensors, read_json
from orl_jax.sharding import path_name

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ADAPTER_FILE = "adapter.safetensors"
ADAPTER_PREFIX = "adapter."
FAMILIES = tuple(families.FAMILIES)


class CheckpointError(ValueError):
  """A model directory that does not match the configured model; the message names the file."""


def checkpoint_family(name: str) -> families.Family:
  """The Hugging Face family `name`; a CheckpointError for an unknown name or for ours ('')."""
  try:
    family = families.get(name)
  except ValueError as e:
    raise CheckpointError(str(e)) from None
  if not family.hf_checkpoint:
    raise CheckpointError(f"model.hf_family={name!r} is a model of ours, which has no Hugging "
                          f"Face form: set model.hf_family to one of {FAMILIES}")
  return family


def tensor_rules(family: str, cfg: AnyModelConfig) -> list[TensorRule]:
  """Every piece of the name map of a base model of `cfg` (no adapter)."""
  return checkpoint_family(family).tensor_rules(cfg)


# ----------------------------------------------------------------------------- config.json


def architecture_from_hf(hf: dict, family: str) -> dict:
  """The ModelConfig fields a HF `config.json` determines (dict of field -> value)."""
  return checkpoint_family(family).architecture_from_hf(hf)


def read_hf_config(hf_dir: str) -> dict:
  path = os.path.join(hf_dir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise CheckpointError(f"{path} not found: model.path must be a local Hugging Face model "
                          "directory (config.json, *.safetensors, tokenizer.json)")
  return read_json_object(path)


# resolved path -> ((size, mtime_ns, inode), object): a directory's config.json and
# generation_config.json are parsed once per version, however many readers ask at set-up (its
# family, architecture, ignored keys, special tokens, generation defaults)
_JSON_CACHE: dict[str, tuple[tuple[int, int, int], dict]] = {}
_JSON_CACHE_ENTRIES = 64
# a file written this recently may be written again within the same mtime tick at the same size,
# which its version would not show: it is parsed again at every read until it has settled
_SETTLED_S = 2.0


def read_json_object(path: str) -> dict:
  """The JSON object in `path`, parsed once per version of the file (size, mtime, inode) and
  returned as a copy (a caller's edits stay its own); a truncated or non-JSON file is one
  ParamsFileError naming it."""
  real = os.path.realpath(path)
  st = os.stat(real)
  version = (st.st_size, st.st_mtime_ns, st.st_ino)
  cached = _JSON_CACHE.get(real)
  if cached is None or cached[0] != version:
    data = read_json(path)
    if time.time() - st.st_mtime < _SETTLED_S:
      return data
    if len(_JSON_CACHE) >= _JSON_CACHE_ENTRIES:
      _JSON_CACHE.clear()
    cached = _JSON_CACHE[real] = (version, data)
  return copy.deepcopy(cached[1])


def parse_config_json(hf_dir: str, parse: Callable[[dict], object]):
  """`parse(config.json of hf_dir)`; a field of the wrong type, out of range or unsupported
  (the ValueError `parse` raises) becomes one CheckpointError naming the file and the field."""
  path = os.path.join(hf_dir, CONFIG_FILE)
  hf = read_hf_config(hf_dir)
  try:
    return parse(hf)
  except ValueError as e:
    raise CheckpointError(f"{path}: {e}") from None


def generation_config(hf_dir: str, defaults: dict) -> dict:
  """{decode field: value} that `hf_dir`'s generation_config.json sets ({} without one) for
  the fields of `defaults` (a family's `generation_defaults`), each typed and range-checked;
  CheckpointError naming the file and field otherwise. A null field is unset, as
  `GenerationConfig.save_pretrained` writes every field it was not given (the default applies);
  keys no field reads (`transformers_version`, `_from_model_config`, ...) are ignored."""
  path = os.path.join(hf_dir, GENERATION_CONFIG_FILE) if hf_dir else ""
  if not path or not os.path.isfile(path):
    return {}
  data = read_json_object(path)
  try:
    nested = config_json.read_dict(data, "sampler_config")
    flat = dict(data, **{f"sampler_config.{k}": v for k, v in nested.items()})
    return {field: _generation_value(flat, key, default, strict)
            for field, (key, default, strict) in defaults.items()
            if flat.get(key) is not None}
  except ValueError as e:
    raise CheckpointError(f"{path}: {e}") from None


def _generation_value(flat: dict, key: str, default, strict: bool):
  if isinstance(default, float):
    return config_json.read_float(flat, key, default, positive=strict)
  return config_json.read_int(flat, key, default, minimum=int(strict))


def decode_defaults(decode, hf_dir: str, defaults: dict) -> tuple[dict, dict]:
  """({field: value}, {field: where its value came from}) for every field of `decode` (the
  run's decode section) that `defaults` names and the config leaves unset (None): from
  `hf_dir`'s generation_config.json, else the official default; `gen_length` is rounded up to
  whole blocks (`decode.block_size`)."""
  from_file = generation_config(hf_dir, defaults)
  values, origins = {}, {}
  for field, (key, default, _) in defaults.items():
    if getattr(decode, field, None) is not None:
      continue
    value, origins[field] = ((from_file[field], f"generation_config.json {key}")
                             if field in from_file else (default, "transformers' default"))
    if field == "gen_length":
      value = -(-value // decode.block_size) * decode.block_size
    values[field] = value
  return values, origins


def read_architecture(hf_dir: str, family: str) -> dict:
  """The ModelConfig fields of `hf_dir`'s config.json (every field typed and range-checked; a
  missing key takes the official configuration class's default)."""
  fam = checkpoint_family(family)
  return parse_config_json(hf_dir, fam.architecture_from_hf)


def ignored_settings(hf_dir: str, family: str) -> list[str]:
  """'key=value' of the config.json keys the official modeling code of `family` never reads
  (ignored here too)."""
  return config_json.present(read_hf_config(hf_dir), checkpoint_family(family).ignored_keys)


def family_of(hf_dir: str) -> str:
  """The registry name of the family that reads `hf_dir` (from its config.json `model_type`)."""
  try:
    return families.for_model_type(read_hf_config(hf_dir).get("model_type", ""),
                                   os.path.join(hf_dir, CONFIG_FILE)).name
  except ValueError as e:
    raise CheckpointError(str(e)) from None


# special-token roles whose ids a directory may declare, and the keys that declare them
SPECIAL_TOKEN_KEYS = {"mask": "mask_token_id", "eos": "eos_token_id", "pad": "pad_token_id",
                      "bos": "bos_token_id"}


def declared_special_tokens(hf_dir: str) -> dict[str, tuple[tuple[int, ...], str]]:
  """{role: (ids, where)} of the special-token ids `hf_dir` declares: generation_config.json
  first (what generation uses), then config.json (its top level, then its text_config); only
  `eos` may list several ids. CheckpointError naming the file for an id of the wrong type."""
  out = {}
  for fname in (GENERATION_CONFIG_FILE, CONFIG_FILE):
    path = os.path.join(hf_dir, fname)
    if not os.path.isfile(path):
      continue
    data = read_json_object(path)
    text = data.get("text_config")
    scopes = [(data, fname)] + ([(text, f"{fname} text_config")] if isinstance(text, dict)
                                else [])
    for role, key in SPECIAL_TOKEN_KEYS.items():
      for scope, where in scopes:
        if role in out:
          break
        try:
          ids = config_json.read_ids(scope, key, None)
          if ids is not None and len(ids) > 1 and role != "eos":
            raise config_json.ConfigJsonError(f"{key}={list(ids)} must be a single token id")
        except ValueError as e:
          raise CheckpointError(f"{path}: {e}") from None
        if ids is not None:
          out[role] = (ids, where)
  return out


def _same(ours, theirs) -> bool:
  """Architecture equality: floats relatively, MoE settings without the run-time choices."""
  if isinstance(theirs, float):
    return abs(float(ours) - theirs) <= 1e-12 * max(1.0, abs(theirs))
  if dataclasses.is_dataclass(theirs) and dataclasses.is_dataclass(ours):
    runtime = {f: getattr(ours, f) for f in RUNTIME_FIELDS}
    # `theirs` is a dataclass instance (a MoEConfig), never a class
    return dataclasses.replace(cast(Any, theirs), **runtime) == ours
  return ours == theirs


def check_architecture(cfg: AnyModelConfig, hf_dir: str, family: str) -> None:
  """Raises CheckpointError naming every model.* field that disagrees with config.json."""
  want = read_architecture(hf_dir, family)
  bad = [f"model.{field}={getattr(cfg, field)!r} but config.json says {value!r}"
         for field, value in want.items() if not _same(getattr(cfg, field), value)]
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
    self._open: dict[str, Any] = {}   # path -> its open safetensors file

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
    return sl[tuple(index)] if index is not None else sl[:]


def flat_params(params: nnx.State) -> dict:
  """{our dot-joined name ('layers.0.attn.q_proj.kernel'): leaf}."""
  return {path_name(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


def _unflatten_like(tree: nnx.State, flat: dict) -> nnx.State:
  def pick(path, _):
    return flat[path_name(path)]
  return jax.tree_util.tree_map_with_path(pick, tree)


def _adapter_files(hf_dir: str) -> dict[str, str]:
  """{our adapter name: file} of the directory's adapter.safetensors (if any)."""
  path = os.path.join(hf_dir, ADAPTER_FILE)
  if not os.path.isfile(path):
    return {}
  with open_safetensors(path) as f:
    return {name: path for name in f.keys()}


def load_hf_params(hf_dir: str, family: str, cfg: AnyModelConfig, abstract_params: nnx.State,
                   shardings=None, *, allow_missing: Callable[[str], bool] | None = None):
  """Reads a HF checkpoint into a params State shaped like `abstract_params`.

  Args:
    hf_dir: local model directory.
    family: a registry name (`orl_jax.models.families.FAMILIES`).
    cfg: the configured model (decides the name map).
    abstract_params: `nnx.State` of the model (ShapeDtypeStructs or arrays).
    shardings: a matching tree of `jax.sharding.Sharding` (None: default device placement).
      Each device shard is read from disk on its own (fused and stacked tensors too); no full
      host copy is made.
    allow_missing: our names that may be absent (kept from `abstract_params`, which must then
      hold arrays); by default the residual adapter (`adapter.*`).

  Returns:
    (params, kept): the State with loaded arrays, and names that kept their given value.

  Raises:
    CheckpointError: listing missing, unexpected and mis-shaped tensors.
  """
  allow_missing = allow_missing or (lambda name: name.startswith(ADAPTER_PREFIX))
  leaves = flat_params(abstract_params)
  files = weight_files(hf_dir)
  adapter = _adapter_files(hf_dir)
  reader = _Reader({**files, **adapter})
  sources = _tensor_sources(hf_dir, family, cfg, leaves, files, adapter, reader, allow_missing)
  flat_sh = flat_params(shardings) if shardings is not None else {}
  kept = sorted(name for name in leaves if name not in sources)
  loaded = {name: _load_leaf(reader, sources.get(name), leaf, flat_sh.get(name))
            for name, leaf in leaves.items()}
  return _unflatten_like(abstract_params, loaded), kept


def _problems(missing: list, unexpected: list, bad_shape: list) -> list[str]:
  more = lambda xs: " ..." if len(xs) > 10 else ""
  out = []
  if missing:
    out.append(f"missing tensors {missing[:10]}{more(missing)}")
  if unexpected:
    out.append(f"unexpected tensors {unexpected[:10]}{more(unexpected)}")
  if bad_shape:
    out.append(f"mis-shaped tensors {bad_shape[:10]}")
  return out


def _tensor_sources(hf_dir: str, family: str, cfg: AnyModelConfig, leaves: dict, files: dict,
                    adapter: dict, reader, allow_missing) -> dict:
  """{our name: [TensorRule]} for every parameter the files hold (adapter tensors are their own
  plain piece); raises CheckpointError listing missing, unexpected and mis-shaped tensors."""
  fam = checkpoint_family(family)
  groups = collections.defaultdict(list)
  for r in fam.tensor_rules(cfg):
    groups[r.ours].append(r)
  unexpected = sorted(n for n in set(files) - {r.hf for g in groups.values() for r in g}
                      - fam.ignored_hf(cfg) if not n.startswith(fam.passthrough_prefixes))
  missing, sources = [], {}
  for name in leaves:
    group = groups.get(name, [])
    absent = [r.hf for r in group if r.hf not in files]
    if group and not absent:
      sources[name] = group
    elif name in adapter:
      sources[name] = [TensorRule(name, name, False)]
    elif not allow_missing(name):
      missing += absent or [name]
  present = [r for g in sources.values() for r in g]
  shapes = {name: tuple(leaves[name].shape) for name in sources}
  bad_shape = family_base.check_hf_shapes(present, shapes, reader.shape)
  problems = _problems(sorted(set(missing)), unexpected, bad_shape)
  if problems:
    raise CheckpointError(f"{hf_dir} does not match the configured {family!r} model: "
                          + "; ".join(problems) + " (check model.path and the model.* "
                          "settings against config.json)")
  return sources


def _load_leaf(reader, rules, leaf, sharding):
  """One parameter: assembled shard by shard from its pieces (`rules`), or, without any,
  `leaf` itself (placed on `sharding`)."""
  if rules is None:
    return leaf if sharding is None else jax.device_put(leaf, sharding)
  shape, dtype = tuple(leaf.shape), leaf.dtype

  def callback(index):
    block = family_base.assemble(rules, reader.read, shape, index)
    return np.ascontiguousarray(block).astype(dtype)

  if sharding is None:
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.make_array_from_callback(shape, sharding, callback)


def read_passthrough(hf_dir: str, family: str) -> dict[str, np.ndarray]:
  """The tensors of `hf_dir` the family carries through an export unchanged (a vision tower
  the model does not use); {} without a directory or such tensors."""
  prefixes = checkpoint_family(family).passthrough_prefixes
  if not hf_dir or not prefixes:
    return {}
  reader = _Reader(weight_files(hf_dir))
  return {name: reader.read(name) for name in reader.files if name.startswith(prefixes)}


def load_model_params(hf_dir: str, family: str, cfg: AnyModelConfig, *, shardings=None,
                      seed: int = 0, check_config: bool = True):
  """(graphdef, params) of `cfg` with weights from `hf_dir`; a residual adapter absent from the
  directory keeps its zero-output initialisation (so the model equals the base model)."""
  from orl_jax.models.transformer import Transformer
  if check_config:
    check_architecture(cfg, hf_dir, family)
  graphdef, abstract = abstract_params(cfg, seed)
  if getattr(cfg, "residual_mode", "") == "adapter":   # a ModelConfig: only it has one
    # Only the adapter is initialised for real (it is small); everything else is read.
    fresh = nnx.state(Transformer(dataclasses.replace(cast(ModelConfig, cfg), n_layers=0,
                                                      vocab_size=8, tie_embeddings=True),
                                  rngs=nnx.Rngs(seed)), nnx.Param)
    fresh_flat = flat_params(fresh)
    flat = flat_params(abstract)
    for n in flat:
      if n.startswith(ADAPTER_PREFIX):
        flat[n] = fresh_flat[n]
    abstract = _unflatten_like(abstract, flat)
  params, _ = load_hf_params(hf_dir, family, cfg, abstract, shardings)
  return graphdef, params
