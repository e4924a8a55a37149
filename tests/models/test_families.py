"""The model-family registry (orl_jax/models/families.py; one folder per family) and what reads
it: config.json <-> model config, the tensor-name map (fused QKV rows, stacked experts) on whole
tensors and on device slices, `model.path` (HF directory -> family and shapes from
config.json), LLaDA2 directory load -> export -> load, the expert mesh axis, frozen parameters
in the optimizer, the llada config variants and the dry-run memory table against a hand
calculation."""
import dataclasses
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from safetensors.numpy import load_file, save_file

from configs import llada
from orl_jax.config import build as run_config
from orl_jax.config import derive as config_lib
from orl_jax.decode import from_run
from orl_jax import sharding
from orl_jax.apps import dry_run
from orl_jax.models.decoded import ROUTE_DTYPE
from orl_jax.models import families, hf_read
from orl_jax.models import family_base as base
from orl_jax.models.transformer import ModelConfig, Transformer
from orl_jax.decode.trajectories import capture_bytes
from orl_jax.setup.build import build_setup, initial_params
from orl_jax.storage.hf_export import export_hf_dir
from orl_jax.decode.block_sampler import block_decode_config
from orl_jax.optimizer import frozen_params, optimizer_of
from tests.support.llada2 import LLADA2, LLADA2_MOE, write_llada2_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DENSE = dict(
    llada=ModelConfig(vocab_size=80, d_model=48, n_layers=2, n_heads=4, n_kv_heads=4,
                      head_dim=12, mlp_dim=96, mask_id=79, qk_norm=False, rope_theta=5e5,
                      norm_eps=1e-5, attention="bidirectional", hf_family="llada"),
    qwen3=ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                      head_dim=16, mlp_dim=128, mask_id=95, rope_theta=1e6, qk_norm=True,
                      tie_embeddings=True, hf_family="qwen3"),
    llada2_moe=LLADA2)


def _random_flat(cfg: ModelConfig, seed: int) -> dict:
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  return {sharding.path_name(p): rng.standard_normal(x.shape).astype(np.float32)
          for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}


# ----------------------------------------------------------------------------- registry


@pytest.mark.parametrize("name", [n for n, f in families.FAMILIES.items() if not f.own_model])
def test_config_json_round_trip_and_name_map_for_every_family(name):
  # (families with their own model: tests/models/test_diffusion_gemma_registry.py)
  fam, cfg = families.get(name), DENSE[name]
  arch = fam.architecture_from_hf(fam.hf_config_json(cfg))
  assert dataclasses.replace(cfg, **arch) == cfg and arch["attention"] == fam.attention
  assert families.for_model_type(fam.hf_config_json(cfg)["model_type"]) is fam
  flat = _random_flat(cfg, seed=1)
  tensors = base.params_to_hf(flat, fam.tensor_rules(cfg))
  back = base.params_from_hf(tensors, fam.tensor_rules(cfg))
  assert back.keys() == flat.keys()
  for k in flat:
    np.testing.assert_array_equal(back[k], flat[k], err_msg=k)


def test_lookups_name_the_field_or_file():
  assert families.for_model_type("SDAR").name == "qwen3"
  with pytest.raises(ValueError, match=r"x/config.json has model_type='gpt2'.*llada2_moe"):
    families.for_model_type("gpt2", "x/config.json")
  with pytest.raises(ValueError, match="model.hf_family='mistral'"):
    families.get("mistral")
  assert families.get("").partition_rules == sharding.PARTITION_RULES
  assert families.get("llada2_moe").partition_rules[0][0].startswith(r"mlp\.(gate_proj")


