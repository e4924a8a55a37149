"""The run config's sections: frozen dataclasses with the defaults of every setting, and
`convert`, which turns the command line's `ml_collections.ConfigDict` into a `RunConfig`
(unknown fields and values of the wrong type gathered into one `ConfigError`).

`orl_jax.config.build.build` is what a run calls: it converts, resolves the weights' family and
its decode defaults, and checks every rule (`orl_jax.config.derive.validate`). Sections read as the
ConfigDict did (`run.decode.block_size`); a changed copy is
`run.replace(**{"decode.rule": "threshold"})`; `run.to_dict()` is the plain nested dict. A
registry family adds the settings only it reads (`Family.config_sections`: DiffusionGemma's
`model.diffusion_gemma` and its sampler's `decode.t_min` ...), so no family is named here. A
default written `recorded(...)` marks a setting that decides what a run's rollouts are and how
they are replayed and scored: checkpoints record it (`orl_jax.setup.recorded`).
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any, Literal, Mapping, TypeVar, cast

from orl_jax.decode.config import CacheMode, Schedule
from orl_jax.errors import ConfigError
from orl_jax.losses import KlReference
from orl_jax.models import families
from orl_jax.replay.plan import ReplayLayout
from orl_jax.residual import ResidualMode
from orl_jax.unmasking import RuleName


_EXTRA = "extra"

# train.mode: what a run trains (docs/training.md), one of the modes `train()` runs, or "eval":
# a config that only evaluates (launch/eval.py, a trained run's settings), which `train()` refuses
TrainMode = Literal["sft", "residual_warmup", "orl", "rcd_offline"]
Mode = Literal[TrainMode, "eval"]
# orl.chunk_by: what a rollout chunk holds (docs/training.md#verification-overlapped-with-decoding)
ChunkBy = Literal["samples", "prompts"]
# task.verify_isolation: what a code sample shares with the other samples of its prompt
# (docs/verifier.md#threat-model); orl_jax/verify/humaneval.py ISOLATIONS holds the same values
VerifyIsolation = Literal["sample", "prompt"]


S = TypeVar("S")


@dataclasses.dataclass(frozen=True)
class Section:
  """A frozen config section; `extra` holds the fields and subsections a family declares
  (`Family.config_sections`), which the family reads back typed with `family_settings`."""
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, kw_only=True, repr=False,
                                                hash=False, compare=True)

  def family_settings(self, cls: type[S], name: str | None = None) -> S:
    """A family's settings of this section as its own frozen dataclass `cls`: the subsection
    `name` (`config.model.family_settings(ArchitectureSettings, "diffusion_gemma")`), or,
    without a name, `cls`'s fields declared flat in this section
    (`config.decode.family_settings(SamplerSettings)` for `decode.t_min` ...). A KeyError
    names what the section does not hold: the family's settings exist only in a run config
    built for that family."""
    if name is not None:
      value = self.extra[name]
      if not isinstance(value, cls):
        raise TypeError(f"{type(self).__name__}.{name} is a {type(value).__name__}, not {cls}")
      return value
    fields = dataclasses.fields(cast(Any, cls))
    return cls(**{f.name: self.extra[f.name] for f in fields})

  def to_dict(self) -> dict:
    """The section as a plain nested dict (a family's fields included), as the ConfigDict's
    `to_dict()` gave it."""
    out = {}
    for f in dataclasses.fields(self):
      if f.name != _EXTRA:
        out[f.name] = _plain(getattr(self, f.name))
    out.update({k: _plain(v) for k, v in self.extra.items()})
    return out

  def replace(self, **changes):
    """A copy with `changes`; a dotted name ("decode.rule") reaches into a subsection."""
    return _replace(self, changes)


def _plain(value):
  if isinstance(value, Section):
    return value.to_dict()
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return dataclasses.asdict(value)
  if isinstance(value, Mapping):
    return {k: _plain(v) for k, v in value.items()}
  return value


def _replace(section, changes: Mapping[str, Any]):
  own: dict[str, Any] = {}
  nested: dict[str, dict[str, Any]] = {}
  extra = dict(getattr(section, _EXTRA, {}))
  names = {f.name for f in dataclasses.fields(section)}
  for key, value in changes.items():
    head, _, rest = key.partition(".")
    if rest:
      nested.setdefault(head, {})[rest] = value
    elif head in names:
      own[head] = value
    elif head in extra:
      extra[head] = value
    else:
      raise ConfigError(f"{type(section).__name__} has no field {head!r}")
  for head, sub in nested.items():
    if head in names:
      own[head] = _replace(getattr(section, head), sub)
    elif head in extra:
      extra[head] = _replace(extra[head], sub)
    else:
      raise ConfigError(f"{type(section).__name__} has no section {head!r}")
  if extra != dict(getattr(section, _EXTRA, {})):
    own[_EXTRA] = dict(extra)
  return dataclasses.replace(section, **own)


RECORDED = "recorded"


def recorded(default: Any) -> Any:
  """The default of a setting that decides what a run's rollouts are and how they are replayed
  and scored: a run's checkpoints record its resolved value and a resume compares it
  (`orl_jax.setup.recorded`, docs/training.md#resume-and-changed-settings)."""
  return dataclasses.field(default=default, metadata={RECORDED: True})


def recorded_fields(section: Section, prefix: str = "") -> dict[str, Any]:
  """{dotted name: value} of the fields of `section` and its subsections marked `recorded`, in
  their declaration order."""
  out: dict[str, Any] = {}
  for f in dataclasses.fields(section):
    value = getattr(section, f.name)
    if f.metadata.get(RECORDED):
      out[prefix + f.name] = value
    elif isinstance(value, Section):
      out.update(recorded_fields(value, f"{prefix}{f.name}."))
  return out


def _frozen(default):
  return dataclasses.field(default_factory=lambda: dict(dict(default)))


def _section(cls):
  return dataclasses.field(default_factory=cls)


# ---------------------------------------------------------------------------------- sections
# Defaults: the embedded tiny model's (configs/tiny.py, where every field is explained); the
# fields a real model's config adds (configs/dlm_common.py) default to "not set".

@dataclasses.dataclass(frozen=True)
class Residual(Section):
  mode: ResidualMode = recorded("none")  # none | adapter | rcd
  hidden: int = 128                  # adapter width (0 = d_model)
  scale: float = recorded(1.0)
  temperature: float = recorded(1.0)
  lr_scale: float = 0.1


@dataclasses.dataclass(frozen=True)
class Moe(Section):
  n_experts: int = 0                 # 0 = a dense model
  top_k: int = 0
  expert_dim: int = 0
  n_group: int = 1
  topk_group: int = 1
  n_shared: int = 0
  routed_scaling_factor: float = 1.0
  impl: str = "dense"                # ragged | dense (configs/dlm_common.py: ragged)
  freeze_router: bool = False
  exchange: str = "auto"


@dataclasses.dataclass(frozen=True)
class SpecialTokens(Section):
  mask: str = recorded("")           # a token, an id, or ids separated by commas ("" = unset)
  eos: str = recorded("")
  pad: str = ""
  bos: str = ""


@dataclasses.dataclass(frozen=True)
class Model(Section):
  attention: str = "block_causal"
  d_model: int = 128
  n_layers: int = 4
  n_heads: int = 4
  n_kv_heads: int = 2
  head_dim: int = 32
  mlp_dim: int = 384
  rope_theta: float = 10000.0
  rope_fraction: float = 1.0
  norm_eps: float = 1e-6
  qk_norm: bool = True
  tie_embeddings: bool = False
  embed_scale: float = 1.0
  dtype: str = "float32"
  param_dtype: str = "float32"
  attention_impl: str = "auto"
  remat: bool = False
  path: str = recorded("")
  init_from: str = ""
  residual: Residual = _section(Residual)
  hf_family: str = recorded("")      # the registry family the config is written for
  hf_model_type: str = ""
  hub_id: str = ""
  vocab_size: int = recorded(0)      # 0 = the tokenizer's
  tokenizer: str = recorded("")
  special_tokens: SpecialTokens = _section(SpecialTokens)
  first_k_dense: int = 0
  norm_head: bool = False
  moe: Moe = _section(Moe)


@dataclasses.dataclass(frozen=True)
class Task(Section):
  name: str = recorded("tiny")
  prompt_len: int = recorded(32)
  tiny: Mapping[str, Any] = _frozen({})   # data/tiny_task.py TinyTaskConfig fields
  chat: str = recorded("none")
  path: str = recorded("")
  k_shot: int = 0
  verify_workers: int = 0   # sandboxed code samples verified at once; 0 = the host's usable cores
  verify_cpu_s: int = 3     # a code sample's CPU seconds (its wall timeout stays 10 s)
  # A problem with a reference solution: its samples' CPU seconds are max(floor, factor × the
  # reference's measured CPU seconds), the wall timeout 7 s above (docs/verifier.md); factor 0:
  # every problem keeps verify_cpu_s. EvalPlus's factor 4. A floor of 1 s: the HumanEval
  # canonical solutions measure 0.035-0.14 s (the sandbox's, judge's and sample's CPU; idle or
  # beside two busy loops on 2 cores), so get 7x or more, except HumanEval/75 (0.31-0.41 s),
  # whose 4x rounds up to 2 s; every one scores 1 under its limit on that loaded machine.
  verify_time_factor: float = 4.0
  verify_time_floor_s: float = 1.0
  # "sample": a prompt's samples verified side by side; "prompt": one at a time, in slots
  verify_isolation: VerifyIsolation = "sample"


@dataclasses.dataclass(frozen=True)
class Decode(Section):
  block_size: int = recorded(32)
  gen_length: int | None = recorded(32)  # None: the family's generation default
  rule: RuleName = "threshold"
  rule_value: float | None = 0.9
  temperature: float = 0.0
  max_steps_per_block: int | None = recorded(0)
  top_k: int = recorded(16)
  edit_threshold: float = recorded(1.0)
  max_post_edit_steps: int = recorded(0)
  cache: CacheMode = "none"
  schedule: Schedule = "lockstep"
  block_placement: str = recorded("auto")
  commit_compare: str = recorded("auto")
  eos_early_stop: bool = True


@dataclasses.dataclass(frozen=True)
class Train(Section):
  mode: Mode = recorded("sft")
  steps: int = 4000
  batch_size: int = 64
  lr: float = 2e-3
  warmup_steps: int = 200
  final_lr_fraction: float = 0.05
  b1: float = 0.9
  b2: float = 0.98
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  freeze_base: bool = False
  log_every: int = 50
  shuffle_seed: int = -1
  self_condition_probability: float = 0.5


@dataclasses.dataclass(frozen=True)
class Orl(Section):
  prompts_per_step: int = 8
  group_size: int = recorded(8)
  rollout_temperature: float = recorded(1.0)
  rollout_rule: RuleName = recorded("threshold")
  rollout_rule_value: float = recorded(0.9)
  min_reward: float = recorded(1.0)
  capture_states: int = recorded(0)
  rollout_seed: int = -1
  rollout_rows: int = 0
  capture_routes: bool = recorded(False)
  rollout_chunks: int = 1
  chunk_by: ChunkBy = "samples"
  verify_while_decoding: bool = True
  rollout_segment_iterations: int = 16
  max_staleness: int = recorded(0)
  prefill_once: bool = False


@dataclasses.dataclass(frozen=True)
class Replay(Section):
  row_len: int = 544
  n_rows: int = 16
  max_states: int = 320
  max_responses: int = 64
  states_per_response: int = recorded(4)
  layout: ReplayLayout = recorded("packed")
  micro_batches: int = 1


@dataclasses.dataclass(frozen=True)
class Loss(Section):
  gate_entropy: float = recorded(0.05)
  aec_rho: float = recorded(0.25)
  conf_entropy: float = recorded(0.1)
  kl_cap: float = recorded(1.0)
  w_aec: float = recorded(1.0)
  w_kl: float = recorded(1.0)
  vocab_chunk: int = 0
  kl_reference: KlReference = recorded("initial")
  term_grad_norms: bool = False


@dataclasses.dataclass(frozen=True)
class Eval(Section):
  n_problems: int = 2048
  batch_size: int = 256
  settings: tuple[str, ...] = ("threshold_0.9", "threshold_0.7", "entropy_budget_0.5")
  name: str = ""
  compare: str = ""
  random_init: bool = False


@dataclasses.dataclass(frozen=True)
class Serve(Section):
  """The server (launch/serve.py, docs/serving.md)."""
  rows: int = 16
  iterations_per_call: int = 8
  waiting_slots: int = 0
  prompt_pool: int = 16
  max_waiting: int = 256
  model_name: str = ""
  watch: str = ""
  watch_seconds: float = 10.0
  max_body_bytes: int = 1 << 20     # a request body past this is a 413 (nginx's default, 1 MiB)
  # seconds a client may take: to send its request head, between two parts of its body, and
  # idle between requests on a kept-alive connection (uvicorn's timeout_keep_alive is 5 s)
  header_timeout: float = 10.0
  body_timeout: float = 30.0
  idle_timeout: float = 5.0
  drain_timeout: float = 30.0       # SIGTERM: seconds the requests in flight get, then exit
  api_keys: str = ""                # comma-separated keys /v1/* takes ("": open; serve.keys)
  admin_keys: str = ""              # comma-separated keys /v1/admin/* takes ("": off)
  reload_root: str = ""             # the folder reloads may come from ("": none)
  key_probes: bool = False          # /health and /metrics take an API key too


@dataclasses.dataclass(frozen=True)
class Checkpoint(Section):
  every: int = 500
  keep: int = 2
  save_rollouts: bool = False
  allow_changed: str = ""


@dataclasses.dataclass(frozen=True)
class Dcn(Section):
  data: int = 1
  fsdp: int = 1
  tensor: int = 1


@dataclasses.dataclass(frozen=True)
class Mesh(Section):
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  expert: int = 1
  dcn: Dcn = _section(Dcn)


@dataclasses.dataclass(frozen=True)
class Distributed(Section):
  mode: str = "auto"
  coordinator: str = ""
  num_processes: int = 0
  process_id: int = -1


@dataclasses.dataclass(frozen=True)
class Demo(Section):
  """The demo pipeline's own settings (orl_jax/apps/demo.py, docs/method.md): the stages it
  trains, the model each starts from, the committed checkpoints it reuses, its seeds."""
  compare_offline: bool = False
  ablations: tuple[str, ...] = ()
  stages: Mapping[str, Any] = _frozen({})
  stage_start: Mapping[str, Any] = _frozen({})
  base_checkpoint: str = ""
  warmup_checkpoint: str = ""
  seeds: tuple[int, ...] = ()
  warmup_seed: int = -1


@dataclasses.dataclass(frozen=True)
class RunConfig(Section):
  """A whole run: what `launch/train.py --config=...` describes, resolved and checked."""
  seed: int = 0
  workdir: str = "work_dirs/tiny"
  dry_run: bool = False
  pipeline: str = "train"
  model: Model = _section(Model)
  task: Task = _section(Task)
  decode: Decode = _section(Decode)
  train: Train = _section(Train)
  orl: Orl = _section(Orl)
  replay: Replay = _section(Replay)
  loss: Loss = _section(Loss)
  eval: Eval = _section(Eval)
  serve: Serve = _section(Serve)
  checkpoint: Checkpoint = _section(Checkpoint)
  mesh: Mesh = _section(Mesh)
  distributed: Distributed = _section(Distributed)
  demo: Demo = _section(Demo)


# ------------------------------------------------------------------------------ conversion

def _type_error(value, hint) -> str | None:
  """Why `value` is not a `hint` (None when it is): bool, int, float (an int too), str,
  `X | None`, `tuple[X, ...]`, Mapping, a Literal (its values' type; which values, the rules
  check)."""
  args = typing.get_args(hint)
  if typing.get_origin(hint) is Literal:     # the allowed values: the rule's check (config.py)
    return _type_error(value, type(args[0]))
  if type(None) in args:
    return None if value is None else _type_error(value, next(a for a in args
                                                              if a is not type(None)))
  origin = typing.get_origin(hint)
  if origin is tuple:
    if not isinstance(value, (tuple, list)):
      return f"a tuple, got {value!r}"
    return next((e for e in (_type_error(v, args[0]) for v in value) if e), None)
  if hint is Mapping or isinstance(origin, type) and issubclass(origin, Mapping):
    return None if _mapping(value) is not None else f"a section, got {value!r}"
  if hint is bool:
    return None if isinstance(value, bool) else f"True or False, got {value!r}"
  if hint is int:
    return None if isinstance(value, int) and not isinstance(value, bool) else (
        f"an integer, got {value!r}")
  if hint is float:
    return None if isinstance(value, (int, float)) and not isinstance(value, bool) else (
        f"a number, got {value!r}")
  if hint is str:
    return None if isinstance(value, str) else f"a string, got {value!r}"
  return None


def _value(value, hint):
  """A config value as a section holds it: sequences as tuples, sections as plain dicts."""
  if typing.get_origin(hint) is tuple or isinstance(value, list):
    return tuple(value)
  mapping = _mapping(value)
  return value if mapping is None else {k: _value(v, Any) for k, v in mapping.items()}


def _mapping(value) -> Mapping | None:
  if isinstance(value, Mapping):
    return value
  to_dict = getattr(value, "to_dict", None)
  return to_dict() if callable(to_dict) else None


def _convert(cls, data, path: str, extras: Mapping[str, type], errors: list[str]):
  """`cls` (a dataclass) from mapping `data`; problems appended to `errors`."""
  mapping = _mapping(data)
  if mapping is None:
    errors.append(f"{path or 'the config'} must be a section (a ConfigDict), got {data!r}")
    return cls()
  hints = typing.get_type_hints(cls)
  own = {f.name: f for f in dataclasses.fields(cls) if f.name != _EXTRA}
  merged = [c for p, c in extras.items() if p == path]       # fields joining this section
  merged_hints = {k: v for c in merged for k, v in typing.get_type_hints(c).items()}
  subsections = {p.rpartition(".")[2]: c for p, c in extras.items()    # sections of their own
                 if p != path and p.rpartition(".")[0] == path and p.rpartition(".")[2] not in own}
  kwargs: dict[str, Any] = {}
  extra: dict[str, Any] = {}
  for key, value in mapping.items():
    name = f"{path}.{key}" if path else key
    if key in own or key in merged_hints:
      hint = hints.get(key, merged_hints.get(key))
      if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        (kwargs if key in own else extra)[key] = _convert(hint, value, name, extras, errors)
        continue
      why = _type_error(value, hint)
      if why:
        errors.append(f"{name} must be {why}")
        continue
      (kwargs if key in own else extra)[key] = _value(value, hint)
    elif key in subsections:
      extra[key] = _convert(subsections[key], value, name, extras, errors)
    else:
      known = sorted(set(own) | set(merged_hints) | set(subsections))
      near = difflib.get_close_matches(key, known, n=3)
      errors.append(f"{name} is not a setting" + (f" (did you mean {', '.join(near)}?)" if near
                                                  else f" of {path or 'the config'}"))
  for c in merged:
    for f in dataclasses.fields(c):
      if f.name not in extra and f.name not in kwargs:
        extra[f.name] = getattr(c(), f.name)
  for key, c in subsections.items():
    extra.setdefault(key, c())
  if issubclass(cls, Section):
    kwargs[_EXTRA] = dict(extra)
  return cls(**kwargs)


def _family_sections(mapping: Mapping, other_family: str = "") -> dict[str, type]:
  """{section path: dataclass} the config's family (`model.hf_family`) and `other_family` (the
  weights' family) declare (`Family.config_sections`)."""
  model = _mapping(mapping.get("model", {})) or {}
  out: dict[str, type] = {}
  for name in (model.get("hf_family", ""), other_family):
    try:
      out.update(families.get(name).config_sections)
    except ValueError:                   # an unknown family: `validate` names it
      pass
  return out


def convert(config, *, other_family: str = "") -> RunConfig:
  """`config` (a ConfigDict or a nested mapping) as a RunConfig, with the defaults for what it
  leaves out and the settings of its family and of `other_family` (the weights' family, when
  it is another); no family resolution, no rule checks (`orl_jax.config.build.build` does both).
  ConfigError listing every unknown field and every value of the wrong type."""
  if isinstance(config, RunConfig):
    return config
  mapping = _mapping(config)
  if mapping is None:
    raise ConfigError(f"a run config is a ConfigDict, got {type(config).__name__}")
  errors: list[str] = []
  run = _convert(RunConfig, mapping, "", _family_sections(mapping, other_family), errors)
  _raise(errors)
  return run


def _raise(errors: list[str]) -> None:
  if len(errors) == 1:
    raise ConfigError(f"invalid config: {errors[0]}")
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))


