"""Multi-process ORL on one machine: two JAX processes (2 CPU devices each, gloo collectives
over 127.0.0.1, FSDP across the processes) against one process with the same 4 devices. Each
process is a fresh `python tests/scripts/multiprocess_orl.py` (no fork after JAX is imported)."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

# compares token ids, forward counts or signs: rerun under other CPU numerics (make test-other-cpu)
pytestmark = pytest.mark.numerics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "scripts", "multiprocess_orl.py")
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _launch(tmp_path, name, *, local_devices, workdir, coordinator=None):
  """One worker; `coordinator` = (address, num_processes, process_id) as the JAX_* variables
  of a multi-node launch, None for a single process."""
  log = open(tmp_path / f"{name}.log", "w")
  cmd = [sys.executable, WORKER, f"--local_devices={local_devices}", f"--workdir={workdir}",
         f"--out={tmp_path / f'{name}.json'}"]
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COORDINATOR", "SLURM_"))}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  if coordinator is not None:
    address, n, i = coordinator
    env.update(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(n), JAX_PROCESS_ID=str(i))
  return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log


def _run_all(tmp_path, specs) -> dict:
  """Starts every worker at once, waits for all, and fails with their logs' tails."""
  procs = {name: _launch(tmp_path, name, **kw) for name, kw in specs.items()}
  failed = []
  for name, (proc, log) in procs.items():
    try:
      rc = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
      rc = "timeout"
    log.close()
    if rc != 0:
      failed.append(name)
  if failed:
    for proc, _ in procs.values():
      if proc.poll() is None:
        proc.kill()
    tails = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in failed}
    raise AssertionError("workers failed: " + "\n\n".join(f"--- {n}\n{t}" for n, t in
                                                          tails.items()))
  return {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in specs}


def test_two_processes_train_like_one_and_checkpoint_exactly(tmp_path):
  address = f"127.0.0.1:{_free_port()}"
  out = _run_all(tmp_path, {
      "p0": dict(local_devices=2, workdir=tmp_path / "multi", coordinator=(address, 2, 0)),
      "p1": dict(local_devices=2, workdir=tmp_path / "multi", coordinator=(address, 2, 1)),
      "single": dict(local_devices=4, workdir=tmp_path / "single"),
  })
  p0, p1, single = out["p0"], out["p1"], out["single"]
  assert (p0["process_count"], p0["global_devices"], p0["local_devices"]) == (2, 4, 2)
  assert p1["process_index"] == 1 and single["process_count"] == 1
  assert p0["mesh"] == single["mesh"] == {"data": 2, "fsdp": 2, "tensor": 1, "expert": 1}
  # mesh.dcn fsdp=2: the hybrid mesh puts the fsdp axis across the processes (a plain mesh
  # would not), so each process holds, and loads, non-adjacent prompt rows
  assert p0["mesh_processes"] == [0, 1, 0, 1] and single["mesh_processes"] == [0, 0, 0, 0]
  assert (p0["prompt_rows"], p1["prompt_rows"]) == ([0, 2], [1, 3])
  assert single["prompt_rows"] == [0, 1, 2, 3]
  assert p0["params_split_over_processes"] and not single["params_split_over_processes"]

  # verification by shares: each process scored half of every iteration's P*G = 4*3
  # responses (i, i + 2, ...), the single process all of them, and the gathered rewards are
  # the same everywhere (the rewards below)
  assert single["responses_scored"] == 2 * 12
  assert p0["responses_scored"] == p1["responses_scored"] == 12

  # both processes saw the same iterations and hold the same parameters
  assert len(p0["losses"]) == 2
  assert p0["losses"] == p1["losses"] and p0["states_packed"] == p1["states_packed"]
  assert p0["rewards"] == p1["rewards"]
  assert p0["params_sha256"] == p1["params_sha256"]
  # ... and they are the single-process run's (same prompts, rollouts, plans; the gradient
  # all-reduce over gloo may round differently in the last bit)
  np.testing.assert_allclose(p0["losses"], single["losses"], rtol=1e-6)
  assert p0["rewards"] == single["rewards"] and p0["states_packed"] == single["states_packed"]
  a = load_file(str(tmp_path / "multi" / "params" / "params.safetensors"))
  b = load_file(str(tmp_path / "single" / "params" / "params.safetensors"))
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6, err_msg=k)

  # Orbax across both processes: the last checkpoint is the exported final state, and a
  # save -> restore of it is bit-exact with the same shardings, in every process
  for r in (p0, p1, single):
    assert r["restored_step"] == 2
    assert r["restore_matches_export"] and r["roundtrip_exact"] and r["roundtrip_same_shardings"]
  data = tmp_path / "multi" / "checkpoints" / "2" / "data"
  assert sorted(os.listdir(data)) == ["commit_success.txt", "process_0-of-2.json",
                                      "process_1-of-2.json"]

  # only process 0 writes the metrics (one line per step, not one per process)
  with open(tmp_path / "multi" / "metrics.jsonl") as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2]

  # evaluation: each process decodes its rows of every batch (2 of 4 here) and the gathered
  # tokens, forward counts and scores are the single process's
  assert (p0["eval_rows"], p1["eval_rows"]) == ([0, 2], [1, 3])
  assert single["eval_rows"] == [0, 1, 2, 3] and p0["eval_processes"] == 2
  assert p0["eval_batch_shards"] == single["eval_batch_shards"] == 4
  for key in ("eval_tokens_sha256", "eval_nfe", "eval_accuracy", "eval_tpf_pooled"):
    assert p0[key] == p1[key] == single[key], key
