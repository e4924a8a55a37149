"""The staircase kernels compiled by a real accelerator compiler at one real shape (run by
tests/kernels/test_kernel_compile.py in a subprocess: the compilers are set up before JAX starts,
and libtpu stays off the import path of every other test). Prints one JSON line: per case, what
`orl_jax.aot.kernels.compile_case` returned.

  python tests/scripts/compiled_kernels.py tpu    # v5e: pallas Mosaic and splash, fwd+bwd;
                                                  # oversized
  python tests/scripts/compiled_kernels.py cuda   # H100: the Triton kernel's forward
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from orl_jax.aot import targets  # noqa: E402

targets.use_compiler(sys.argv[1])

from orl_jax.aot import kernels  # noqa: E402

# LLaDA2.1-mini's attention (16 query / 4 key-value heads, head_dim 128), one 4k packed row
SHAPE, SEQ_LEN = "llada2.1-mini", 4096
CASES = {
    "tpu": {
        "pallas": kernels.KernelCase("pallas-tpu", "v5e", SHAPE, SEQ_LEN, (128, 128)),
        "splash": kernels.KernelCase("splash", "v5e", SHAPE, SEQ_LEN, (128, 128)),
        # a whole row of queries per tile: its per-query buffers (metadata, softmax sums,
        # accumulator) overflow the scoped VMEM; the forward alone is refused
        "oversized": kernels.KernelCase("pallas-tpu", "v5e", SHAPE, SEQ_LEN, (4096, 128),
                                        backward=False),
    },
    "cuda": {
        "pallas": kernels.KernelCase("pallas-gpu", "h100", SHAPE, SEQ_LEN, (64, 64),
                                     backward=False),
    },
}

if __name__ == "__main__":
  results = {name: kernels.compile_case(case).as_json()
             for name, case in CASES[sys.argv[1]].items()}
  print(json.dumps(results))
