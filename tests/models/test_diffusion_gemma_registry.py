"""DiffusionGemma in the model-family registry (docs/models.md#diffusiongemma): config.json and name
map through the registry (the one-to-many fused stacked experts), the run configs, and the dry-run
sized by hand for the released 26B-A4B shapes on 8 and 64 devices with the expert axis."""
import types

import jax
import numpy as np
import pytest
from flax import nnx

from configs import diffusion_gemma as dg_configs
from orl_jax.config import build as run_config
from orl_jax import sharding
from orl_jax.apps import dry_run
from orl_jax.models import families
from orl_jax.models.diffusion_gemma.model import DiffusionGemma
from orl_jax.models.diffusion_gemma.config import FULL, SLIDING, AttentionSpec, DiffusionGemmaConfig
from orl_jax.models.diffusion_gemma.sampler import SamplerSettings
from orl_jax.models import family_base as base
from orl_jax.decode.trajectories import capture_bytes, route_capture_bytes
from orl_jax.optimizer import frozen_params

TINY = DiffusionGemmaConfig(
    vocab_size=50, d_model=16, n_heads=2, mlp_dim=24, n_experts=4, top_k=2, expert_dim=6,
    layers=(AttentionSpec(SLIDING, head_dim=8, n_kv_heads=2),
            AttentionSpec(FULL, head_dim=12, n_kv_heads=1, rope_type="proportional",
                          rope_theta=1e6, rope_fraction=0.25)),
    sliding_window=4, canvas_length=8)


