"""One process of the loopback multi-process ORL check (driven by tests/train/test_multiprocess.py).

  JAX_COORDINATOR_ADDRESS=127.0.0.1:PORT JAX_NUM_PROCESSES=N JAX_PROCESS_ID=I \
      python tests/scripts/multiprocess_orl.py --local_devices=D --workdir=DIR --out=FILE.json

Every process runs two ORL iterations of the tiny smoke shapes on one global 2 x 2 (data x
fsdp) mesh of CPU devices with gloo collectives over 127.0.0.1. With N > 1 `mesh.dcn` puts the
fsdp axis across the processes, so parameters are sharded over both processes and each
process holds non-adjacent batch rows; the runtime starts from the coordinator variables, as a
launch does. Each process then checks that an Orbax save -> restore of the trained state is
bit-exact, decodes a few evaluation problems split over the processes, and writes its per-step
losses, the number of responses its verifier scored in training, a digest of the parameters and
the evaluation's figures to FILE.json. Without
the variables it is the single-process reference on the same 4 devices (a plain mesh).
"""
import argparse
import hashlib
import json
import os
import sys

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def parse_args():
  p = argparse.ArgumentParser()
  p.add_argument("--local_devices", type=int, default=2)
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True)
  return p.parse_args()


def start_runtime(args) -> dict:
  """CPU devices with gloo collectives, then `jax.distributed.initialize` if asked."""
  jax.config.update("jax_num_cpu_devices", args.local_devices)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  from orl_jax import distributed
  return distributed.maybe_initialize()      # mode "auto": the JAX_* variables decide


def run_config(args):
  """Two smoke-sized ORL iterations on a data x fsdp mesh whose fsdp axis crosses the
  processes."""
  import ml_collections
  from tests.support.helpers import orl_smoke_config
  c = orl_smoke_config(args.workdir, steps=2)
  c.orl.prompts_per_step = jax.device_count()     # one prompt per batch shard
  c.mesh.data, c.mesh.fsdp = 2, jax.device_count() // 2
  c.mesh.dcn = ml_collections.ConfigDict(dict(data=1, fsdp=jax.process_count(), tensor=1))
  return c


class RecordingWriter:
  """Stands in for MetricsWriter on every process (the real one writes on process 0 only)."""
  rows = []

  def __init__(self, workdir, name="metrics", **kwargs):
    from orl_jax.metrics import MetricsWriter
    self.inner = MetricsWriter(workdir, name, **kwargs)

  def write(self, step, metrics):
    scalars = self.inner.write(step, metrics)
    RecordingWriter.rows.append({"step": step, **scalars})
    return scalars

  def close(self):
    self.inner.close()


class CountingVerifier:
  """Wraps the task's verifier and counts the responses this process scores."""
  scored = 0

  def __init__(self, inner):
    self.inner = inner        # `inner`: where `tasks.verifier_metrics` looks for counters

  def score_batch(self, problems, responses):
    CountingVerifier.scored += len(responses)
    return self.inner.score_batch(problems, responses)


def counting_setup(build_setup):
  """`build_setup` whose task's verifier counts what it scores."""
  import dataclasses

  def build(config, **kwargs):
    s = build_setup(config, **kwargs)
    return dataclasses.replace(s, task=dataclasses.replace(
        s.task, verifier=CountingVerifier(s.task.verifier)))
  return build


def leaves_equal(a, b) -> bool:
  import numpy as np
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True) for x, y in zip(la, lb))


def layout(mesh, state, n_prompts: int) -> dict:
  """Where things live: mesh axes, the process of each mesh position, this process's prompt
  rows, whether some parameter is split over processes."""
  from orl_jax import sharding
  return {"mesh": dict(mesh.shape),
          "mesh_processes": [d.process_index for d in mesh.devices.flat],
          "prompt_rows": list(sharding.process_rows(mesh, n_prompts)),
          "params_split_over_processes": any(
              not x.is_fully_addressable and not x.is_fully_replicated
              for x in jax.tree.leaves(state.params))}


