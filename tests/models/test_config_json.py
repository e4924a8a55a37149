"""What a model directory's config.json means (docs/models.md#missing-and-ignored-configjson-keys):
a missing key takes the default of the official configuration class, a key the official modeling
code never reads is ignored (and named once in the log), and a field of the wrong type or out of
range stops the launchers with one line that names the file and the field (exit 1, no traceback).

The official defaults are independent references: transformers' own `Qwen3Config` and
`DiffusionGemmaConfig` are instantiated here; for the remote-code classes the values are copied
from their sources (cited at each table)."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from orl_jax.models import config_json, hf_read
from orl_jax.models.diffusion_gemma.config import DiffusionGemmaConfig
from orl_jax.models.diffusion_gemma.sampler import SamplerSettings
from orl_jax.models.llada import family as llada
from orl_jax.models.llada2_moe import family as llada2_moe
from orl_jax.models.qwen3 import family as qwen3
from orl_jax.models.moe import MoEConfig
from tests.support.hf import (BOS, EOS, MASK, PAD, PROMPT, config_of, decode_launcher,
                              family_dir)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# ----------------------------------------------------------------------------- official defaults

# LLaDA2MoeConfig.__init__ defaults: the official remote code of inclusionAI/LLaDA2.0-mini as
# copied into github.com/ZHZisZZ/dllm, dllm/pipelines/llada2/models/configuration_llada2_moe.py
# (commit ca176752fbceec49c6b4777a2c18ae88e4eb10ed); the authors' training copy
# (github.com/inclusionAI/dFactory, models/llada2_moe/configuration_llada2_moe.py, commit
# c29d72cc5bdf946f374ce68dd305846f359ceb3c) has the same values for every key below but
# use_qk_norm. use_bias defaults to true (a biased attention output), which is refused.
LLADA2_OFFICIAL = dict(vocab_size=30592, hidden_size=1024, num_hidden_layers=24,
                       num_attention_heads=16, num_key_value_heads=0, use_qk_norm=True,
                       use_bias=True, rms_norm_eps=1e-5, norm_head=False,
                       tie_word_embeddings=False, rope_theta=10000.0, num_experts=16,
                       num_shared_experts=0, num_experts_per_tok=2, n_group=8, topk_group=4,
                       routed_scaling_factor=2.5, first_k_dense_replace=0,
                       partial_rotary_factor=0.5)
# LLaDA's ModelConfig dataclass (configuration_llada.py of GSAI-ML/LLaDA-8B-Instruct, as copied
# into github.com/ZHZisZZ/dllm, dllm/pipelines/llada/models/configuration_llada.py, commit
# ca176752fbceec49c6b4777a2c18ae88e4eb10ed); rope, block_type, activation_type and
# layer_norm_type default to settings the LLaDA-8B checkpoints do not use (refused below)
LLADA_OFFICIAL = dict(d_model=768, n_heads=12, n_kv_heads=None, n_layers=12, mlp_ratio=4,
                      mlp_hidden_size=None, rms_norm_eps=1e-5, rope_theta=10000.0,
                      vocab_size=50257, embedding_size=50304, weight_tying=True, rope=False,
                      block_type="sequential", activation_type="swiglu",
                      layer_norm_type="default")
# SDARConfig.__init__ defaults: github.com/JetAstra/SDAR,
# training/model/SDAR-4B-Chat/configuration_sdar.py (commit
# c2041a8333333d685f6e15122c84f60f51f85ebd)
SDAR_OFFICIAL = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016,
                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                     head_dim=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     rope_theta=10000.0)


def _qwen3_fields(c) -> dict:
  """What our reader should make of a Qwen3 / SDAR configuration object `c`."""
  return dict(vocab_size=c["vocab_size"], d_model=c["hidden_size"],
              n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
              n_kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
              mlp_dim=c["intermediate_size"], rope_theta=c["rope_theta"],
              norm_eps=c["rms_norm_eps"], qk_norm=True,
              tie_embeddings=c["tie_word_embeddings"], attention="block_causal")


@pytest.mark.parametrize("given", [{}, {"hidden_size": 256, "num_attention_heads": 8,
                                        "num_key_value_heads": None, "rope_theta": 5e5}])
def test_qwen3_missing_keys_take_transformers_defaults(given):
  """transformers' Qwen3Config itself: head_dim stays 128 (not hidden / heads), a null
  num_key_value_heads means one per query head, rope_theta is 1e4."""
  transformers = pytest.importorskip("transformers")
  theirs = transformers.Qwen3Config(**given)
  want = _qwen3_fields(dict(theirs.to_dict(), rope_theta=theirs.rope_parameters["rope_theta"]))
  assert qwen3.architecture_from_hf(dict(given, model_type="qwen3")) == want


def test_sdar_missing_keys_take_sdar_config_defaults():
  assert qwen3.architecture_from_hf({"model_type": "sdar"}) == _qwen3_fields(SDAR_OFFICIAL)


def test_llada2_missing_keys_take_the_official_defaults():
  """Only what the official class has no usable default for is given (the expert width, and
  use_bias: false); the rest is LLaDA2MoeConfig's — not the released checkpoint's values."""
  o = LLADA2_OFFICIAL
  arch = llada2_moe.architecture_from_hf({"model_type": "llada2_moe", "use_bias": False,
                                          "moe_intermediate_size": 64})
  heads = o["num_attention_heads"]
  assert arch == dict(
      vocab_size=o["vocab_size"], d_model=o["hidden_size"], n_layers=o["num_hidden_layers"],
      n_heads=heads, n_kv_heads=heads, head_dim=o["hidden_size"] // heads, mlp_dim=0,
      rope_theta=o["rope_theta"], rope_fraction=o["partial_rotary_factor"],
      norm_eps=o["rms_norm_eps"], qk_norm=o["use_qk_norm"],
      tie_embeddings=o["tie_word_embeddings"],
      moe=MoEConfig(n_experts=o["num_experts"], top_k=o["num_experts_per_tok"], expert_dim=64,
                    n_group=o["n_group"], topk_group=o["topk_group"],
                    n_shared=o["num_shared_experts"],
                    routed_scaling_factor=o["routed_scaling_factor"], impl="dense"),
      first_k_dense=o["first_k_dense_replace"], norm_head=False, attention="block_causal")
  with pytest.raises(config_json.ConfigJsonError, match="use_bias=true .missing: the official"):
    llada2_moe.architecture_from_hf({"model_type": "llada2_moe", "moe_intermediate_size": 64})
  with pytest.raises(config_json.ConfigJsonError, match="moe_intermediate_size is missing"):
    llada2_moe.architecture_from_hf({"model_type": "llada2_moe", "use_bias": False})


def test_llada_missing_keys_take_the_official_defaults():
  o = LLADA_OFFICIAL
  supported = {"rope": True, "block_type": "llama", "activation_type": "silu",
               "layer_norm_type": "rms"}
  arch = llada.architecture_from_hf(dict(supported, model_type="llada"))
  assert arch == dict(vocab_size=o["embedding_size"], d_model=o["d_model"],
                      n_layers=o["n_layers"], n_heads=o["n_heads"], n_kv_heads=o["n_heads"],
                      head_dim=o["d_model"] // o["n_heads"], mlp_dim=o["mlp_ratio"] * o["d_model"],
                      rope_theta=o["rope_theta"], norm_eps=o["rms_norm_eps"], qk_norm=False,
                      tie_embeddings=o["weight_tying"], attention="bidirectional")
  for key in supported:      # each official default is a model we do not implement
    given = {k: v for k, v in supported.items() if k != key}
    with pytest.raises(config_json.ConfigJsonError,
                       match=f"{key}={json.dumps(o[key])} .missing: the official default"):
      llada.architecture_from_hf(given)


def test_diffusion_gemma_missing_keys_take_transformers_defaults():
  transformers = pytest.importorskip("transformers")
  text = {"num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 8}  # no defaults
  ours = DiffusionGemmaConfig.from_hf({"model_type": "diffusion_gemma", "text_config": text})
  theirs = transformers.DiffusionGemmaConfig(text_config=dict(text))
  t = theirs.text_config
  assert (ours.vocab_size, ours.d_model, ours.n_heads, ours.mlp_dim, ours.sliding_window,
          ours.norm_eps, ours.final_softcap, ours.activation, ours.max_positions) == (
              t.vocab_size, t.hidden_size, t.num_attention_heads, t.intermediate_size,
              t.sliding_window, t.rms_norm_eps, t.final_logit_softcapping,
              t.hidden_activation, t.max_position_embeddings)
  assert (ours.pad_id, ours.bos_id, ours.eos_ids, ours.canvas_length) == (
      t.pad_token_id, t.bos_token_id, (t.eos_token_id,), theirs.canvas_length)
  assert [s.kind for s in ours.layers] == t.layer_types
  for i, spec in enumerate(ours.layers):
    layer = t.per_layer_config[i]
    rope = t.rope_parameters[spec.kind]
    assert (spec.head_dim, spec.n_kv_heads) == (layer.head_dim, layer.num_key_value_heads)
    assert (spec.rope_type, spec.rope_theta, spec.rope_fraction) == (
        rope["rope_type"], rope["rope_theta"], rope.get("partial_rotary_factor", 1.0))


def test_norm_head_is_ignored_as_the_official_llada2_code_ignores_it(tmp_path):
  """The official LLaDA2 modeling code never reads norm_head (nor score_function ...): the
  head is not normalised, and the keys are named for the log."""
  path = family_dir(tmp_path, "llada2_moe")
  _edit(path, "config.json", norm_head=True, score_function="sigmoid")
  assert hf_read.read_architecture(path, "llada2_moe")["norm_head"] is False
  assert hf_read.ignored_settings(path, "llada2_moe") == ["norm_head=true",
                                                          'score_function="sigmoid"']


# ----------------------------------------------------------------------------- bad config.json

def _edit(path: str, fname: str, **fields) -> None:
  """Sets `fields` in the directory's JSON file `fname` (dotted keys reach into objects)."""
  full = os.path.join(path, fname)
  data = json.load(open(full)) if os.path.isfile(full) else {}
  for key, value in fields.items():
    *outer, last = key.split(".")
    node = data
    for k in outer:
      node = node.setdefault(k, {})
    node[last] = value
  with open(full, "w") as f:
    json.dump(data, f)


