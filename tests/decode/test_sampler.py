"""The sampler interface (`orl_jax.decode.sampler.Sampler`): every decoder is built through the
model family's sampler, so a family with a decoder of its own needs its folder, one registry
line and a config — no edit of the decoders, the rollouts, replay or training.

The toy family below is registered the way a new folder would be (one entry in
`families.FAMILIES`); its sampler is defined here. `make_decoder` hands every purpose to it,
the rollout included (jitted data-parallel by the shared `make_trajectories`), and what replay and
the SFT layout read comes from it too."""
import dataclasses
import types
import typing

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from orl_jax.decode import build as decode_build
from orl_jax.decode.config import PLACEMENTS
from orl_jax.decode.sampler import BlockPlacement, ReplayContext
from orl_jax.decode.block_sampler import LockstepSampler, PerRowSampler
from orl_jax.models import families
from orl_jax.models.diffusion_gemma.decoding import UniformNoiseSampler
from orl_jax.replay.plan import CONTEXTS


@dataclasses.dataclass
class ToySampler:
  """Decodes every prompt token + 1; its rollout returns the prompts + the rollout step."""
  config: object
  model_cfg: object = None
  needs_mask_token: bool = False
  queued: bool = False
  replay_context: str = "token"
  block_placement: str = "absolute"

  def decoder(self, graphdef, purpose, *, mask_id, eos_id, rule=None, temperature=None,
              n_rows=0):
    return jax.jit(lambda params, prompt_tokens, prompt_valid, key: prompt_tokens + 1)

  def rollout(self, *, mask_id, eos_id, mesh=None):
    def fn(model, prompt_tokens, prompt_valid, key, cfg, group_size, rollout_step):
      return jnp.repeat(prompt_tokens, group_size, axis=0) + rollout_step + cfg
    return fn, 100

  def unresolved(self, state_tokens, commit, mask_id):
    return commit

  def forward_config(self, purpose, *, mask_id, eos_id):
    return None


@pytest.fixture
def toy_family(monkeypatch):
  """A family 'toy' whose sampler is `ToySampler` — its registry line and nothing else."""
  toy = dataclasses.replace(families.OURS, name="toy", sampler=ToySampler)
  monkeypatch.setitem(families.FAMILIES, "toy", toy)
  return types.SimpleNamespace(hf_family="toy")    # the model config of a toy run


def test_a_new_family_decodes_and_rolls_out_with_its_own_sampler(toy_family):
  config = tiny.get_config("eval")
  graphdef, params = nnx.split(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.Param)
  prompts, valid = jnp.arange(6, dtype=jnp.int32).reshape(2, 3), jnp.ones((2, 3), bool)
  ids = dict(mask_id=0, eos_id=1)
  for purpose in ("evaluate", "decode"):
    run = decode_build.make_decoder(config, toy_family, graphdef, purpose, **ids)
    np.testing.assert_array_equal(run(params, prompts, valid, jax.random.key(0)), prompts + 1)
  run = decode_build.make_decoder(config, toy_family, graphdef, "rollout", group_size=2, **ids)
  out = run(params, prompts, valid, jax.random.key(0), 5)
  np.testing.assert_array_equal(out, np.repeat(prompts, 2, axis=0) + 105)
  sampler = decode_build.sampler_of(config, toy_family)
  assert isinstance(sampler, ToySampler) and sampler.replay_context == "token"
  assert not decode_build.sampler_of(config, family="toy").needs_mask_token


def test_each_family_gets_its_sampler_and_the_schedule_picks_the_block_one():
  config = tiny.get_config("eval")
  assert type(decode_build.sampler_of(config)) is LockstepSampler
  config.decode.schedule = "per_row"
  per_row = decode_build.sampler_of(config)
  assert type(per_row) is PerRowSampler and per_row.queued and per_row.needs_mask_token
  dg = decode_build.sampler_of(config, family="diffusion_gemma")
  assert isinstance(dg, UniformNoiseSampler) and not dg.needs_mask_token
  assert (dg.replay_context, per_row.replay_context) == ("token", "block")
  tokens, commit = jnp.array([[3, 0, 4]]), jnp.array([[True, False, False]])
  np.testing.assert_array_equal(per_row.unresolved(tokens, commit, 0), [[False, True, False]])
  np.testing.assert_array_equal(dg.unresolved(tokens, commit, 0), [[False, True, True]])
  assert dg.forward_config("rollout", mask_id=-1, eos_id=1) is None


def test_the_protocols_literals_are_the_checked_values():
  """The values the type checker allows are the ones the configs check at run time."""
  assert typing.get_args(ReplayContext) == CONTEXTS
  assert typing.get_args(BlockPlacement) == PLACEMENTS
