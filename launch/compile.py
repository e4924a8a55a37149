"""Compile a run's programs for a TPU topology or a GPU node, on this host (no device needed).

  python launch/compile.py --config=configs/llada.py:2.1-mini --target=v5p:2x2x1
  python launch/compile.py --config=configs/sdar.py:8b --target=h100x8
  python launch/compile.py --config=configs/tiny.py:orl --target=v5e:2x2 --json=compile.json

Every jitted program of one ORL iteration (the rollout with capture, its metrics, the replay
gather, the train step with the reference's forward and the optimizer update; a prefill and
one denoising forward, which price the rollout's loops) and the decode launcher's decoder are
compiled by the target's own compiler (libtpu; XLA's GPU compiler with the GPU's target
description) on the run's mesh and shardings, from abstract parameters. Prints, per program,
per-device bytes, whether it fits a device, FLOPs, bytes moved and a roofline bound on its
time, then the predicted time of an iteration and the decode tokens/s at batch 1; a compiler's
refusal is said in one paragraph. The last line is `fits: yes|no` (exit status 0 or 1). Needs
the compilers: `make compilers`.
"""
import _common  # repo on sys.path; run()  (first: the compilers go in before JAX starts)
from orl_jax.aot import targets

targets.prepare_host()

import json  # noqa: E402

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_TARGET = flags.DEFINE_string("target", None, "TPU topology (v5e:2x2, v5p:2x2x1, v5p-8, ...) "
                              "or GPU node (h100x8, h200x8, a100x8).")
_SLICES = flags.DEFINE_integer("slices", 1, "TPU slices (over the data-center network) or GPU "
                               "nodes; set mesh.dcn to say which mesh axes cross them.")
_PROGRAMS = flags.DEFINE_list("programs", [], "Compile only these programs (default: all).")
_TPF = flags.DEFINE_float("tpf", 1.0, "Tokens per forward assumed for the predicted times "
                          "(1 = one token per forward, the slowest a decode can be).")
_MEM_FRACTION = flags.DEFINE_float("mem_fraction", None, "GPU: the fraction of memory JAX "
                                   "may use (XLA_PYTHON_CLIENT_MEM_FRACTION; default 0.75).")
_JSON = flags.DEFINE_string("json", "", "Also write the results here as JSON.")


def main(argv):
  del argv
  logging.set_verbosity(logging.ERROR)
  from orl_jax.aot import compile_run
  if not _TARGET.value:
    raise targets.TargetError("--target is required (e.g. --target=v5e:2x2 or h100x8)")
  target = targets.parse_target(_TARGET.value, _SLICES.value)
  result = compile_run.compile_run(_CONFIG.value, target, programs=_PROGRAMS.value,
                                   tpf=_TPF.value, memory_fraction=_MEM_FRACTION.value,
                                   progress=lambda line: print(line, flush=True))
  print(compile_run.format_result(result))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(compile_run.result_json(result), f, indent=2)
    print(f"results: {_JSON.value}")
  print(f"fits: {'yes' if result.fits else 'no'}")
  return 0 if result.fits else 1   # exit status 1: something does not compile or fit


if __name__ == "__main__":
  _common.run(main)
