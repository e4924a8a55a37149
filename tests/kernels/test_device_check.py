"""benchmarks/device_check.py runs end to end on CPU (`--platform=cpu --small`): every section
in its JSON, the headline `name: value` last, kernel parity within tolerance, the compiler's
prediction beside the decode measurement."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # 2.3 CPU-minutes (measured); far longer in wall time on a loaded machine
def test_device_check_small_on_cpu(tmp_path):
  out_json = tmp_path / "device_check.json"
  out = subprocess.run(
      [sys.executable, "benchmarks/device_check.py", "--platform=cpu", "--small",
       "--hbm-gbps=20", f"--out={out_json}"], cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=1800)  # generous: CI machines may be shared
  assert out.returncode == 0, out.stderr[-3000:]
  name, value = out.stdout.strip().splitlines()[-1].split(": ")
  assert name == "kernel_parity_max_rel_err" and float(value) < 4e-2
  report = json.loads(out_json.read_text())
  assert {"parity", "kernel_time", "decode", "orl_step"} <= set(report)
  assert {k.split("/")[0] for k in report["parity"]} == {"pallas", "splash"}  # CPU: interpret
  assert len(report["parity"]) == 6  # both kernels at 3 shapes
  assert report["decode"]["batch_64"]["tokens_per_s"] > 0
  # the compiler's prediction beside the measurement (CPU: bytes over the given bandwidth)
  predicted = report["decode"]["batch_1"]["predicted"]
  assert predicted["bytes"] > 0 and predicted["roofline_s"] > 0
  assert predicted["predicted_over_measured"] > 0
  assert report["orl_step"]["packed_step_s"] > 0 and report["orl_step"]["naive_step_s"] > 0


def test_device_check_refuses_the_wrong_platform():
  out = subprocess.run([sys.executable, "benchmarks/device_check.py", "--platform=tpu"],
                       cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                       text=True, timeout=300)
  assert out.returncode != 0 and "--platform=tpu but JAX runs on cpu" in out.stderr
