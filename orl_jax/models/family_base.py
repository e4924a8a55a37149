"""What a model family is (docs/code.md#adding-a-model-family): one `Family` object per HF
architecture, and one for our own models (`orl_jax.models.ours`, the default:
`model.hf_family = ""`).

A family says everything that differs between checkpoints of the one shared `Transformer`:
the HF `config.json` <-> ModelConfig fields (both directions), the tensor-name map with its
transposes, fused tensors and stacked experts (`TensorRule`), the partition rules of its
parameters, its attention layout, and the decoder defaults and special tokens its configs start
from. The loader, the exporter, the sharding and the run set-up read these objects through the
registry (`orl_jax.models.families`); nothing else branches on a family name. Each family is a
folder `orl_jax/models/<name>/` whose `FAMILY` the registry lists. A family describes
checkpoints, plus one pointer to how its models decode: `sampler`, the factory of its
`orl_jax.decode.sampler.Sampler` (None: the block-diffusion samplers), through which
`orl_jax.decode.build` builds every decoder and replay reads what the capture records.

The name map is a list of pieces: each `TensorRule` says that our parameter `ours` (or its slot
`expert` of a stacked `[E, ...]` array) equals the HF tensor `hf` (or the rows `rows` of a fused
HF tensor), transposed when `transpose`. A `stacked` rule maps an HF tensor that is itself
stacked over experts (`[E, out, in]`, DiffusionGemma's `experts.gate_up_proj`) to ours
(`[E, in, out]`): the leading axis is kept, `transpose` swaps the other two and `rows` index the
first of them — so one fused stacked tensor can feed several parameters (one-to-many).
Loading assembles a parameter from its pieces for any index (one device shard at a time);
exporting concatenates the pieces of each HF tensor. Both directions are the pure functions
below.

A family whose model is not the shared `Transformer` (DiffusionGemma) names its own config and
model classes (`config_from_hf`, `config_from_run`, `build_model`) and may carry HF tensors it
does not model through an export (`passthrough_prefixes`: a vision tower) and mark parameters
the optimizer must leave alone (`frozen`). Code that holds a model config of any family types it
`AnyModelConfig`; a `Family` is typed by its own config class (`Family[ModelConfig]`).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, NamedTuple, Protocol, TypeVar

import numpy as np
from jax.sharding import PartitionSpec as P

from orl_jax.models.transformer import ModelConfig

if TYPE_CHECKING:
  from orl_jax.decode.sampler import Sampler

# Attention layouts of DLM families (`model.attention`): a fully bidirectional canvas
# (LLaDA-8B), block-causal with bidirectional blocks and a KV cache (SDAR, LLaDA2.x), or a
# token-causal committed stream with a bidirectional canvas over it (DiffusionGemma).
ATTENTION_LAYOUTS = ("bidirectional", "block_causal", "token_causal")


class AnyModelConfig(Protocol):
  """The model config of any family: the shared Transformer's `ModelConfig` or a family's own
  class (DiffusionGemma's `DiffusionGemmaConfig`), a frozen dataclass. What only one of them has
  (`mask_id`, `moe`) is read where the family is known to be the shared Transformer's."""
  __dataclass_fields__: ClassVar[dict[str, Any]]

  @property
  def hf_family(self) -> str:
    """The registry family (`orl_jax.models.families`; '' for a model of ours)."""

  @property
  def vocab_size(self) -> int:
    """Rows of the embedding table."""

  @property
  def param_dtype(self) -> str:
    """The parameters' dtype ('float32', 'bfloat16')."""


ConfigT = TypeVar("ConfigT", bound=AnyModelConfig)   # the config class of one family


class TensorRule(NamedTuple):
  hf: str                                # HF tensor name
  ours: str                              # our flat (dot-joined) parameter name
  transpose: bool                        # PyTorch Linear [out, in] <-> NNX kernel [in, out]
  rows: tuple[int, int] | None = None    # rows [start, stop) of a fused HF tensor (dim 0)
  expert: int | None = None              # slot of our stacked [E, ...] parameter
  stacked: bool = False                  # both sides keep a leading [E] axis (see above)


def linear(hf: str, ours: str, **kw) -> TensorRule:
  return TensorRule(hf, ours, True, **kw)


def plain(hf: str, ours: str, **kw) -> TensorRule:
  return TensorRule(hf, ours, False, **kw)


@dataclasses.dataclass(frozen=True)
class Family(Generic[ConfigT]):
  """One model family, typed by its config class (`ModelConfig`, or the family's own).
  Callables take/return plain dicts and config objects (no I/O)."""
  name: str                                          # our key: model.hf_family ("": ours)
  model_types: tuple[str, ...]                       # HF config.json `model_type` values
                                                     # (none: no Hugging Face form, ours)
  attention: str                                     # one of ATTENTION_LAYOUTS ("": any,
                                                     # `model.attention` says; ours)
  architecture_from_hf: Callable[[dict], dict]       # config.json -> ModelConfig fields
  hf_config_json: Callable[[ConfigT], dict]          # its config -> config.json
  tensor_rules: Callable[[ConfigT], list]            # its config -> [TensorRule]
  partition_rules: tuple[tuple[str, P], ...]         # (regex on our name, PartitionSpec)
  special_tokens: dict                               # mask/eos/pad/bos: id strings or tokens
  decode: dict                                       # block_size, rule, rule_value defaults;
                                                     # the authors' block_placement and
                                                     # commit_compare (block decoder families)
  chat: str = "none"                                 # chat template of its instruct models
  ignored_hf: Callable[[ConfigT], frozenset] = lambda cfg: frozenset()
  # ^ HF tensors a checkpoint may hold that the model does not use (a tied copy of the head)
  ignored_keys: tuple[str, ...] = ()   # config.json keys the official modeling code never
                                       # reads (ignored here too; the run logs them once)
  # A family with its own model (None: the shared Transformer / ModelConfig):
  config_from_hf: Callable | None = None       # config.json dict -> the family's config object
  config_from_run: Callable | None = None      # (config.model, block_size=, vocab_size=,
                                               # hf_config=config.json dict or None, eos_ids=,
                                               # pad_id=) -> the family's config object
  build_model: Callable | None = None          # (config object, rngs) -> nnx.Module
  frozen: Callable[[str], bool] | None = None  # parameter names the optimizer must not update
  residual_modules: tuple[str, ...] = ("adapter",)  # the residual pathway's modules (its own
                                                   # learning rate, `model.residual.lr_scale`)
  passthrough_prefixes: tuple[str, ...] = ()   # HF tensors exported unchanged (not modelled)
  # decode.* field -> (generation_config.json key, the official default, > 0 (float) / >= 1
  # (int)): the decoder settings a config leaving them unset (None) takes from the directory's
  # generation_config.json, else from the official generation class
  # (`run_config.fill_decode_defaults`)
  generation_defaults: dict = dataclasses.field(default_factory=dict)
  # (run config, model config or None) -> the family's own `Sampler` (a family whose decoder is
  # not the block decoder, DiffusionGemma); None: the block-diffusion samplers
  # (`orl_jax.decode.block_sampler`)
  sampler: Callable[..., Sampler] | None = None
  # run-config section path -> frozen dataclass (`orl_jax.config.build`): the settings only this
  # family reads. A path naming an existing section ("decode") adds the dataclass's fields to
  # it; another path ("model.diffusion_gemma") adds a subsection of that name.
  config_sections: dict = dataclasses.field(default_factory=dict)
  # model_type -> {"architectures": [...], "auto_map": {...}} of the authors' own classes for
  # the model types transformers does not ship, as the released config.json declares them; an
  # export writes them so `trust_remote_code=True` finds the modeling files copied beside it
  remote_code: dict = dataclasses.field(default_factory=dict)

  @property
  def hf_checkpoint(self) -> bool:
    """Whether the family has a Hugging Face form (config.json, a name map) to load and export."""
    return bool(self.model_types)

  @property
  def own_model(self) -> bool:
    return self.build_model is not None


# ----------------------------------------------------------------------------- name map


def dense_rules(cfg: ModelConfig, layer: tuple, embed: str, norm: str, head: str) -> list:
  """The name map of a dense family: `layer` templates ({i} = layer index) for every layer,
  then the embedding, final norm and (untied) head, whose HF names are given."""
  rules = [r._replace(hf=r.hf.format(i=i), ours=r.ours.format(i=i))
           for i in range(cfg.n_layers) for r in layer]
  rules += [plain(embed, "embed.embedding"), plain(norm, "final_norm.weight")]
  if not cfg.tie_embeddings:
    rules.append(linear(head, "lm_head.kernel"))
  return rules


def _full_index(shape) -> tuple[slice, ...]:
  return tuple(slice(0, n) for n in shape)


def normalize_index(index, shape) -> tuple[slice, ...]:
  """`index` (None, or a tuple of step-1 slices, possibly open) as explicit [start, stop)."""
  if index is None:
    return _full_index(shape)
  index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
  return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))


