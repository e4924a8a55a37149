"""The sizing dry-run: per-device bytes on an abstract 8-device FSDP mesh, checked by hand."""
import os
import subprocess
import sys

from configs import llada
from orl_jax.apps import dry_run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _llada_8b_fsdp8():
  c = llada.get_config("8b-instruct")
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, 8, 1
  return c


def test_llada_8b_table_matches_hand_calculation():
  rows, info = dry_run.sizing_rows(_llada_8b_fsdp8())
  by = {r.name: r for r in rows}
  # LLaDA-8B's shapes, by hand: V=126464, D=4096, 32 layers, 32 heads x 128, MLP 12288, untied,
  # plus the residual adapter (RMSNorm + gated MLP D -> D -> D).
  v, d, n_layers, f = 126464, 4096, 32, 12288
  matrices = 2 * v * d + n_layers * (4 * d * d + 3 * d * f) + 3 * d * d
  vectors = n_layers * 2 * d + d + d                  # layer norms, ln_f, adapter norm
  assert info["n_params"] == matrices + vectors
  assert 8.0e9 < matrices + vectors < 8.1e9
  bf16 = 2
  assert by["params"].total_bytes == bf16 * (matrices + vectors)
  # every matrix is split 8 ways over fsdp; norm vectors stay replicated
  assert by["params"].per_device_bytes == bf16 * (matrices // 8 + vectors)
  # AdamW keeps mu and nu in the parameter dtype, sharded like the parameters (+ step counters)
  opt = by["optimizer state"]
  assert 0 <= opt.per_device_bytes - 2 * by["params"].per_device_bytes < 64
  # the KL anchor's frozen reference: one more copy of the params, sharded like them
  ref = by["KL reference (frozen)"]
  assert (ref.total_bytes, ref.per_device_bytes) == (by["params"].total_bytes,
                                                     by["params"].per_device_bytes)
  # capture: 64 responses x (8 blocks x 32 steps) states x b=32 x D=4096 in bf16 dominate
  cap = by["rollout capture buffers"]
  assert cap.total_bytes == info["capture_bytes_traced"]
  assert cap.total_bytes > 64 * 256 * 32 * d * bf16
  assert cap.per_device_bytes == cap.total_bytes // 8
  assert by["replay batch"].total_bytes > 16 * 4096 * d * bf16   # the replayed z dominates


def test_launcher_prints_the_table():
  out = subprocess.run(
      [sys.executable, "launch/train.py", "--config=configs/llada.py:8b-instruct",
       "--config.dry_run=True", "--config.mesh.fsdp=8", "--config.mesh.data=1"],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "fsdp=8" in out.stdout and "params" in out.stdout
  assert out.stdout.strip().splitlines()[-1].startswith("per_device_total_gib: ")


def test_no_reference_copy_without_the_anchor():
  c = _llada_8b_fsdp8()
  c.loss.w_kl = 0.0
  assert "KL reference (frozen)" not in {r.name for r in dry_run.sizing_rows(c)[0]}
  c.loss.w_kl, c.loss.kl_reference = 1.0, "rollout"
  assert "KL reference (frozen)" not in {r.name for r in dry_run.sizing_rows(c)[0]}
