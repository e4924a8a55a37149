"""Every setting's default is written once, in its run-config section (orl_jax/config/sections.py).

configs/tiny.py restates every default with a comment per line: its base config must equal the
sections' defaults field by field (a line changed in one place only fails here). The runtime
dataclasses built from a section (`LossConfig`, `ReplayConfig`, `OptimizerConfig`) carry no
default of their own for a section's field: the source scan below fails when one appears. The
model's and the decoders' own config classes, which loaders and tests build directly, may keep a
default for a section's field only with the section's value (`STILL_RESTATED`: a different one
fails), and none for a field whose section value the run resolves (the commit rule, the block
rules, `model.qk_norm`)."""
import ast
import dataclasses
import importlib
import pathlib
import typing

import pytest

from configs import tiny
from orl_jax.config import derive as config_lib
from orl_jax.config import sections as cs
from orl_jax.config import build as run_config
from orl_jax.decode import config as decode_config
from orl_jax.losses import KL_REFERENCES, LossConfig
from orl_jax.replay import plan
from orl_jax import residual, unmasking

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The fields tiny's base sets on purpose to other values than the sections' defaults: the demo
# pipeline's own settings (its committed checkpoints and its stages) and the tiny task's knobs
# (TinyTaskConfig's fields, not a section's).
TINY_OWN = {"demo.base_checkpoint", "demo.warmup_checkpoint", "demo.stages", "demo.stage_start",
            "task.tiny"}

# Dataclass fields in orl_jax/ that share a name with a section field but are another thing.
NOT_SETTINGS = {
    ("orl_jax/apps/trajectory_view.py", "Decoded", "block_size"),
    ("orl_jax/models/family_base.py", "TensorRule", "rows"),
    ("orl_jax/models/family_base.py", "TensorRule", "expert"),
    ("orl_jax/models/family_base.py", "Family", "chat"),
    ("orl_jax/unmasking.py", "UnmaskRule", "name"),
}
# Runtime classes that still restate a section's default (built from the section in
# orl_jax/config/derive.py, but also constructed directly by the model loaders and many tests),
# each with the sections it is built from: a restated default must equal that section's. The list
# may only shrink: a new restated default fails the scan.
BUILT_FROM = {"ModelConfig": (cs.Model,), "MoEConfig": (cs.Moe,), "AttentionSpec": (cs.Model,),
              "DiffusionGemmaConfig": (cs.Model,), "DecodeConfig": (cs.Decode, cs.Orl),
              "SamplerConfig": (cs.Decode, cs.Orl)}
STILL_RESTATED = {
    "orl_jax/decode/config.py:DecodeConfig", "orl_jax/models/moe.py:MoEConfig",
    "orl_jax/models/transformer.py:ModelConfig",
    "orl_jax/models/diffusion_gemma/config.py:AttentionSpec",
    "orl_jax/models/diffusion_gemma/config.py:DiffusionGemmaConfig",
    "orl_jax/models/diffusion_gemma/sampler.py:SamplerConfig",
}


def _leaves(section: cs.Section, prefix: str = "") -> dict[str, object]:
  """{dotted field: value} of a section and its subsections (family fields left out)."""
  out: dict[str, object] = {}
  for f in dataclasses.fields(section):
    if f.name == "extra":
      continue
    value = getattr(section, f.name)
    if isinstance(value, cs.Section):
      out.update(_leaves(value, f"{prefix}{f.name}."))
    else:
      out[f"{prefix}{f.name}"] = value
  return out


def _stated(config, prefix: str = "") -> set[str]:
  """The dotted fields a ConfigDict states."""
  out = set()
  for key, value in config.items():
    if hasattr(value, "items") and f"{prefix}{key}" not in TINY_OWN:
      out |= _stated(value, f"{prefix}{key}.")
    else:
      out.add(f"{prefix}{key}")
  return out


def test_tiny_restates_every_section_default_with_the_same_value():
  base = tiny.base_config()
  stated = _leaves(cs.convert(base))
  defaults = _leaves(cs.RunConfig())
  differ = {k: (stated[k], defaults[k]) for k in defaults
            if k not in TINY_OWN and stated[k] != defaults[k]}
  assert not differ, f"configs/tiny.py and the section defaults disagree: {differ}"
  # the method's sections in full (a real model's fields, model.*, it may leave out)
  full = {k for k in defaults if k.partition(".")[0] in ("decode", "train", "orl", "replay",
                                                          "loss", "eval", "checkpoint")}
  assert full <= _stated(base), f"configs/tiny.py leaves out {sorted(full - _stated(base))}"


def _section_field_names() -> set[str]:
  return {k.rpartition(".")[2] for k in _leaves(cs.RunConfig())}


def _restated_defaults(root: pathlib.Path = ROOT) -> set[tuple[str, str, str]]:
  """(file, class, field) of every dataclass/NamedTuple field in orl_jax/ (but the sections'
  own file) named as a section field and given a default."""
  names, out = _section_field_names(), set()
  for path in sorted((root / "orl_jax").rglob("*.py")):
    rel = path.relative_to(root).as_posix()
    if rel == "orl_jax/config/sections.py":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if not isinstance(node, ast.ClassDef):
        continue
      kinds = [ast.unparse(d) for d in node.decorator_list + node.bases]
      if not any("dataclass" in k or "NamedTuple" in k for k in kinds):
        continue
      for st in node.body:
        if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
            and st.value is not None and st.target.id in names and _has_default(st.value)):
          out.add((rel, node.name, st.target.id))
  return out