def check_checkpoint_roundtrip(config) -> dict:
  """Restores the run's last checkpoint (every process), compares it with the exported final
  parameters, saves it again and restores that: both must be bit-exact."""
  from safetensors.numpy import load_file
  from orl_jax import sharding
  from orl_jax.models import params_io
  from orl_jax.storage.checkpoint import Checkpointer, abstract_like
  from orl_jax.data.pipeline import prompt_dataset
  from orl_jax.setup.build import build_setup
  from orl_jax.train.run import prepare_run, resume
  s = build_setup(config)
  run = prepare_run(s)
  n = config.orl.prompts_per_step
  prompts = iter(prompt_dataset(None, batch_size=n, rows=sharding.process_rows(s.mesh, n)))
  state, step = resume(run, prompts)
  run.ckpt.close()
  host = sharding.to_host(state)
  exported = load_file(os.path.join(config.workdir, "params", params_io.PARAMS_FILE))
  flat = params_io.flatten(host.params.to_pure_dict())
  matches_export = flat.keys() == exported.keys() and all(
      leaves_equal(flat[k], exported[k]) for k in flat)

  ckpt = Checkpointer(os.path.join(config.workdir, "roundtrip"), every=1)
  ckpt.save(step, state)
  ckpt.wait()
  again, _ = ckpt.restore(step, abstract_like(state))
  ckpt.close()
  same_shardings = all(x.sharding == y.sharding for x, y in
                       zip(jax.tree.leaves(state), jax.tree.leaves(again)))
  digest = hashlib.sha256(b"".join(v.tobytes() for _, v in sorted(flat.items()))).hexdigest()
  return {"restored_step": int(step), "restore_matches_export": bool(matches_export),
          "roundtrip_exact": bool(leaves_equal(host, sharding.to_host(again))),
          "roundtrip_same_shardings": bool(same_shardings), "params_sha256": digest,
          **layout(s.mesh, state, n)}


def evaluate_trained(config) -> dict:
  """Decodes and scores 8 evaluation problems with the model's initial parameters (bit-identical
  in every run; the trained ones differ in the last bits between runs), each batch of 4 split
  over the mesh's 4 batch shards (2 per process with two processes): this process's rows, the
  gathered tokens' digest and NFE, and the accuracy every process computes. Decoding reduces
  nothing across devices, so the tokens are the single process's exactly."""
  import numpy as np
  from orl_jax import evaluate as eval_lib
  from orl_jax import sharding
  from orl_jax.storage import trained_run
  from orl_jax.setup.build import build_setup, initial_params
  from orl_jax.unmasking import UnmaskRule
  s = build_setup(trained_run.model_config_for(config, trained_run.RANDOM_INIT))
  cfg = s.config
  graphdef, params = initial_params(s)
  problems = s.task.eval_problems()[:8]
  rule = UnmaskRule.parse("threshold_0.9")
  tokens, nfe, *_ = eval_lib.decode_problems(graphdef, params, problems, s.task, cfg, rule,
                                             batch_size=4, mesh=s.mesh)
  r = eval_lib.evaluate_setting(graphdef, params, problems, s.task, cfg, rule, batch_size=4,
                                mesh=s.mesh)
  return {"eval_rows": list(sharding.process_rows(s.mesh, 4)),
          "eval_tokens_sha256": hashlib.sha256(np.ascontiguousarray(tokens).tobytes()).hexdigest(),
          "eval_nfe": np.asarray(nfe).tolist(), "eval_accuracy": r["accuracy"],
          "eval_tpf_pooled": r["tpf_pooled"], "eval_processes": r["processes"],
          "eval_batch_shards": r["batch_shards"]}


def main():
  args = parse_args()
  info = start_runtime(args)
  from orl_jax.train import entry, run as run_lib
  config = run_config(args)
  run_lib.MetricsWriter = RecordingWriter
  entry.build_setup = counting_setup(entry.build_setup)
  entry.train(config, progress=False)
  result = dict(info, losses=[r["loss"] for r in RecordingWriter.rows],
                responses_scored=CountingVerifier.scored,
                rewards=[r["reward"] for r in RecordingWriter.rows],
                states_packed=[r["states_packed"] for r in RecordingWriter.rows],
                **check_checkpoint_roundtrip(config), **evaluate_trained(config))
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
