"""The MoE feed-forward (orl_jax/models/moe.py): router vs an independent numpy router, ragged ==
dense, expert-axis shard_map (token all-to-all) == one device and its lowering for TPU/GPU, route
capture, frozen router, balance loss."""
import dataclasses
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orl_jax.models import moe as moe_lib
from tests.support.helpers import run_on_4_cpu_devices
from tests.support.llada2 import ROUTER_MARGIN, reference_route
from tests.support.moe import CFG, apply_moe, random_moe, random_x, sin_loss_and_grads

# The tests that compare expert ids are marked `numerics`: rerun under other CPU numerics (make
# test-other-cpu); the lowering, the rules, the bad configs and the ORL iteration on an expert
# mesh (a finite loss) do not depend on rounding.


@pytest.mark.numerics
def test_router_matches_numpy_reference():
  rng = np.random.default_rng(0)
  x = rng.standard_normal((64, 16))
  gate_w = rng.standard_normal((8, 16)) / 4
  bias = 0.3 * rng.standard_normal(8)
  want_ids, want_w, margin = reference_route(x, gate_w, bias, CFG)
  assert margin > ROUTER_MARGIN, margin
  logits = jnp.asarray(x @ gate_w.T, jnp.float32)
  got = moe_lib.route(logits, jnp.asarray(bias, jnp.float32), CFG)
  np.testing.assert_array_equal(np.asarray(got.expert_ids), want_ids)   # both best-first
  np.testing.assert_allclose(np.asarray(got.weights), want_w, rtol=1e-5, atol=0)
  # Given ids win for tokens whose first entry is >= 0; -1 re-routes.
  given = np.full((64, 2), -1)
  given[::3] = [[5, 0]]
  replayed = moe_lib.route(logits, jnp.asarray(bias, jnp.float32), CFG, jnp.asarray(given))
  want = np.where(given[:, :1] >= 0, given, want_ids)
  np.testing.assert_array_equal(np.asarray(replayed.expert_ids), want)
  scores = 1 / (1 + np.exp(-(x @ gate_w.T)))
  chosen = scores[0, [5, 0]]
  np.testing.assert_allclose(np.asarray(replayed.weights[0]), chosen / chosen.sum() * 2.5,
                             rtol=1e-5)


@pytest.mark.numerics
def test_ragged_equals_dense_values_and_grads():
  graphdef, params = random_moe(CFG)
  ragged_def, _ = random_moe(dataclasses.replace(CFG, impl="ragged"))
  x = random_x(1)
  dense_out = apply_moe(graphdef, params, x)
  ragged_out = apply_moe(ragged_def, params, x)
  np.testing.assert_array_equal(np.asarray(dense_out.expert_ids),
                                np.asarray(ragged_out.expert_ids))
  scale = float(jnp.max(jnp.abs(dense_out.y)))
  np.testing.assert_allclose(np.asarray(ragged_out.y), np.asarray(dense_out.y), rtol=0,
                             atol=1e-5 * scale)
  (lv, (gp, gx)), (rv, (rp, rx)) = (sin_loss_and_grads(graphdef, params, x),
                                    sin_loss_and_grads(ragged_def, params, x))
  np.testing.assert_allclose(float(rv), float(lv), rtol=1e-5)
  for got, want in zip(jax.tree.leaves((rp, rx)), jax.tree.leaves((gp, gx))):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                               atol=1e-5 * float(jnp.max(jnp.abs(want))) + 1e-30)


@pytest.mark.numerics
def test_route_capture_and_frozen_router():
  cfg = dataclasses.replace(CFG, impl="ragged")
  graphdef, params = random_moe(cfg)
  x = random_x(2)
  out = apply_moe(graphdef, params, x)
  replay = apply_moe(graphdef, params, x, np.asarray(out.expert_ids))
  np.testing.assert_array_equal(np.asarray(replay.y), np.asarray(out.y))
  # The router trains under replay (weights come from its scores) unless frozen; the
  # selection-only expert bias never gets a gradient.
  _, (grads, _) = sin_loss_and_grads(graphdef, params, x)
  assert float(jnp.max(jnp.abs(grads["router"]["kernel"][...]))) > 0
  np.testing.assert_array_equal(np.asarray(grads["router"]["expert_bias"][...]), 0.0)
  frozen_def, _ = random_moe(dataclasses.replace(cfg, freeze_router=True))
  _, (frozen, _) = sin_loss_and_grads(frozen_def, params, x)
  np.testing.assert_array_equal(np.asarray(frozen["router"]["kernel"][...]), 0.0)
  assert float(jnp.max(jnp.abs(frozen["gate_proj"][...]))) > 0
  assert moe_lib.frozen_param("layers.3.mlp.router.expert_bias", cfg)
  assert not moe_lib.frozen_param("layers.3.mlp.router.kernel", cfg)
  assert moe_lib.frozen_param("layers.3.mlp.router.kernel",
                              dataclasses.replace(cfg, freeze_router=True))
  assert not moe_lib.frozen_param("layers.3.mlp.gate_proj", cfg)