def _has_default(value: ast.expr) -> bool:
  """A field's right-hand side gives a default: anything but `dataclasses.field(...)` without
  `default` / `default_factory` (a required keyword-only field)."""
  if isinstance(value, ast.Call) and ast.unparse(value.func) in ("dataclasses.field", "field"):
    return any(k.arg in ("default", "default_factory") for k in value.keywords)
  return True


def _default(cls, name: str):
  field = {f.name: f for f in dataclasses.fields(cls)}[name]
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


def test_no_runtime_class_writes_a_section_default_again():
  found = _restated_defaults() - NOT_SETTINGS
  new = sorted(f for f in found if f"{f[0]}:{f[1]}" not in STILL_RESTATED)
  assert not new, f"defaults written outside their section (build from the section): {new}"
  stale = STILL_RESTATED - {f"{f[0]}:{f[1]}" for f in found}
  assert not stale, f"no longer restating a default: remove from STILL_RESTATED {stale}"


def test_a_restated_default_is_the_sections_value():
  """Where a model or decoder config class still writes a section field's default, it writes the
  section's value: nothing built without the run config runs another method."""
  differ = []
  for path, name, field in sorted(_restated_defaults() - NOT_SETTINGS):
    module = importlib.import_module(path[:-3].replace("/", "."))
    sections = [s for s in BUILT_FROM[name] if field in {f.name for f in dataclasses.fields(s)}]
    assert sections, f"{name}.{field}: no section of {BUILT_FROM[name]} has the field"
    ours, theirs = _default(getattr(module, name), field), _default(sections[0], field)
    if ours != theirs:
      differ.append(f"{name}.{field} = {ours!r}, {sections[0].__name__}.{field} = {theirs!r}")
  assert not differ, "defaults written twice with different values:\n" + "\n".join(differ)


def test_the_resolved_fields_have_no_runtime_default():
  """The commit rule, the block rules and `qk_norm` are the run's resolved values (the family's
  rules and layout): their config classes take them, never assume them."""
  from orl_jax.decode.config import DecodeConfig
  from orl_jax.models.transformer import ModelConfig
  for cls, names in ((DecodeConfig, ("rule", "block_placement", "commit_compare")),
                     (ModelConfig, ("qk_norm",))):
    for name in names:
      assert _default(cls, name) is dataclasses.MISSING, f"{cls.__name__}.{name} has a default"


def test_the_scan_sees_a_restated_default(tmp_path):
  """The scan is not blind: the old `LossConfig.gate_entropy = 0.0` is found."""
  fake = tmp_path / "orl_jax" / "losses_old.py"
  fake.parent.mkdir()
  fake.write_text("import dataclasses\n@dataclasses.dataclass(frozen=True)\nclass LossConfig:\n"
                  "  gate_entropy: float = 0.0\n")
  assert _restated_defaults(tmp_path) == {("orl_jax/losses_old.py", "LossConfig", "gate_entropy")}


def test_built_classes_take_the_section_defaults():
  run = run_config.build(tiny.get_config("smoke"))
  assert dataclasses.asdict(config_lib.loss_config(run)) == run.loss.to_dict()
  assert LossConfig.from_section(cs.Loss()).gate_entropy == cs.Loss().gate_entropy
  replay = config_lib.replay_config(run, n_shards=1)
  for name in ("states_per_response", "layout", "micro_batches", "row_len", "n_rows"):
    assert getattr(replay, name) == getattr(run.replay, name)
  with pytest.raises(TypeError):
    LossConfig()                                  # type: ignore[call-arg]


def _literal(cls, name: str) -> tuple:
  return typing.get_args(typing.get_type_hints(cls)[name])


def test_allowed_values_come_from_the_sections_literals():
  assert KL_REFERENCES == _literal(cs.Loss, "kl_reference")
  assert plan.LAYOUTS == _literal(cs.Replay, "layout")
  assert config_lib.MODES == _literal(cs.Train, "mode") == config_lib.TRAIN_MODES + ("eval",)
  assert residual.MODES == _literal(cs.Residual, "mode")
  assert unmasking.RULES == _literal(cs.Decode, "rule") == _literal(cs.Orl, "rollout_rule")
  assert decode_config.CACHE_MODES == _literal(cs.Decode, "cache")
  assert decode_config.SCHEDULES == _literal(cs.Decode, "schedule")


def test_a_literal_field_is_checked_once_with_its_sentence():
  with pytest.raises(cs.ConfigError, match="loss.kl_reference must be a string, got 3"):
    cs.convert({"loss": {"kl_reference": 3}})
  config = tiny.get_config("smoke")
  config.loss.kl_reference = "frozen"
  with pytest.raises(cs.ConfigError) as e:
    run_config.build(config)
  assert str(e.value).count("loss.kl_reference='frozen' must be one of ('initial', "
                            "'rollout')") == 1


def test_train_runs_every_train_mode_and_refuses_the_rest():
  """`TRAIN_MODES` is what `train()` runs, loop for loop; an "eval" config (a valid `train.mode`,
  for evaluation) is refused with the command that evaluates it."""
  from orl_jax.train.entry import LOOPS, train
  assert set(LOOPS) == set(config_lib.TRAIN_MODES)
  assert "eval" in config_lib.MODES and "eval" not in config_lib.TRAIN_MODES
  with pytest.raises(ValueError, match=r"train\(\) runs train.mode sft \| residual_warmup \| "
                     r"orl \| rcd_offline, got 'eval' \(an 'eval' config evaluates: "
                     r"python launch/eval.py\)"):
    train(tiny.get_config("eval"), progress=False)