def _random_flat(cfg, seed):
  model = nnx.eval_shape(lambda: DiffusionGemma(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(seed)
  return {sharding.path_name(p): rng.standard_normal(x.shape).astype(np.float32)
          for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}


def test_registry_entry_maps_config_json_and_every_tensor():
  fam = families.for_model_type("diffusion_gemma")
  assert fam is families.get("diffusion_gemma") and fam.own_model
  assert fam.attention in families.ATTENTION_LAYOUTS
  hf_json = fam.hf_config_json(TINY)
  assert fam.config_from_hf(hf_json) == TINY
  arch = fam.architecture_from_hf(hf_json)
  assert arch["layers"] == TINY.layers and arch["sliding_window"] == 4
  flat = _random_flat(TINY, seed=1)
  rules = fam.tensor_rules(TINY)
  tensors = base.params_to_hf(flat, rules)
  # the fused stacked experts, written out by hand: [E, 2F, D] gate rows then up rows
  f = TINY.expert_dim
  gate_up = tensors["model.decoder.layers.1.experts.gate_up_proj"]
  assert gate_up.shape == (4, 2 * f, 16)
  for e in range(4):
    np.testing.assert_array_equal(gate_up[e, :f], flat["layers.1.moe.gate_proj"][e].T)
    np.testing.assert_array_equal(gate_up[e, f:], flat["layers.1.moe.up_proj"][e].T)
    np.testing.assert_array_equal(tensors["model.decoder.layers.0.experts.down_proj"][e],
                                  flat["layers.0.moe.down_proj"][e].T)
  np.testing.assert_array_equal(
      tensors["model.encoder.language_model.layers.1.layer_scalar"],
      flat["layers.1.commit_layer_scalar"])
  assert "model.decoder.layers.1.self_attn.v_proj.weight" not in tensors   # K = V
  back = base.params_from_hf(tensors, rules)
  assert back.keys() == flat.keys()
  for k in flat:
    np.testing.assert_array_equal(back[k], flat[k], err_msg=k)
  # what the sharded loader reads per device: a slice of a stacked fused piece
  read = lambda name, index: tensors[name][index]
  for ours in ("layers.1.moe.up_proj", "layers.0.moe.down_proj"):
    group = [r for r in rules if r.ours == ours]
    shape = flat[ours].shape
    index = tuple(slice(n // 4, n // 4 + max(n // 2, 1)) for n in shape)
    np.testing.assert_array_equal(base.assemble(group, read, shape, index), flat[ours][index])
  assert base.check_hf_shapes(rules, {k: v.shape for k, v in flat.items()},
                              lambda n: tensors[n].shape) == []


def test_layer_scalars_are_frozen_and_self_conditioning_is_the_residual_pathway():
  from orl_jax.optimizer import param_labels
  frozen = frozen_params(TINY)
  model = DiffusionGemma(TINY, rngs=nnx.Rngs(0))
  labels = {sharding.path_name(p): v for p, v in jax.tree_util.tree_leaves_with_path(
      param_labels(nnx.state(model, nnx.Param), frozen,
                   residual_modules=families.get("diffusion_gemma").residual_modules))}
  assert {k for k, v in labels.items() if v == "frozen"} == {
      f"layers.{i}.{s}" for i in range(2) for s in ("layer_scalar", "commit_layer_scalar")}
  assert {k for k, v in labels.items() if v == "residual"} == {
      k for k in labels if k.startswith("self_conditioning.")}


def test_variants():
  c = dg_configs.get_config()
  m = c.model
  assert m.hf_family == "diffusion_gemma" and m.attention == "token_causal"
  assert (m.d_model, m.n_layers, m.n_heads, m.moe.n_experts, m.moe.top_k) == (2816, 30, 16,
                                                                              128, 8)
  assert m.diffusion_gemma.sliding_window == 1024 and c.decode.block_size == 256
  assert c.orl.capture_routes and c.eval.settings[0] == "entropy_budget_0.1"
  for variant in dg_configs.VARIANTS:
    c = dg_configs.get_config(variant)
    run_config.build(c)        # the decode defaults filled in, every rule checked
  # the sampler's settings are transformers' generation defaults unless the config sets them
  c = dg_configs.get_config()
  assert c.decode.gen_length is None
  c = run_config.build(c)
  own = c.decode.family_settings(SamplerSettings)
  assert (c.decode.gen_length, c.decode.max_steps_per_block, c.decode.rule_value, own.t_min,
          own.t_max, own.stability_threshold, own.confidence_threshold) == (
              256, 48, 0.1, 0.4, 0.8, 1, 0.005)
  with pytest.raises(ValueError, match="26b-a4b"):
    dg_configs.get_config("2b")


def _params_by_hand(fsdp: int, expert: int) -> tuple[int, int]:
  """(parameters, per-device parameter count) of DiffusionGemma-26B-A4B's text stack
  (docs/models.md#diffusiongemma) on fsdp x expert, counted by hand."""
  v, d, h, f, e, fe = 262144, 2816, 16, 2112, 128, 704
  sliding = dict(q=d * h * 256, k=d * 8 * 256, v=d * 8 * 256, o=h * 256 * d, norms=2 * 256)
  full = dict(q=d * h * 512, k=d * 2 * 512, v=0, o=h * 512 * d, norms=2 * 512)
  split_by_fsdp = v * d + 3 * d * f                     # embedding + self-conditioning MLP
  replicated = d + d                                    # final norm, self-conditioning pre-norm
  experts = 0
  for i in range(30):
    a = full if (i + 1) % 6 == 0 else sliding
    split_by_fsdp += a["q"] + a["k"] + a["v"] + a["o"] + 3 * d * f
    experts += 3 * e * d * fe
    replicated += a["norms"] + 7 * d + (d * e + d + e) + 2   # norms, router, layer_scalars
  total = split_by_fsdp + experts + replicated
  if fsdp == 1 and expert == 1:
    return total, total
  return total, split_by_fsdp // fsdp + experts // (fsdp * expert) + replicated


@pytest.mark.parametrize("fsdp", [1, 8])
def test_26b_a4b_dry_run_matches_hand_calculation(fsdp):
  """8 devices (fsdp=1 x expert=8) and 64 (fsdp=8 x expert=8): sized, none needed."""
  c = dg_configs.get_config("26b-a4b")
  c.mesh.fsdp = fsdp
  rows, info = dry_run.sizing_rows(c)
  by = {r.name: r for r in rows}
  total, per_device = _params_by_hand(fsdp, 8)
  assert info["n_params"] == total and 25.0e9 < total < 25.5e9
  assert info["mesh"] == {"data": 1, "fsdp": fsdp, "tensor": 1, "expert": 8}
  bf16 = 2
  assert by["params"].total_bytes == bf16 * total
  assert by["params"].per_device_bytes == bf16 * per_device
  opt = by["optimizer state"]                 # AdamW mu + nu, none for the 60 layer_scalars
  assert 0 <= opt.per_device_bytes - 2 * bf16 * (per_device - 60) < 64
  assert by["KL reference (frozen)"].per_device_bytes == by["params"].per_device_bytes
  shards = fsdp * 8
  for name in ("rollout capture buffers", "replay batch"):
    assert by[name].per_device_bytes == by[name].total_bytes // shards
  # 64 responses x (1 canvas of 256 new tokens, transformers' default length x 48 steps)
  # states, each: canvas 256 x (z 2816 bf16 + token, alpha, entropy + top-16 ids and log-probs
  # + accepted) + block, step, valid
  # + routes (orl.capture_routes): int16 top-8 ids of 30 layers for every token of every state,
  # of the 512-token prompt prefill and of the 256 committed response tokens
  per_state = 256 * (2816 * bf16 + 3 * 4 + 16 * 8 + 1) + 2 * 4 + 1
  routes = 64 * (48 * 256 + 512 + 256) * 30 * 8 * 2
  assert by["rollout capture buffers"].total_bytes == 64 * (48 * per_state + 4 + 1) + routes
  dcfg = types.SimpleNamespace(capture_states=48, block_size=256, top_k=16, gen_length=256,
                               capture_routes=True)
  assert by["rollout capture buffers"].total_bytes == (
      capture_bytes(64, dcfg, 2816, bf16) + route_capture_bytes(64, dcfg, 512, 30, 8))
  note = by["rollout capture buffers"].note      # read from the traced capture
  assert note.startswith("64 responses x 48 captured states x a canvas of 256 tokens") and (
      "+ routes" in note), note
  print(dry_run.format_table(rows, info))