@pytest.mark.parametrize("field,value,match", [
    ("impl", "megablox", "model.moe.impl"),
    ("n_group", 3, "model.moe.n_group"),
    ("topk_group", 5, "model.moe.topk_group"),
    ("top_k", 5, "model.moe.top_k"),
    ("expert_parallel", True, "model.moe.expert_parallel"),
    ("exchange", "nccl", "model.moe.exchange"),
])
def test_bad_config_names_the_field(field, value, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(CFG, **{field: value}).validate()


_EXPERT_AXIS_SCRIPT = textwrap.dedent("""
  import dataclasses
  import jax
  jax.config.update("jax_num_cpu_devices", 4)
  import jax.numpy as jnp
  import numpy as np
  from orl_jax import sharding
  from orl_jax.models import moe as moe_lib
  from tests.support.moe import CFG, apply_moe, random_moe, random_x, sin_loss_and_grads
  assert jax.device_count() == 4
  RULES = moe_lib.PARTITION_RULES + sharding.PARTITION_RULES

  def rel_err(got, want):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    return max(float(jnp.max(jnp.abs(jnp.asarray(g) - w))) / (float(jnp.max(jnp.abs(w))) + 1e-30)
               for g, w in zip(got, want))

  # The padded all-to-all reproduces the example of jax.lax.ragged_all_to_all's docstring.
  mesh = jax.make_mesh((2,), ("expert",), axis_types=(jax.sharding.AxisType.Auto,))
  def example(operand, output, *slices):
    return moe_lib.padded_all_to_all(operand, output, moe_lib.RaggedSlices(*slices), capacity=2)
  args = [[1, 2, 2, 3, 4, 0], [0] * 8, [0, 1, 0, 1], [1, 2, 1, 1], [0, 0, 1, 2], [1, 1, 2, 1]]
  got = jax.shard_map(example, mesh=mesh, in_specs=jax.sharding.PartitionSpec("expert"),
                      out_specs=jax.sharding.PartitionSpec("expert"))(
                          *(jnp.asarray(a, jnp.int32) for a in args))
  np.testing.assert_array_equal(np.asarray(got), [1, 3, 0, 0, 2, 2, 4, 0])

  cfg = dataclasses.replace(CFG, impl="ragged")
  graphdef, params = random_moe(cfg)
  x = random_x(5, b=4, t=6)
  want = sin_loss_and_grads(graphdef, params, x)
  # captured routes: distinct experts per token, every third token re-routed (-1)
  rng = np.random.default_rng(0)
  routes = np.stack([rng.permutation(cfg.n_experts)[:cfg.top_k] for _ in range(24)])
  routes[::3] = -1
  routes = jnp.asarray(routes.reshape(4, 6, cfg.top_k), jnp.int32)
  want_replay = apply_moe(graphdef, params, x, routes)
  assert (np.asarray(want_replay.expert_ids)[routes[..., 0] >= 0]
          == np.asarray(routes)[routes[..., 0] >= 0]).all()
  for exchange in ("all_to_all", "ragged_all_to_all"):   # the latter runs padded on CPU
    ep_def, _ = random_moe(dataclasses.replace(cfg, expert_parallel=True, exchange=exchange))
    for sizes in (dict(expert=4), dict(data=2, expert=2), dict(data=1, fsdp=2, expert=2)):
      mesh = sharding.make_mesh(**sizes)
      with jax.set_mesh(mesh):
        ep_params = jax.device_put(params, sharding.tree_shardings(params, mesh, RULES))
        got = sin_loss_and_grads(ep_def, ep_params, x)
        replay = apply_moe(ep_def, ep_params, x, routes)
      gate = got[1][0]["gate_proj"][...]
      assert gate.sharding.spec[0] == "expert", gate.sharding
      err = rel_err(got, want)
      np.testing.assert_array_equal(np.asarray(replay.expert_ids),
                                    np.asarray(want_replay.expert_ids))
      replay_err = rel_err(replay.y, want_replay.y)
      print(exchange, sizes, "loss+grads", err, "replay", replay_err)
      assert err <= 1e-5 and replay_err <= 1e-5, (err, replay_err)
  print("EXPERT_AXIS_OK")
""")


@pytest.mark.numerics
def test_expert_axis_all_to_all_equals_one_device_on_4_cpu_devices():
  """Experts split over the `expert` axis, tokens exchanged by all-to-all inside shard_map, give
  the one-device loss and gradients (expert=4; expert=2 next to data=2 or fsdp=2), and the
  captured routes are honoured there as on one device."""
  run_on_4_cpu_devices(_EXPERT_AXIS_SCRIPT, "EXPERT_AXIS_OK")


_LOWERING_SCRIPT = textwrap.dedent("""
  import dataclasses
  import jax
  jax.config.update("jax_num_cpu_devices", 4)
  import jax.numpy as jnp
  from orl_jax import sharding
  from orl_jax.models import moe as moe_lib
  from pallas_kernels.staircase_attention.lowering import custom_calls, lowered_text
  from tests.support.moe import CFG, random_moe, sin_loss

  mesh = sharding.make_mesh(expert=4)
  rules = moe_lib.PARTITION_RULES + sharding.PARTITION_RULES
  for exchange in ("auto", "all_to_all"):
    cfg = dataclasses.replace(CFG, impl="ragged", expert_parallel=True, exchange=exchange)
    graphdef, params = random_moe(cfg)
    with jax.set_mesh(mesh):
      abstract = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
      params = jax.tree.map(abstract, params, sharding.tree_shardings(params, mesh, rules))
      x = jax.ShapeDtypeStruct((4, 6, 16), jnp.float32, sharding=sharding.batch_sharding(mesh))
      step = jax.grad(lambda p, x: sin_loss(graphdef, p, x), argnums=(0, 1))
      for platform in ("tpu", "cuda"):
        text = lowered_text(step, params, x, platform=platform)
        print(exchange, platform, dict(custom_calls(text)),
              "all_to_all", text.count("stablehlo.all_to_all"),
              "all_gather", text.count("all_gather"))
        if exchange == "auto":   # the ragged collective, out and back, forward and backward
          assert custom_calls(text)["ragged_all_to_all"] >= 4, text[-3000:]
        assert text.count("stablehlo.all_to_all") >= 2, text[-3000:]
        assert "all_gather" not in text and "reduce_scatter" not in text
      if exchange == "all_to_all":   # XLA's own partitioning adds no gather either (CPU HLO)
        hlo = jax.jit(step).lower(params, x).compile().as_text()
        assert "all-to-all(" in hlo and "all-gather(" not in hlo, hlo[-3000:]
  print("MOE_LOWERING_OK")
""")


def test_expert_axis_lowers_to_all_to_all_for_tpu_and_gpu():
  """The expert-parallel forward+backward lowered for `tpu` and `cuda`
  (docs/scaling.md#compiling-for-tpus-and-gpus-you-do-not-have) on an expert=4 mesh: `auto`
  exchanges with `ragged_all_to_all`, `all_to_all` with the padded collective, and nothing gathers
  the tokens over the expert axis."""
  run_on_4_cpu_devices(_LOWERING_SCRIPT, "MOE_LOWERING_OK")


def test_partition_rules_split_experts_over_the_expert_axis():
  from jax.sharding import PartitionSpec as P
  from orl_jax import sharding
  rules = moe_lib.PARTITION_RULES + sharding.PARTITION_RULES
  mesh_shape = {"data": 1, "fsdp": 2, "expert": 4, "tensor": 1}
  spec = lambda name, shape: sharding.partition_spec(name, shape, mesh_shape, rules)
  assert spec("layers.1.mlp.gate_proj", (8, 16, 12)) == P("expert", "fsdp", None)
  assert spec("layers.1.mlp.down_proj", (8, 12, 16)) == P("expert", None, "fsdp")
  assert spec("layers.1.mlp.shared_experts.up_proj.kernel", (16, 12)) == P("fsdp", None)
  assert spec("layers.1.mlp.router.kernel", (16, 8)) == P(None, None)
  assert spec("layers.0.mlp.gate_proj.kernel", (16, 40)) == P("fsdp", None)   # dense layer


_EXPERT_AXIS_TRAIN_SCRIPT = textwrap.dedent("""
  import jax
  jax.config.update("jax_num_cpu_devices", 2)
  import os, tempfile
  import numpy as np
  from configs import llada
  from orl_jax.metrics import read_jsonl
  from orl_jax.train.entry import train

  c = llada.get_config("debug")
  c.workdir = tempfile.mkdtemp()
  c.train.steps = 1
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor, c.mesh.expert = 1, 1, 1, 2
  c.model.moe.impl = "ragged"
  train(c, progress=False)
  row = read_jsonl(os.path.join(c.workdir, "metrics.jsonl"))[-1]
  assert row["step"] == 1 and np.isfinite(row["loss"]), row
  print("EXPERT_AXIS_TRAIN_OK")
""")


def test_an_orl_iteration_trains_with_the_experts_split_over_the_expert_axis():
  """`train()` on a mesh with an `expert` axis: the rollout, replay and update are traced on
  that mesh (`sharding.tracing_mesh`), so the MoE layers run expert-parallel inside shard_map
  (without it their trace stops: no mesh with an expert axis)."""
  run_on_4_cpu_devices(_EXPERT_AXIS_TRAIN_SCRIPT, "EXPERT_AXIS_TRAIN_OK")