def _swap(x: np.ndarray, rule: TensorRule) -> np.ndarray:
  """PyTorch layout <-> ours for one piece: all dims reversed, or (stacked) all but the first."""
  if not rule.transpose:
    return x
  return x.transpose((0,) + tuple(range(x.ndim - 1, 0, -1))) if rule.stacked else x.T


def read_piece(rule: TensorRule, read: Callable, index: tuple[slice, ...]) -> np.ndarray:
  """`ours[index]` of one piece (index over our dims without the expert slot);
  `read(hf_name, hf_index)` returns that slice of an HF tensor."""
  lead, index = (tuple(index[:1]), tuple(index[1:])) if rule.stacked else ((), tuple(index))
  hf_index = tuple(reversed(index)) if rule.transpose else tuple(index)
  if rule.rows is not None:
    first = hf_index[0]
    hf_index = (slice(rule.rows[0] + first.start, rule.rows[0] + first.stop),) + hf_index[1:]
  return _swap(read(rule.hf, lead + hf_index), rule)


def assemble(rules: list[TensorRule], read: Callable, shape, index=None) -> np.ndarray:
  """`ours[index]` of the parameter of shape `shape` made of `rules` (all with the same
  `ours`): one piece, or one piece per expert slot stacked on axis 0."""
  index = normalize_index(index, shape)
  if rules[0].expert is None:
    return read_piece(rules[0], read, index)
  by_slot = {r.expert: r for r in rules}
  return np.stack([read_piece(by_slot[e], read, index[1:])
                   for e in range(index[0].start, index[0].stop)])


