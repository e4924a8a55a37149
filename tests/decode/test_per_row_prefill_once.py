"""The per-row rollout that prefills each prompt once (`per_row_trajectories(...,
prefill_once=True)`, docs/decoding.md#the-prompt-pool): the group's prompt is prefilled once into
a prompt pool before the loop and each row copies its prompt's cache from it, and the
trajectories equal those of every row prefilling its own copy bit for bit (tokens, forward
counts, captured states, MoE routes) where the kernels do not depend on the batch (compiled
without XLA:CPU's YNNPACK fusions, as `test_prefill_once.py`), with one row per response. On
fewer rows (rows refilled mid-loop copy from the pool) the tokens, forward counts, top-K ids and
routes are still identical, but XLA:CPU's small-matmul emitter rounds a row by its place in the
batch (a prompt prefilled at row 4 of 5 rows has other last bits than at row 1 of 3), so the
pool's keys, prefilled on D rows, differ in the last bits from the engine's own prefill and the
captured floats are compared to float rounding there."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orl_jax.decode import per_row
from orl_jax.decode.trajectories import make_trajectories, per_row_trajectories
from tests.decode.test_prefill_once import (BATCH_INVARIANT, FAMILIES, GROUP, N_PROMPTS, P,
                                            PAD_LEFT, _decode_cfg, _model)

# compares token ids and forward counts: rerun under other CPU numerics (make test-other-cpu)
pytestmark = pytest.mark.numerics


def _rollout(family: str, prefill_once: bool, n_rows: int, prefills: list):
  """The family's per-row rollout of N_PROMPTS prompts on `n_rows` rows (0: one per response);
  `prefills` gets the rows of every prompt-pool fill (traced once per program)."""
  graphdef, params = _model(family)
  vocab = FAMILIES[family].vocab_size
  prompts = jax.random.randint(jax.random.key(0), (N_PROMPTS, P), 3, min(vocab, 40))
  valid = jnp.arange(P)[None] >= jnp.array(PAD_LEFT)[:, None]
  rollout_fn = functools.partial(per_row_trajectories, n_rows=n_rows, prefill_once=prefill_once)
  fill_pool = per_row._fill_pool

  def spy(eng, group_size):
    pool, routes = fill_pool(eng, group_size)
    prefills.append(pool.k.shape[1])
    return pool, routes

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(per_row, "_fill_pool", spy)
    run = make_trajectories(graphdef, _decode_cfg(family), GROUP, rollout_fn=rollout_fn)
    lowered = run.lower(params, prompts, valid, jax.random.key(5), 0)
    compiled = lowered.compile(compiler_options=BATCH_INVARIANT)
    return jax.device_get(compiled(params, prompts, valid, jax.random.key(5), 0))


# LLaDA2's MoE (its routes: the pool's prefill routes serve the group) in the default suite
# (fewer rows with a pool: tests/decode/test_rollout_refill.py); the rest behind `slow`
@pytest.mark.parametrize("family,n_rows", [
    ("llada2_moe", 0), pytest.param("tiny", 5, marks=pytest.mark.slow),
    pytest.param("tiny", 0, marks=pytest.mark.slow),
    pytest.param("llada2_moe", 5, marks=pytest.mark.slow),
    pytest.param("sdar", 0, marks=pytest.mark.slow),
    pytest.param("qwendlm", 5, marks=pytest.mark.slow)])
def test_per_row_prefill_once_is_the_repeated_prompt_rollout(family, n_rows):
  once_fills, repeated_fills = [], []
  once = _rollout(family, True, n_rows, once_fills)
  repeated = _rollout(family, False, n_rows, repeated_fills)
  assert once_fills == [N_PROMPTS] and repeated_fills == []
  leaves = jax.tree_util.tree_leaves_with_path(once)
  ref = jax.tree_util.tree_leaves(repeated)
  assert jax.tree_util.tree_structure(once) == jax.tree_util.tree_structure(repeated)
  floats = (".capture.z", ".capture.alpha", ".capture.entropy", ".capture.topk_logprobs")
  for (path, a), b in zip(leaves, ref, strict=True):
    name = jax.tree_util.keystr(path)
    if n_rows and name in floats:
      scale = max(np.abs(a).max(initial=0), np.abs(b).max(initial=0), 1e-30)
      np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=0, err_msg=name)
    else:
      np.testing.assert_array_equal(a, b, err_msg=name)
  assert (once.capture.routes is not None) == (FAMILIES[family].moe is not None)
  # not vacuous: responses differ within a group, and some end before the last block
  responses = np.asarray(once.responses).reshape(N_PROMPTS, GROUP, -1)
  assert any(len({r.tobytes() for r in group}) > 1 for group in responses)
  assert np.asarray(once.capture.valid).sum() > N_PROMPTS * GROUP
