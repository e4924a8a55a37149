import ml_collections
import pytest

from orl_jax.distributed import should_initialize


def _cfg(mode):
  return ml_collections.ConfigDict(dict(mode=mode, coordinator="", num_processes=0, process_id=-1))


@pytest.mark.parametrize("env,expected", [
    ({}, False),
    ({"SLURM_NTASKS": "1"}, False),
    ({"SLURM_NTASKS": "4"}, True),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
    ({"TPU_WORKER_HOSTNAMES": "h0"}, False),
    ({"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3"}, True),
])
def test_auto_detects_multiprocess_jobs(env, expected):
  assert should_initialize(_cfg("auto"), env)[0] is expected


def test_explicit_modes():
  assert should_initialize(_cfg("off"), {"SLURM_NTASKS": "8"})[0] is False
  assert should_initialize(_cfg("on"), {})[0] is True
  with pytest.raises(ValueError, match="distributed.mode"):
    should_initialize(_cfg("maybe"), {})
