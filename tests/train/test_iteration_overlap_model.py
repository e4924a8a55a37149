"""The host-path model of benchmarks/iteration_overlap.py, on hand-computed cases."""
import importlib.util
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_benchmark():
  """benchmarks/iteration_overlap.py as a module, without leaving benchmarks/ on sys.path or
  its `_common` in sys.modules (the launchers have a `_common` of their own)."""
  folder = os.path.join(ROOT, "benchmarks")
  before = sys.modules.pop("_common", None)
  sys.path.insert(0, folder)
  try:
    spec = importlib.util.spec_from_file_location(
        "iteration_overlap_benchmark", os.path.join(folder, "iteration_overlap.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclasses look their module up there
    spec.loader.exec_module(module)
  finally:
    sys.path.remove(folder)
    sys.modules.pop("_common", None)
    if before is not None:
      sys.modules["_common"] = before
  return module


bench = _load_benchmark()

COST = bench.VerifyCost(cpu_s=0.05, held_s=0.25, loop_cpu_s=3.0, loop_held_s=4.0)


def test_verification_is_the_cores_or_one_prompt_in_a_row():
  # 8 x 16 samples of 0.05 s CPU on 96 cores: 0.067 s of CPU each core, but a prompt's 16
  # samples hold 0.25 s each one after another: 4 s
  assert bench.verification_seconds(COST, 8, 16, 96, False) == pytest.approx(4.0)
  # on 1 core the CPU binds: 128 x 0.05 = 6.4 s
  assert bench.verification_seconds(COST, 8, 16, 1, False) == pytest.approx(6.4)
  # one looping sample a prompt: 15 x 0.25 + 4 s in a row; CPU 8 x 3 + 120 x 0.05 = 30 s
  assert bench.verification_seconds(COST, 8, 16, 96, True) == pytest.approx(7.75)
  assert bench.verification_seconds(COST, 8, 16, 1, True) == pytest.approx(30.0)


def test_a_two_stage_pipeline_exposes_the_last_chunk_and_the_overruns():
  assert bench.exposed_verification(1.0, 4, 2.0) == pytest.approx(1.0)        # all hidden
  assert bench.exposed_verification(1.0, 4, 0.5) == pytest.approx(1.0 + 3 * 0.5)
  assert bench.exposed_verification(1.0, 4, None) == pytest.approx(1.0)


def test_chunks_by_samples_leave_the_last_chunks_samples_exposed():
  paths = bench.host_paths(COST, 0.1, 8, 16, 96, 4, False, decode_chunk_s=10.0)
  assert paths["verify_s"] == pytest.approx(4.0)               # serial: 16 slots in a row
  assert paths["verify_last_chunk_s"] == pytest.approx(1.0)    # 4 samples a prompt
  assert paths["serial_s"] == pytest.approx(4.1) and paths["overlapped_s"] == pytest.approx(1.1)
  one = bench.host_paths(COST, 0.1, 8, 16, 96, 1, False, decode_chunk_s=10.0)
  assert one["overlapped_s"] == pytest.approx(one["serial_s"])    # one chunk hides nothing


def test_device_time_adds_a_weight_read_per_chunk_and_forward():
  device = {"seconds": 2.0, "forwards": 256.0, "n_params": 8_000_000_000, "n_devices": 4,
            "chip": "TPU v5p", "mesh": {"data": 1, "fsdp": 4, "tensor": 1, "expert": 1}}
  read = 2 * 8e9 / 4 / 2.765e12                                 # bf16 weights a chip / HBM
  assert bench.weights_read_s(device) == pytest.approx(read)
  # an MoE (FLOPs not counted): every chunk's forward is one read of the weights
  one, four = (bench.device_seconds(device, k, 128, 32, dense=False) for k in (1, 4))
  assert one["total_s"] == pytest.approx(2.0 + 256 * read)
  assert four["total_s"] - one["total_s"] == pytest.approx(3 * 256 * read)
  assert four["decode_chunk_s"] == pytest.approx(256 * read)
  # dense, 128 rows of 4 tokens: 2 x 8e9 x 512 FLOPs over 4 chips' peak bind at one chunk,
  # the weight reads at 16
  flops = 2 * 8e9 * 128 * 4 / (4 * 459e12)
  assert flops > read and flops / 16 < read
  assert bench.device_seconds(device, 1, 128, 4, True)["rollout_s"] == pytest.approx(256 * flops)
  assert bench.device_seconds(device, 16, 128, 4, True)["rollout_s"] == pytest.approx(
      16 * 256 * read)
  assert bench.chunk_choices(16) == [1, 2, 4, 8, 16]
  assert bench.idle_fraction(1.0, 3.0) == pytest.approx(0.25)


def test_only_the_last_chunk_holds_the_loops():
  # 16 chunks of one sample a prompt; the looping ones (4 s each, side by side) in the last
  # chunk; the earlier chunks' 0.25 s hide behind 1 s of decoding each
  paths = bench.host_paths(COST, 0.0, 8, 16, 96, 16, True, decode_chunk_s=1.0)
  assert paths["verify_last_chunk_s"] == pytest.approx(4.0)
  assert paths["overlapped_s"] == pytest.approx(4.0)
  # decoding shorter than a chunk's verification: each earlier chunk overruns by 0.15 s
  paths = bench.host_paths(COST, 0.0, 8, 16, 96, 16, True, decode_chunk_s=0.1)
  assert paths["overlapped_s"] == pytest.approx(4.0 + 15 * 0.15)


SIDE_BY_SIDE = bench.VerifyCost(cpu_s=0.025, held_s=0.05, loop_cpu_s=3.0, loop_held_s=3.5)


def test_side_by_side_samples_are_bound_by_the_cores_or_one_sample():
  # "sample" isolation: 128 x 0.025 s of CPU over 96 cores = 0.033 s, one sample holds 0.05 s
  assert bench.verification_seconds(SIDE_BY_SIDE, 8, 16, 96, False, "sample") == \
      pytest.approx(0.05)
  # on 2 cores the CPU binds: 128 x 0.025 / 2 = 1.6 s
  assert bench.verification_seconds(SIDE_BY_SIDE, 8, 16, 2, False, "sample") == \
      pytest.approx(1.6)
  # a looping sample a prompt: the eight loops run at once, the path is one loop's 3.5 s
  # (CPU 8 x 3 + 120 x 0.025 = 27 s over 96 cores = 0.28 s)
  assert bench.verification_seconds(SIDE_BY_SIDE, 8, 16, 96, True, "sample") == \
      pytest.approx(3.5)
  # the same costs with "prompt" isolation: 16 samples of a prompt in a row
  assert bench.verification_seconds(SIDE_BY_SIDE, 8, 16, 96, False, "prompt") == \
      pytest.approx(0.8)


def test_staleness_one_exposes_what_outlasts_the_next_rollout():
  assert bench.stale_path(host_s=1.0, rollout_s=3.0) == 0.0
  assert bench.stale_path(host_s=4.0, rollout_s=3.0) == pytest.approx(1.0)
  device = {"seconds": 1.0, "forwards": 256.0, "n_params": 8_000_000_000, "n_devices": 4,
            "chip": "TPU v5p", "mesh": {"data": 1, "fsdp": 4, "tensor": 1, "expert": 1}}
  args = types.SimpleNamespace(group=16, prompts=8)
  row = bench.model_row(SIDE_BY_SIDE, {"seconds": 0.01, "block_size": 32}, device, 96, False,
                        args, "sample")
  rollout = row["by_chunks"][1]["device"]["rollout_s"]
  # verification 0.05 s + planning 0.01 s hide behind the rollout; a loop's 3.5 s does not
  assert row["stale"]["clean"]["host_s"] == 0.0
  assert row["stale"]["looping"]["host_s"] == pytest.approx(max(0.0, 3.5 + 0.01 - rollout))
