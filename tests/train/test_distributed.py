import ml_collections
import numpy as np
import pytest

from orl_jax.data.pipeline import prompt_dataset
from orl_jax.distributed import initialize_kwargs, should_initialize
from orl_jax.sharding import dcn_sizes, fill_axis_sizes, hybrid_shapes, make_mesh


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


def test_hybrid_shapes_split_each_axis_into_ici_and_dcn():
  assert hybrid_shapes([8, 4, 2], dict(data=2, fsdp=2), 4) == ([4, 2, 2], [2, 2, 1])
  assert hybrid_shapes([8, 1, 1], [8, 1, 1], 8) == ([1, 1, 1], [8, 1, 1])
  with pytest.raises(ValueError, match="divide the mesh axes"):
    hybrid_shapes([6, 1, 1], dict(data=4), 4)
  with pytest.raises(ValueError, match="spans 2 granules .* has 4"):
    hybrid_shapes([8, 1, 1], dict(data=2), 4)
  with pytest.raises(ValueError, match="unknown axes"):
    dcn_sizes(dict(dp=2))
  assert dcn_sizes(None) == [1, 1, 1]


def test_mesh_sizes_must_multiply_to_the_devices():
  assert fill_axis_sizes([-1, 2, 1], 8) == [4, 2, 1]
  with pytest.raises(ValueError, match="needs 4 devices, 8 available"):
    fill_axis_sizes([2, 2, 1], 8)
  with pytest.raises(ValueError, match="cannot be split"):
    fill_axis_sizes([-1, 3, 1], 8)


def test_dcn_mesh_on_one_process():
  """One process is one granule: a DCN split of 1 gives the plain mesh, more is refused. (The
  hybrid mesh over two processes is built in tests/train/test_multiprocess.py.)"""
  plain = make_mesh()
  assert make_mesh(dcn=dict(data=1, fsdp=1, tensor=1)).devices.tolist() == plain.devices.tolist()
  assert make_mesh(dcn=dict(data=1)).axis_types == plain.axis_types
  with pytest.raises(ValueError, match="mesh.dcn"):
    make_mesh(dcn=dict(data=2))


def test_process_rows_give_the_single_process_stream():
  """Each process loads the rows of every global batch its devices hold: concatenated, the
  processes' batches are the one-process batches."""
  one = iter(prompt_dataset(None, batch_size=6))
  parts = [iter(prompt_dataset(None, batch_size=6, rows=r)) for r in ((0, 1), (2, 3), (4, 5))]
  for _ in range(3):
    np.testing.assert_array_equal(np.concatenate([next(p) for p in parts]), next(one))
  # a process may hold rows that are not adjacent (an inner batch axis across processes)
  strided = iter(prompt_dataset(None, batch_size=6, rows=(1, 4)))
  assert next(strided).tolist() == [1, 4] and next(strided).tolist() == [7, 10]


def test_a_shuffle_seed_permutes_the_stream_the_same_way_for_any_process_split():
  """`shuffle_seed` >= 0: the global stream is a seeded permutation of the problem indices
  (distinct, other seeds give other orders), and the processes' rows still concatenate to it."""
  natural = next(iter(prompt_dataset(None, batch_size=64)))
  first = [next(it) for it in [iter(prompt_dataset(None, batch_size=64, shuffle_seed=0))] * 3]
  again = next(iter(prompt_dataset(None, batch_size=64, shuffle_seed=0)))
  other = next(iter(prompt_dataset(None, batch_size=64, shuffle_seed=1)))
  np.testing.assert_array_equal(first[0], again)
  stream = np.concatenate(first)
  assert len(set(stream.tolist())) == stream.size           # a permutation: no repeats
  assert np.mean(first[0] == natural) < 0.1 and np.mean(first[0] == other) < 0.1
  parts = [iter(prompt_dataset(None, batch_size=64, rows=r, shuffle_seed=0))
           for r in (range(0, 32), range(32, 64))]
  np.testing.assert_array_equal(np.concatenate([next(p) for p in parts]), first[0])


def test_coordinator_variables_are_passed_on():
  """JAX reads JAX_COORDINATOR_ADDRESS itself but not the process count and id."""
  env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
         "JAX_PROCESS_ID": "3"}
  assert initialize_kwargs(_cfg("auto"), env) == dict(coordinator_address="10.0.0.1:1234",
                                                      num_processes=4, process_id=3)
  assert initialize_kwargs(_cfg("auto"), {"SLURM_NTASKS": "4"}) == {}   # JAX detects SLURM
  explicit = ml_collections.ConfigDict(dict(mode="on", coordinator="h:1", num_processes=2,
                                            process_id=1))
  assert initialize_kwargs(explicit, env) == dict(coordinator_address="h:1", num_processes=2,
                                                  process_id=1)
  with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
    initialize_kwargs(_cfg("auto"), dict(env, JAX_PROCESS_ID="three"))
