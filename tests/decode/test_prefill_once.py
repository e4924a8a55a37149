"""The lock-step rollout that prefills each prompt once (`prefill_once`,
docs/method.md#the-prompt-is-prefilled-once): its prompt forward runs on P rows, not P·G, and
for the dense block-causal families its trajectories equal those of decoding the prompt
repeated G times bit for bit (tokens, forward counts, captured states) where the program's
kernels do not depend on the batch: compiled without XLA:CPU's YNNPACK fusions, whose results
change in the last bits with the number of rows (the doc section says what differs)."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.decode import lockstep
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.trajectories import lockstep_trajectories, make_trajectories
from orl_jax.unmasking import UnmaskRule
from tests.support.helpers import TINY, TINY_RULES, live_adapter
from tests.support.hf import OTHER_FAMILIES
from tests.support.llada2 import build_model, random_flat_params
from tests.support.moe_replay import CFG as LLADA2_MOE

# compares token ids and forward counts: rerun under other CPU numerics (make test-other-cpu)
pytestmark = pytest.mark.numerics

N_PROMPTS, GROUP, P, GEN, BLOCK = 3, 4, 24, 12, 4
PAD_LEFT = [0, 7, 18]
EOS = 2    # an ordinary token of the random models: some responses end early
BATCH_INVARIANT = {"xla_cpu_experimental_ynn_fusion_type": ""}

# family -> its model config, with a live residual adapter (captured z changes the logits);
# LLaDA2's MoE with the grouped (ragged) expert compute it runs with (the dense expansion, a
# test reference, sums in another order at another batch), its routes captured
ADAPTER = dict(residual_mode="adapter", residual_hidden=16)
FAMILIES = {
    "tiny": dataclasses.replace(TINY, **ADAPTER),
    "llada2_moe": dataclasses.replace(LLADA2_MOE,
                                      moe=dataclasses.replace(LLADA2_MOE.moe, impl="ragged")),
    "sdar": dataclasses.replace(OTHER_FAMILIES["sdar"][1], **ADAPTER),
    "qwendlm": dataclasses.replace(OTHER_FAMILIES["qwendlm"][1], **ADAPTER),
}


def _model(family: str):
  cfg = FAMILIES[family]
  model = build_model(cfg, random_flat_params(cfg, seed=4))
  return nnx.split(live_adapter(model, 0.05, 9))


def _decode_cfg(family: str) -> DecodeConfig:
  cfg = FAMILIES[family]
  return DecodeConfig(gen_length=GEN, block_size=BLOCK, mask_id=cfg.mask_id, eos_id=EOS,
                      rule=UnmaskRule("threshold", 0.5), temperature=1.0, capture_states=24,
                      capture_routes=cfg.moe is not None, **TINY_RULES)


def _rollout(family: str, prefill_once: bool, prefill_rows: list):
  """The family's rollout of N_PROMPTS prompts; `prefill_rows` gets the rows of each KV cache
  the prefill creates (traced once per program)."""
  graphdef, params = _model(family)
  vocab = FAMILIES[family].vocab_size
  prompts = jax.random.randint(jax.random.key(0), (N_PROMPTS, P), 3, min(vocab, 40))
  valid = jnp.arange(P)[None] >= jnp.array(PAD_LEFT)[:, None]
  rollout_fn = functools.partial(lockstep_trajectories, prefill_once=prefill_once)
  init_cache = lockstep.init_cache

  def spy(cfg, batch, length):
    prefill_rows.append(batch)
    return init_cache(cfg, batch, length)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(lockstep, "init_cache", spy)
    run = make_trajectories(graphdef, _decode_cfg(family), GROUP, rollout_fn=rollout_fn)
    # batch-invariant kernels: XLA's own dot emitter, not YNNPACK's fusions
    lowered = run.lower(params, prompts, valid, jax.random.key(5), 0)
    compiled = lowered.compile(compiler_options=BATCH_INVARIANT)
    return jax.device_get(compiled(params, prompts, valid, jax.random.key(5), 0))


# LLaDA2's MoE in the default suite (the repeated cache and routes); the dense families (the
# tiny model, SDAR and QwenDLM: Qwen3 layers, untied / tied head) behind `slow`
@pytest.mark.parametrize("family", [
    "llada2_moe", pytest.param("tiny", marks=pytest.mark.slow),
    pytest.param("sdar", marks=pytest.mark.slow), pytest.param("qwendlm", marks=pytest.mark.slow)])
def test_prefill_once_is_the_repeated_prompt_rollout(family):
  once_rows, repeated_rows = [], []
  once = _rollout(family, True, once_rows)
  repeated = _rollout(family, False, repeated_rows)
  assert once_rows == [N_PROMPTS] and repeated_rows == [N_PROMPTS * GROUP]
  leaves = jax.tree_util.tree_leaves_with_path(once)
  ref = jax.tree_util.tree_leaves(repeated)
  assert jax.tree_util.tree_structure(once) == jax.tree_util.tree_structure(repeated)
  for (path, a), b in zip(leaves, ref, strict=True):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  assert (once.capture.routes is not None) == (FAMILIES[family].moe is not None)
  # not vacuous: responses differ within a group, and some end before the last block
  responses = np.asarray(once.responses).reshape(N_PROMPTS, GROUP, -1)
  assert any(len({r.tobytes() for r in group}) > 1 for group in responses)
  assert np.asarray(once.capture.valid).sum() > N_PROMPTS * GROUP


def test_orl_prefill_once_reaches_the_rollout(tmp_path):
  """`orl.prefill_once` is the lock-step rollout's `prefill_once`, and the per-row rollout's
  (its prompt pool, `tests/decode/test_per_row_prefill_once.py`)."""
  from orl_jax.config.build import build
  from orl_jax.decode.block_sampler import block_sampler
  from orl_jax.decode.trajectories import per_row_trajectories
  from tests.support.helpers import orl_smoke_config
  c = orl_smoke_config(tmp_path)
  assert block_sampler(build(c)).rollout(mask_id=1, eos_id=EOS)[0] is lockstep_trajectories
  c.orl.prefill_once = True
  rollout_fn, _ = block_sampler(build(c)).rollout(mask_id=1, eos_id=EOS)
  assert rollout_fn.func is lockstep_trajectories
  assert rollout_fn.keywords == {"prefill_once": True}
  c.decode.schedule = "per_row"
  rollout_fn, _ = block_sampler(build(c)).rollout(mask_id=1, eos_id=EOS)
  assert rollout_fn.func is per_row_trajectories
  assert rollout_fn.keywords == {"n_rows": 0, "prefill_once": True}
