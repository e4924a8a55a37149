"""The compile command (`launch/compile.py`, `orl_jax.aot`): programs compiled by the real TPU
compiler (libtpu, from `make compilers`) on this CPU host, with its memory and cost analyses,
and the one-paragraph answer when a program does not fit.

The TPU runs are subprocesses (the compiler must be set up before JAX starts, and libtpu stays
out of every other test's process); each compiles only what its assertion needs.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from orl_jax.aot import report, targets
from orl_jax.aot.programs import Program

pytestmark = pytest.mark.accelerator_compile
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The tiny ORL iteration made cheaper to compile: two layers, fewer replay rows
TINY = ["--config=configs/tiny.py:orl", "--config.model.n_layers=2", "--config.replay.n_rows=4",
        "--config.orl.prompts_per_step=4"]


def _compile_env() -> dict:
  """The compile command's environment: this host's CPU flags (`make test-other-cpu`'s ISA
  cap) are not the target compiler's."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return env


def _compile(tmp_path, *flags, timeout=1200) -> tuple[subprocess.CompletedProcess, dict]:
  out_json = tmp_path / "compile.json"
  out = subprocess.run([sys.executable, "launch/compile.py", *flags, f"--json={out_json}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env=_compile_env())
  result = json.loads(out_json.read_text()) if out_json.exists() else {}
  return out, result


def test_the_tiny_orl_iteration_compiles_for_v5e_with_the_staircase_kernel(tmp_path):
  """The rollout's denoising forward and the replay train step of the tiny config, compiled by
  libtpu for a v5e 2x2 slice on the config's mesh (data=4): both fit, both hold Mosaic kernel
  calls (the staircase attention), and the compiler gives FLOPs and bytes for the roofline."""
  out, result = _compile(tmp_path, *TINY, "--target=v5e:2x2",
                         "--programs=rollout_step,train_step")
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == "fits: yes"
  assert result["platform"] == "tpu" and result["n_devices"] == 4
  assert result["mesh"]["data"] == 4
  progs = {p["name"]: p for p in result["programs"]}
  assert set(progs) == {"rollout_step", "train_step"}
  for p in progs.values():
    assert p["ok"] and p["fits"], p
    assert p["kernel_calls"] >= 1, p          # compiled Mosaic kernels, not a dense fallback
    assert p["cost_source"] == "compiler" and p["flops"] > 0 and p["bytes_accessed"] > 0
    assert 0 < p["peak_bytes"] <= result["usable_bytes"]
  # the train step takes the whole state and donates it: its outputs alias its arguments
  assert progs["train_step"]["alias_bytes"] > 0


def test_a_topology_too_small_gets_a_does_not_fit_paragraph(tmp_path):
  """The tiny model with 262144-wide SwiGLU layers at d_model 8192 (two layers of 25.8 GB of
  float32 weights, replicated on data=4) on a v5e 2x2 slice (16 GiB a chip): the compiler
  refuses the program, and the answer is one paragraph naming the program, HBM and how far
  over — no traceback, exit status 1."""
  out, result = _compile(tmp_path, *TINY, "--config.model.d_model=8192",
                         "--config.model.mlp_dim=262144",
                         "--target=v5e:2x2", "--programs=decode_prefill")
  assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-3000:]
  assert "Traceback" not in out.stdout + out.stderr
  assert out.stdout.strip().splitlines()[-1] == "fits: no"
  assert not result["fits"]
  verdict = result["verdict"]
  assert verdict.startswith("does not fit: decode_prefill")
  assert "HBM" in verdict and "more than the" in verdict
  # libtpu's own report names what holds the memory: buffers with their shapes
  assert re.search(r"Largest buffers: [\d.]+ GiB \w+\[[\d,]+\]", verdict), verdict


def test_unknown_targets_are_refused_in_one_line():
  for bad, words in [("v9z:2x2", "unknown target"), ("h100x16", "1 to 8 GPUs")]:
    with pytest.raises(targets.TargetError, match=words):
      targets.parse_target(bad)
  assert targets.parse_target("v5p-8").topology == "v5:2x2x1"
  assert targets.parse_target("v5e-1").topology == "v5e:1x1"     # Colab's TPU runtime
  assert targets.parse_target("h200x8").devices_per_slice == 8


def test_hbm_refusal_paragraph_names_the_program_and_the_overflow():
  program = Program("train_step", "replay forward+backward", "iteration", lambda: None)
  target = targets.parse_target("v5e:2x2")
  error = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
                       "required for HLO temporaries (74.58G) exceeds available HBM (15.75G).")
  text = report.refusal(program, target, error)
  assert text.startswith("train_step (replay forward+backward) does not compile for v5e:2x2")
  assert "74.58 GiB" in text and "58.83 GiB more than the 15.75 GiB" in text