def _run_error(family: str, path: str) -> Exception:
  """The error the launchers meet: decode.py's decode path for the mask families, the run
  set-up (training, evaluation) for DiffusionGemma (decode.py refuses that family)."""
  from orl_jax.setup.build import build_setup
  config = config_of(family, path)
  with pytest.raises(Exception) as e:
    if family == "diffusion_gemma":
      build_setup(config, prompts=[PROMPT])
    else:
      decode_launcher().decode_model(config, "m", path, [PROMPT])
  return e.value


BAD_FIELDS = [   # (family, file, field, value)
    ("llada", "config.json", "n_layers", "3"),
    ("llada", "config.json", "n_heads", None),
    ("llada", "config.json", "rope_theta", "abc"),
    ("llada", "config.json", "d_model", 96.5),
    ("llada", "config.json", "d_model", 0),
    ("llada", "config.json", "mlp_hidden_size", [24]),
    ("llada", "config.json", "weight_tying", "no"),
    ("llada", "config.json", "n_kv_heads", 3),
    ("llada", "config.json", "rope", False),
    ("llada2_moe", "config.json", "num_hidden_layers", "3"),
    ("llada2_moe", "config.json", "num_attention_heads", None),
    ("llada2_moe", "config.json", "rope_theta", "abc"),
    ("llada2_moe", "config.json", "hidden_size", 96.5),
    ("llada2_moe", "config.json", "hidden_size", -16),
    ("llada2_moe", "config.json", "num_experts_per_tok", [2]),
    ("llada2_moe", "config.json", "routed_scaling_factor", "2.5"),
    ("llada2_moe", "config.json", "partial_rotary_factor", 1.5),
    ("llada2_moe", "config.json", "use_bias", True),
    ("llada2_moe", "config.json", "mask_token_id", "297"),
    ("llada2_moe", "generation_config.json", "eos_token_id", [298, "x"]),
    ("qwen3", "config.json", "num_hidden_layers", "3"),
    ("qwen3", "config.json", "num_attention_heads", None),
    ("qwen3", "config.json", "rope_theta", "abc"),
    ("qwen3", "config.json", "head_dim", 96.5),
    ("qwen3", "config.json", "intermediate_size", [24]),
    ("qwen3", "config.json", "rms_norm_eps", -1e-6),
    ("qwen3", "config.json", "tie_word_embeddings", 1),
    ("qwen3", "config.json", "rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("qwen3", "generation_config.json", "pad_token_id", [299, 298]),
    ("diffusion_gemma", "config.json", "text_config.num_hidden_layers", "3"),
    ("diffusion_gemma", "config.json", "text_config.num_attention_heads", None),
    ("diffusion_gemma", "config.json", "text_config.hidden_size", 96.5),
    ("diffusion_gemma", "config.json", "text_config.sliding_window", [8]),
    ("diffusion_gemma", "config.json", "text_config.rms_norm_eps", "abc"),
    ("diffusion_gemma", "config.json", "canvas_length", "16"),
    ("diffusion_gemma", "generation_config.json", "t_max", "hot"),
]


@pytest.mark.parametrize("family,fname,field,value", BAD_FIELDS,
                         ids=[f"{f}-{n}-{k}={v!r}" for f, n, k, v in BAD_FIELDS])
def test_a_bad_field_is_one_line_naming_file_and_field(tmp_path, family, fname, field, value):
  path = family_dir(tmp_path, family)
  decode_launcher()
  import _common   # launch/_common.py (on sys.path with the decode launcher)
  architecture_from_hf = hf_read.families.get(family).architecture_from_hf
  hf_read.parse_config_json(path, architecture_from_hf)   # unedited: fine
  _edit(path, fname, **{field: value})
  error = _run_error(family, path)
  message = str(error)
  assert isinstance(error, _common.user_errors()), f"{type(error).__name__}: {message}"
  assert "\n" not in message and os.path.join(path, fname) in message, message
  assert field in message, message


def _decode_py_error(*args) -> tuple[int, list[str], str]:
  """launch/decode.py with `args`: (exit status, stderr lines but absl's log lines, stdout)."""
  out = subprocess.run([sys.executable, "launch/decode.py", *args], cwd=ROOT,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True, timeout=600)
  log = re.compile(r"[IWEF]\d{4} \d\d:\d\d:\d\d")       # absl's log-line prefix
  lines = [ln for ln in out.stderr.strip().splitlines() if not log.match(ln)]
  return out.returncode, lines, out.stdout


def test_the_launcher_exits_1_with_one_line_for_a_bad_field(tmp_path):
  """decode.py as a user runs it: `"n_layers": "3"` in a LLaDA config.json."""
  path = family_dir(tmp_path, "llada")
  _edit(path, "config.json", n_layers="3")
  code, lines, _ = _decode_py_error("--config=configs/llada.py:8b-instruct",
                                    f"--config.model.path={path}", f"--prompt={PROMPT}")
  assert code == 1 and lines == [
      f"decode.py: {path}/config.json: n_layers=\"3\" must be an integer >= 1"], lines


@pytest.mark.parametrize("prompt", ["", "   \n\t "])
def test_an_empty_prompt_is_refused_in_one_line(prompt):
  code, lines, stdout = _decode_py_error(
      "--config=configs/tiny.py:eval",
      f"--config.model.path={os.path.join(ROOT, 'assets', 'tiny_base')}", f"--prompt={prompt}")
  assert code == 1 and len(lines) == 1 and stdout == "", lines
  assert lines[0].startswith("decode.py: --prompt is empty"), lines


def _settled(path: str, *names: str) -> None:
  """Dates the directory's files a minute back (as a downloaded model's are)."""
  old = time.time() - 60
  for name in names:
    os.utime(os.path.join(path, name), (old, old))


def _count_parses(monkeypatch) -> list[str]:
  """The names of the files hf_read.py parses from now on, in order."""
  parsed, read_json = [], hf_read.read_json

  def counted(path):
    parsed.append(os.path.basename(path))
    return read_json(path)
  monkeypatch.setattr(hf_read, "read_json", counted)
  return parsed


def test_set_up_parses_each_json_file_of_a_directory_once(tmp_path, monkeypatch):
  """Set-up asks config.json five times (family, special tokens, architecture, ignored keys,
  the mask check) and generation_config.json twice: each file is parsed once."""
  from orl_jax.setup.build import build_setup
  path = family_dir(tmp_path, "llada2_moe")
  _edit(path, "generation_config.json", eos_token_id=EOS)
  _settled(path, "config.json", "generation_config.json")
  parsed = _count_parses(monkeypatch)
  setup = build_setup(config_of("llada2_moe", path), prompts=[PROMPT])
  assert setup.model_cfg.hf_family == "llada2_moe"
  assert sorted(parsed) == ["config.json", "generation_config.json"], parsed


def test_json_reader_sees_every_version_of_a_file_and_hands_out_copies(tmp_path, monkeypatch):
  path = str(tmp_path / "config.json")
  parses = _count_parses(monkeypatch)

  def write(value):
    with open(path, "w") as f:
      json.dump({"a": value}, f)
  write(1)
  _settled(str(tmp_path), "config.json")
  hf_read.read_json_object(path)["a"] = 5                    # the caller's copy
  assert hf_read.read_json_object(path) == {"a": 1} and len(parses) == 1
  write(2)                                              # a new mtime
  assert hf_read.read_json_object(path) == {"a": 2}
  # written again at the same size and (as within one mtime tick) the same mtime: a file this
  # recent is parsed at every read
  mtime_ns = os.stat(path).st_mtime_ns
  write(3)
  os.utime(path, ns=(mtime_ns, mtime_ns))
  assert hf_read.read_json_object(path) == {"a": 3}


# ----------------------------------------------------------------------------- DiffusionGemma


def test_diffusion_gemma_reads_generation_config_json(tmp_path):
  """generation_config.json decides the EOS / pad ids (over config.json's) and the sampler
  settings the config leaves unset; max_new_tokens rounds up to whole canvases, as transformers
  generates them; what the config sets (max_steps_per_block in :debug) and a special-token
  override still win."""
  from orl_jax.models.diffusion_gemma import sampler
  from orl_jax.setup.build import build_setup
  path = family_dir(tmp_path, "diffusion_gemma")          # config.json: eos 298, pad 299
  _edit(path, "generation_config.json", eos_token_id=[EOS, MASK], pad_token_id=BOS,
        max_new_tokens=20, max_denoising_steps=7, t_min=0.3, t_max=0.9, stability_threshold=2,
        confidence_threshold=0.01,
        sampler_config={"entropy_bound": 0.2, "_cls_name": "EntropyBoundSamplerConfig"})
  c = config_of("diffusion_gemma", path)
  with c.unlocked():
    c.decode.gen_length = None
  s = build_setup(c, prompts=[PROMPT])
  assert (s.model_cfg.eos_ids, s.model_cfg.pad_id) == ((EOS, MASK), BOS)
  d = s.config.decode
  own = d.family_settings(SamplerSettings)
  assert (d.gen_length, d.max_steps_per_block, own.t_min, own.t_max, own.stability_threshold,
          own.confidence_threshold, d.rule_value) == (32, 6, 0.3, 0.9, 2, 0.01, 0.2)
  scfg = sampler.sampler_config(s.config, eos_ids=s.model_cfg.eos_ids,
                                   pad_id=s.model_cfg.pad_id, rollout=False)
  assert (scfg.n_canvases, scfg.eos_ids, scfg.pad_id) == (2, (EOS, MASK), BOS)
  c = config_of("diffusion_gemma", path)
  c.model.special_tokens.eos = "<|mdm_mask|>"
  assert build_setup(c, prompts=[PROMPT]).model_cfg.eos_ids == (MASK,)
  os.remove(os.path.join(path, "generation_config.json"))  # config.json's ids, transformers'
  c = config_of("diffusion_gemma", path)                  # sampler defaults
  with c.unlocked():
    c.decode.gen_length, c.replay.row_len = None, 512
  s = build_setup(c, prompts=[PROMPT])
  assert (s.model_cfg.eos_ids, s.model_cfg.pad_id, s.config.decode.gen_length,
          s.config.decode.extra["t_max"]) == ((EOS,), PAD, 256, 0.8)