def test_our_own_models_have_the_default_family():
  """`model.hf_family = ""` is a real family (never None): the generic partition rules, the
  tiny model's block rules, a mask token, no frozen parameters of its own, no Hugging Face form
  (the checkpoint module says so, naming the field)."""
  ours = families.get("")
  ours_cfg = dataclasses.replace(DENSE["llada"], hf_family="")
  assert ours is families.OURS and families.of_model(ours_cfg) is ours
  assert families.of_model(object()) is ours                # a config without hf_family
  assert ours.decode == {"block_placement": "prompt_end", "commit_compare": ">="}
  assert (ours.sampler, ours.frozen, ours.own_model, ours.hf_checkpoint) == (None, None, False,
                                                                             False)
  assert "" not in families.FAMILIES and ours.model_types == ()
  with pytest.raises(ValueError, match="model.hf_family=''"):
    ours.tensor_rules(ours_cfg)
  with pytest.raises(hf_read.CheckpointError, match="model.hf_family='' is a model of ours"):
    hf_read.tensor_rules("", ours_cfg)


def test_no_family_if_chains_outside_the_registry():
  """Only the family folders (orl_jax/models/<family>/) and the registry may compare with a
  family name or model_type."""
  names = "|".join(sorted(families.FAMILIES) + sorted(families.BY_MODEL_TYPE))
  pattern = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']""")
  models = os.path.join(ROOT, "orl_jax", "models")
  family_dirs = tuple(os.path.join(models, d) for d in os.listdir(models)
                      if os.path.isfile(os.path.join(models, d, "__init__.py")))
  assert len(family_dirs) == len(families.FAMILIES) + 1     # each family and ours
  offenders = []
  for top in ("orl_jax", "launch"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
      if dirpath.startswith(family_dirs):
        continue
      for f in files:
        if f.endswith(".py"):
          path = os.path.join(dirpath, f)
          with open(path) as fh:
            offenders += [f"{path}: {line.strip()}" for line in fh if pattern.search(line)
                          and "template" not in line]
  assert not offenders, offenders


def test_assemble_reads_any_device_slice_of_fused_and_stacked_tensors():
  """What the loader does per device shard: a slice of q/k/v out of the fused QKV rows and a
  slice of the stacked experts equals the same slice of the whole parameter."""
  cfg = LLADA2
  rules = families.get("llada2_moe").tensor_rules(cfg)
  flat = _random_flat(cfg, seed=2)
  tensors = base.params_to_hf(flat, rules)
  read = lambda name, index: tensors[name][index]
  for ours in ("layers.1.attn.k_proj.kernel", "layers.2.attn.v_proj.kernel",
               "layers.1.mlp.down_proj", "layers.2.mlp.gate_proj"):
    group = [r for r in rules if r.ours == ours]
    shape = flat[ours].shape
    index = tuple(slice(n // 4, n // 4 + max(n // 2, 1)) for n in shape)
    np.testing.assert_array_equal(base.assemble(group, read, shape, index), flat[ours][index])
  shapes = {k: v.shape for k, v in flat.items()}
  assert base.check_hf_shapes(rules, shapes, lambda n: tensors[n].shape) == []
  bad = dict(tensors, **{"model.layers.1.attention.query_key_value.weight": np.zeros((9, 32))})
  assert base.check_hf_shapes(rules, shapes, lambda n: bad[n].shape) == [
      "model.layers.1.attention.query_key_value.weight: file (9, 32) vs model (64, 32)"]


def _debug_config_at(path: str, workdir: str):
  c = llada.get_config("debug")       # 4 layers, 8 experts: config.json (3 layers) must win
  c.model.path, c.workdir = path, workdir
  c.model.special_tokens.update(dict(mask="<|mask|>", eos="<|eos|>", pad="<|pad|>", bos=""))
  c.model.moe.impl = "ragged"         # a run-time choice the config keeps
  return c


def test_model_path_hf_directory_sets_family_and_shapes_then_exports_official_names(tmp_path):
  written = write_llada2_dir(str(tmp_path / "src"))
  s = build_setup(_debug_config_at(str(tmp_path / "src"), str(tmp_path / "w")))
  cfg = s.model_cfg
  assert (cfg.hf_family, cfg.attention, cfg.n_layers, cfg.vocab_size) == ("llada2_moe",
                                                                      "block_causal", 3, 300)
  assert cfg.moe.impl == "ragged" and cfg.moe.n_experts == 8 and cfg.first_k_dense == 1
  _, params = initial_params(s)
  export_hf_dir(s, params, str(tmp_path / "out"), max_shard_bytes=60_000)
  exported = {}
  for f in os.listdir(tmp_path / "out"):
    if f.startswith("model-"):
      exported.update(load_file(str(tmp_path / "out" / f)))
  assert exported.keys() == written.keys()          # the official names, nothing else
  for k in written:
    np.testing.assert_array_equal(exported[k], written[k], err_msg=k)
  out_config = hf_read.read_hf_config(str(tmp_path / "out"))
  assert out_config["model_type"] == "llada2_moe" and out_config["num_hidden_layers"] == 3
  assert os.path.isfile(tmp_path / "out" / "tokenizer.json")
  out = str(tmp_path / "out")
  _, again = hf_read.load_model_params(out, hf_read.family_of(out), cfg)
  a, b = hf_read.flat_params(params), hf_read.flat_params(again)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_llada2_loader_names_missing_and_misshaped_official_tensors(tmp_path):
  tensors = write_llada2_dir(str(tmp_path / "d"))
  del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
  tensors["model.layers.1.attention.query_key_value.weight"] = np.zeros((10, 32), np.float32)
  save_file(tensors, str(tmp_path / "d" / "model.safetensors"))
  cfg = dataclasses.replace(LLADA2, vocab_size=300)
  with pytest.raises(hf_read.CheckpointError) as e:
    hf_read.load_model_params(str(tmp_path / "d"), "llada2_moe", cfg)
  msg = str(e.value)
  assert "missing tensors ['model.layers.2.mlp.experts.5.up_proj.weight']" in msg
  assert "model.layers.1.attention.query_key_value.weight: file (10, 32) vs model (64, 32)" in msg


def test_weights_path_errors_are_one_sentence(tmp_path):
  from orl_jax.storage.weights import kind_of, require_weights
  with pytest.raises(config_lib.ConfigError, match=r"model.path='.*nowhere' does not exist"):
    kind_of(str(tmp_path / "nowhere"))
  c = llada.get_config()
  with pytest.raises(config_lib.ConfigError) as e:
    require_weights(c)
  assert "inclusionAI/LLaDA2.1-mini" in str(e.value) and "--config.model.path" in str(e.value)
  require_weights(llada.get_config("debug"))      # random weights are fine there


def test_launcher_without_weights_stops_with_one_sentence():
  out = subprocess.run([sys.executable, "launch/train.py", "--config=configs/llada.py"],
                       cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True, timeout=300)
  lines = [line for line in out.stderr.strip().splitlines() if line]
  assert out.returncode == 1 and len(lines) == 1, out.stderr[-2000:]
  assert "config.model.path" in lines[0] and "LLaDA2.1-mini" in lines[0]


# ----------------------------------------------------------------------------- sharding, optimizer


def test_expert_axis_alone_shards_experts():
  rules = families.get("llada2_moe").partition_rules
  only_experts = {"data": 2, "fsdp": 1, "tensor": 1, "expert": 4}
  spec = lambda name, shape, mesh: sharding.partition_spec(name, shape, mesh, rules)
  assert spec("layers.1.mlp.up_proj", (8, 32, 12), only_experts) == P("expert", None, None)
  assert spec("layers.1.attn.q_proj.kernel", (32, 32), only_experts) == P(None, None)
  assert spec("layers.1.mlp.up_proj", (8, 32, 12), {"data": 8, "fsdp": 1, "tensor": 1,
                                                    "expert": 1}) == P()
  assert sharding.n_batch_shards(only_experts) == 8


def test_frozen_parameters_get_no_update_and_no_moments():
  cfg = dataclasses.replace(LLADA2, moe=dataclasses.replace(LLADA2_MOE, freeze_router=True))
  config = llada.get_config("debug")
  flat = {k: jnp.asarray(v) for k, v in _random_flat(cfg, seed=3).items()}
  grads = {k: jnp.ones_like(v) for k, v in flat.items()}
  opt = optimizer_of(dataclasses.replace(config_lib.optimizer_config(run_config.convert(config)),
                                         residual_lr_scale=0.1), cfg)
  state = opt.init(flat)
  params = flat
  for _ in range(2):                  # the warmup's first learning rate is 0
    updates, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  for name in flat:
    frozen = name.endswith(("router.expert_bias", "router.kernel"))
    moved = float(jnp.max(jnp.abs(params[name] - flat[name]))) > 0
    assert moved != frozen, name
  leaves = {sharding.path_name(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)}
  assert not any(n.endswith("router.expert_bias") for n in leaves)
  assert frozen_params(DENSE["llada"]) is None


_EXPERT_MESH_LOAD = """
import jax
jax.config.update("jax_num_cpu_devices", 4)
import numpy as np
from orl_jax import sharding
from orl_jax.models import build, families, hf_read
from tests.support.llada2 import LLADA2, write_llada2_dir
tensors = write_llada2_dir(PATH)
mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, expert=4)
assert dict(mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1, "expert": 4}
_, abstract = build.abstract_params(LLADA2)
sh = sharding.tree_shardings(abstract, mesh, families.get("llada2_moe").partition_rules)
_, params = hf_read.load_model_params(PATH, "llada2_moe", LLADA2, shardings=sh)
up = hf_read.flat_params(params)["layers.2.mlp.up_proj"]
assert up.sharding.spec[0] == "expert", up.sharding.spec
assert up.addressable_shards[0].data.shape == (2, 32, 12)
np.testing.assert_array_equal(np.asarray(up)[5],
                              tensors["model.layers.2.mlp.experts.5.up_proj.weight"].T)
assert sharding.batch_sharding(mesh).spec == jax.sharding.PartitionSpec(("data", "fsdp", "expert"))
print("EXPERT_LOAD_OK")
"""


def test_llada2_loads_straight_into_expert_shards_on_4_cpu_devices(tmp_path):
  code = _EXPERT_MESH_LOAD.replace("PATH", repr(str(tmp_path / "d")))
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT), timeout=600)
  assert "EXPERT_LOAD_OK" in out.stdout, out.stdout + out.stderr[-3000:]


# ----------------------------------------------------------------------------- configs, dry run


def test_llada_variants():
  c = llada.get_config()
  assert c.model.hf_family == "llada2_moe" and c.model.hub_id == "inclusionAI/LLaDA2.1-mini"
  assert (c.model.d_model, c.model.n_layers, c.model.n_heads, c.model.n_kv_heads) == (2048, 20,
                                                                                     16, 4)
  assert (c.decode.block_size, c.decode.rule, c.decode.rule_value) == (32, "threshold", 0.95)
  # special tokens: the model directory's (config.json / generation_config.json), else the
  # family's; the config overrides none of them
  assert set(c.model.special_tokens.values()) == {""} and c.model.attention == "block_causal"
  assert llada.get_config("2.0-mini").model.hub_id == "inclusionAI/LLaDA2.0-mini"
  dense = llada.get_config("8b-instruct")
  assert dense.model.hf_family == "llada" and dense.model.attention == "bidirectional"
  assert dense.model.moe.n_experts == 0 and dense.model.special_tokens.eos == "<|eot_id|>"
  d = llada.get_config("debug")
  m = d.model
  assert (m.n_layers, m.first_k_dense, m.moe.n_experts, m.moe.top_k, m.moe.n_shared,
          m.moe.n_group, m.moe.topk_group) == (4, 1, 8, 2, 1, 2, 1)
  for variant in llada.VARIANTS:
    run_config.build(llada.get_config(variant))
  with pytest.raises(ValueError, match="2.1-mini"):
    llada.get_config("16b")


def test_each_family_decodes_by_its_authors_rules():
  """Block placement and the threshold comparison follow the weights' family (its registry
  entry; a decode.* setting overrides); whether a row stops after its EOS block is the
  config's, set per variant as the official `generate` / serving stack does."""
  rules = lambda c, family=None: from_run.family_rules(run_config.convert(c), family)
  c = llada.get_config()                                  # LLaDA2.1-mini
  assert rules(c) == {"block_placement": "absolute", "commit_compare": ">"}
  assert rules(c, "llada") == {"block_placement": "prompt_end", "commit_compare": ">="}
  assert rules(c, "qwen3") == {"block_placement": "absolute", "commit_compare": ">"}
  assert rules(c, "") == {"block_placement": "prompt_end", "commit_compare": ">="}   # ours
  c.decode.commit_compare = ">="
  assert rules(c) == {"block_placement": "absolute", "commit_compare": ">="}
  stops = {v: llada.get_config(v).decode.eos_early_stop for v in llada.VARIANTS}
  assert stops == {"2.1-mini": False, "2.1-mini-dllm": False, "2.1-mini-sglang": True,
                   "2.0-mini": True, "8b-instruct": False, "8b-base": False, "debug": False,
                   "debug-jsonl": False}
  dllm = llada.get_config("2.1-mini-dllm").decode
  sglang = llada.get_config("2.1-mini-sglang").decode
  assert (dllm.rule_value, dllm.edit_threshold, dllm.max_post_edit_steps) == (0.95, 0.9, 16)
  assert (sglang.rule_value, sglang.edit_threshold, sglang.max_post_edit_steps) == (0.5, 0.0, 16)
  dcfg = from_run.decode_config(run_config.convert(llada.get_config("8b-instruct")), mask_id=0,
                                  eos_id=1)
  assert (dcfg.block_placement, dcfg.commit_compare, dcfg.eos_early_stop) == (
      "prompt_end", ">=", False)
  bad = llada.get_config("8b-instruct")
  bad.decode.block_placement = "absolute"
  with pytest.raises(config_lib.ConfigError, match="block_placement='absolute'"):
    run_config.build(bad)
  bad.decode.block_placement = "middle"
  with pytest.raises(config_lib.ConfigError, match="decode.block_placement='middle'"):
    run_config.build(bad)
  with pytest.raises(config_lib.ConfigError, match="its own sampler"):
    rules(c, "diffusion_gemma")


# The official LLaDA2.1 `generate` defaults as decode.* fields: `LLaDA2MoeModelLM.generate` of
# the LLaDA2.1 remote code as dllm vendors it (lingjiechen2/dllm at
# 7520f3c74b336479789d467bd577a78f580f5b10, dllm/pipelines/llada21/models/modeling_llada21_moe.py):
# block_length 32, steps 32 (= the block: max_steps_per_block 0), temperature 0.0, threshold
# 0.95, editing_threshold 0.9, max_post_steps 16, eos_early_stop False. Its gen_length (2048)
# is a run size, not pinned.
LLADA21_GENERATE = dict(block_size=32, max_steps_per_block=0, temperature=0.0, rule="threshold",
                        rule_value=0.95, edit_threshold=0.9, max_post_edit_steps=16,
                        eos_early_stop=False)
NO_EDITING = dict(edit_threshold=1.0, max_post_edit_steps=0)


def test_llada2_variants_decode_as_documented():
  """`:2.1-mini-dllm` decodes as the official 2.1 `generate` defaults; `:2.1-mini` (the
  default) as they do but without token editing; `:2.1-mini-sglang` as SGLang serves it;
  `:2.0-mini` as the official 2.0 `generate`. docs/models.md says so, value for value."""
  want = {"2.1-mini": dict(LLADA21_GENERATE, **NO_EDITING),
          "2.1-mini-dllm": LLADA21_GENERATE,
          "2.1-mini-sglang": dict(LLADA21_GENERATE, rule_value=0.5, edit_threshold=0.0,
                                  eos_early_stop=True),
          "2.0-mini": dict(LLADA21_GENERATE, **NO_EDITING, eos_early_stop=True)}
  docs = open(os.path.join(ROOT, "docs", "models.md")).read()
  for variant, fields in want.items():
    d = llada.get_config(variant).decode
    assert {k: d[k] for k in fields} == fields, variant
    bullet = re.search(rf"^\* `:{re.escape(variant)}`.*?(?=^\*|^$)", docs, re.M | re.S)
    triple = f"{d.rule_value} / {d.edit_threshold} / {d.max_post_edit_steps}"
    assert bullet and triple in bullet.group(0).replace("\n  ", " "), (variant, triple)
  assert llada.get_config().decode == llada.get_config("2.1-mini").decode


def _params_by_hand(expert_ways: int) -> tuple[int, int, int]:
  """(parameters, per-device parameter count on fsdp=8 x expert=`expert_ways`, expert_bias
  count) of LLaDA2.x-mini (docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm) plus the residual
  adapter, counted by hand."""
  v, d, layers, hq, hkv, dh, f, e, fe = 157184, 2048, 20, 16, 4, 128, 5120, 256, 512
  attention = d * hq * dh + 2 * d * hkv * dh + hq * dh * d        # q, k, v, o
  experts = 3 * e * d * fe                                          # stacked [E, D, F] x3
  shared, router = 3 * d * fe, d * e
  adapter = 3 * d * d
  sharded = (2 * v * d + layers * attention + 3 * d * f + (layers - 1) * shared + adapter)
  vectors = layers * (2 * d + 2 * dh) + d + d                       # norms + adapter norm
  replicated = vectors + (layers - 1) * (router + e)                # router kernel and bias
  total = sharded + (layers - 1) * experts + replicated
  per_device = sharded // 8 + (layers - 1) * experts // (8 * expert_ways) + replicated
  return total, per_device, (layers - 1) * e


@pytest.mark.parametrize("expert_ways", [1, 8])
def test_llada2_mini_dry_run_matches_hand_calculation(expert_ways):
  c = llada.get_config("2.1-mini")
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor, c.mesh.expert = 1, 8, 1, expert_ways
  rows, info = dry_run.sizing_rows(c)                # 64 devices: sized, none needed
  by = {r.name: r for r in rows}
  total, per_device, n_bias = _params_by_hand(expert_ways)
  assert info["n_params"] == total and 16.0e9 < total < 16.5e9
  assert info["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1, "expert": expert_ways}
  bf16 = 2
  assert by["params"].total_bytes == bf16 * total
  assert by["params"].per_device_bytes == bf16 * per_device
  # AdamW mu + nu like the params, except the frozen expert_bias (no moments)
  opt = by["optimizer state"]
  assert 0 <= opt.per_device_bytes - 2 * bf16 * (per_device - n_bias) < 64
  ref = by["KL reference (frozen)"]
  assert ref.per_device_bytes == by["params"].per_device_bytes
  shards = 8 * expert_ways                            # batch over data x fsdp x expert
  for name in ("rollout capture buffers", "replay batch"):
    assert by[name].per_device_bytes == by[name].total_bytes // shards
  assert by["rollout capture buffers"].total_bytes == info["capture_bytes_traced"]
  # route capture (exact MoE replay): 64 responses x (captured states x b=32 + prompt 512 +
  # commit forwards over 288 tokens: 256 and the block the prompt's last tokens share, at
  # absolute placement) x 19 MoE layers x top-8 expert ids
  assert c.orl.capture_routes
  dcfg = block_decode_config(c, None, "rollout", mask_id=0, eos_id=0)
  assert dcfg.block_placement == "absolute" and dcfg.max_blocks == 9
  routes = 64 * (dcfg.capture_states * 32 + 512 + 288) * 19 * 8 * np.dtype(ROUTE_DTYPE).itemsize
  without = capture_bytes(64, dcfg, 2048, bf16) + 64 * 288 * 4     # + int32 block_final
  assert by["rollout capture buffers"].total_bytes == without + routes
  print(dry_run.format_table(rows, info))