def test_the_cpu_cost_estimate_counts_a_matmul():
  """Where a compiler gives no cost (XLA's GPU backend), FLOPs come from the lowered module:
  checked on this host against the hand count of a matmul (2 m n k), and the bytes moved are
  its arguments and outputs."""
  f = jax.jit(lambda a, b: a @ b)
  lowered = f.lower(jax.ShapeDtypeStruct((64, 32), jnp.float32),
                    jax.ShapeDtypeStruct((32, 16), jnp.float32))
  compiled = lowered.compile()
  flops, _, _, _ = report.program_cost(lowered, compiled, 1)
  if compiled.cost_analysis():      # XLA:CPU gives its own: the figures are the compiler's
    assert flops == pytest.approx(2 * 64 * 32 * 16, rel=0.01)
  assert report.host_cost(lowered, 2) == pytest.approx(64 * 32 * 16, rel=0.01)
  mem = compiled.memory_analysis()
  assert mem.argument_size_in_bytes == (64 * 32 + 32 * 16) * 4


def test_an_expert_axis_that_splits_a_torus_axis_gets_a_mesh():
  """DiffusionGemma's expert=8 on a v5p 4x4x4 slice (64 chips): 8 is no product of the torus'
  axes (4, 4, 4), which `jax.make_mesh` refuses; the mesh then spans part of a physical axis."""
  script = ("from orl_jax.aot import targets\n"
            "targets.prepare_host()\n"
            "from orl_jax import sharding\n"
            "devices = targets.topology_devices(targets.parse_target('v5p:4x4x4'))\n"
            "mesh = sharding.make_mesh(1, -1, 1, devices=devices, expert=8)\n"
            "print(dict(mesh.shape), len(set(mesh.devices.flat)))\n")
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=_compile_env())
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == (
      "{'data': 1, 'fsdp': 8, 'tensor': 1, 'expert': 8} 64")


REPORT = """E1203 16:17:20.096429   15984 deepsea_compiler_base.cc:3781] XLA:TPU compile permanent \
error. Ran out of memory in memory space hbm. Used 48.50G of 15.75G hbm. Exceeded hbm capacity \
by 32.75G. Memory usage report:

Memory Space: default (color=0)
Total bytes: 52076503552 (48.50GiB)
  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
   16.00GiB( 33%);   16.00GiB;  17179869184;                1; f32[65536,65536]
   32.00GiB( 67%);   16.00GiB;  34359738368;                2; 2×s32[65536,65536]
   48.00GiB(100%);   16.00GiB;            0;                2; bf16[65536,65536], f32[65536,65536]
   48.00GiB(100%);       512B;  51539623936;                1; (f32[], f32[65536,65536])

  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
  256.00MiB(100%);  300.00GiB;            0;                1; f32[65536,1024]
"""


def test_libtpus_memory_report_names_the_largest_hbm_buffers(tmp_path):
  """The HBM table of libtpu's report (as libtpu 0.0.42 writes it to its ERROR log): its rows,
  largest first; the tables of other memory spaces after it are not HBM and not read; the
  newest report of this process's log is the one read."""
  from orl_jax.aot import memory_report
  buffers = memory_report.largest_buffers(REPORT, n=3)
  assert [b.nbytes for b in buffers] == [16 * 2**30] * 3
  assert buffers[1] == memory_report.Buffer(16 * 2**30, 2, "2×s32[65536,65536]")
  assert memory_report.largest_buffers(REPORT, n=9)[-1].nbytes == 512
  assert memory_report.largest_buffers("no report here") == []
  log = tmp_path / "tpu_driver.host.root.log.ERROR.20261203-161720.4242"
  log.write_text("an older line\n" + REPORT.replace("16.00GiB;", "1.00GiB;") + REPORT)
  text = memory_report.latest_report(str(tmp_path), pid=4242)
  assert memory_report.largest_buffers(text)[0].nbytes == 16 * 2**30
  assert memory_report.latest_report(str(tmp_path), pid=4243) == ""
  said = memory_report.describe(buffers[:2])
  assert said == "16.00 GiB f32[65536,65536]; 16.00 GiB 2×s32[65536,65536] (2 values)"


def test_a_gpu_target_compiles_without_the_cuda_stubs_notices(tmp_path):
  """The CUDA plugin's stub logs its start-up notice four times (three as JAX imports it, one
  as the backends start, each after absl's note) although a compile-only host is expected to
  have no GPU: the compile command prints none of it; the table's memory columns carry their
  unit."""
  out, result = _compile(tmp_path, "--config=configs/tiny.py:orl", "--target=h100x8",
                         "--programs=replay_gather")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "cudart_stub" not in out.stderr and "absl::InitializeLog" not in out.stderr
  assert "peak GiB" in out.stdout and result["platform"] == "cuda"