def hf_shapes(rules: list[TensorRule], our_shapes: dict) -> dict[str, tuple[int, ...]]:
  """{HF name: the shape the configured model needs it to have} from our parameter shapes."""
  out: dict[str, tuple[int, ...]] = {}
  for r in rules:
    piece = tuple(our_shapes[r.ours])[1:] if r.expert is not None else tuple(our_shapes[r.ours])
    lead, piece = (piece[:1], piece[1:]) if r.stacked else ((), piece)
    shape = tuple(reversed(piece)) if r.transpose else piece
    if r.rows is not None:
      rows = max(r.rows[1], out.get(r.hf, lead + (0,))[len(lead)])
      shape = (rows,) + shape[1:]
    out[r.hf] = lead + shape
  return out


def params_to_hf(flat: dict, rules: list[TensorRule]) -> dict[str, np.ndarray]:
  """Our flat params -> HF tensors ([out, in] layout; fused pieces concatenated in row
  order, stacked experts split). Raises KeyError naming a parameter the rules need."""
  pieces: dict[str, list] = collections.defaultdict(list)   # [(row start, stacked, piece)]
  for r in rules:
    x = np.asarray(flat[r.ours])
    x = x if r.expert is None else x[r.expert]
    pieces[r.hf].append((r.rows[0] if r.rows else 0, r.stacked, _swap(x, r)))
  out = {}
  for name, parts in pieces.items():
    axis = int(parts[0][1])           # fused rows: dim 0, or dim 1 of a stacked tensor
    parts = [x for _, _, x in sorted(parts, key=lambda p: p[0])]
    out[name] = np.ascontiguousarray(parts[0] if len(parts) == 1
                                     else np.concatenate(parts, axis=axis))
  return out


def params_from_hf(tensors: dict, rules: list[TensorRule]) -> dict[str, np.ndarray]:
  """HF tensors -> our flat params (the inverse of `params_to_hf`). Raises ValueError naming
  missing and unexpected tensors."""
  expected = {r.hf for r in rules}
  missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
  if missing or unexpected:
    raise ValueError(f"HF tensors do not match the configured model: missing {missing[:8]}, "
                     f"unexpected {unexpected[:8]} (check the model.* shapes against "
                     "config.json)")
  read = lambda name, index: np.asarray(tensors[name])[index]
  groups = collections.defaultdict(list)
  for r in rules:
    groups[r.ours].append(r)
  flat = {}
  for ours, group in groups.items():
    first = group[0]
    hf_shape = tuple(np.shape(tensors[first.hf]))
    lead, hf_shape = (hf_shape[:1], hf_shape[1:]) if first.stacked else ((), hf_shape)
    if first.rows is not None:
      hf_shape = (first.rows[1] - first.rows[0],) + hf_shape[1:]
    piece = lead + (tuple(reversed(hf_shape)) if first.transpose else hf_shape)
    shape = piece if first.expert is None else (len(group),) + piece
    flat[ours] = np.ascontiguousarray(assemble(group, read, shape))
  return flat


def check_hf_shapes(rules: list[TensorRule], our_shapes: dict, file_shape: Callable) -> list:
  """'name: file (..) vs model (..)' for every HF tensor whose shape the model cannot take."""
  bad = []
  for name, want in hf_shapes(rules, our_shapes).items():
    got = tuple(file_shape(name))
    if got != want:
      bad.append(f"{name}: file {got} vs model {want}")
  return bad
