"""Every staircase kernel compiled by the real TPU and GPU compilers on this host (no device).

Cases (`orl_jax/aot/kernels.py`): the block-sparse Pallas kernel and splash for TPU v5e, v5p
and v6e (libtpu: Mosaic), the block-sparse Pallas kernel for an H100 and an A100 (XLA's GPU
compiler: Triton); the attention shapes of the paper's models (LLaDA2.1-mini 16/4 heads,
SDAR-8B 32/8, LLaDA-8B 32/32 at head_dim 128; DiffusionGemma's sliding layers 16/8 at 256 with
a 1024 window and full layers 16/2 at 512); one packed row of 4k and of 16k tokens, bf16,
traced metadata; forward alone and forward + backward:

* ``default`` — at the tiles the project runs each kernel with;
* ``tiles``   — other tile choices (LLaDA2.1-mini at 4k, DiffusionGemma's shapes on the GPU),
  one of them too large, so that the refusal states each chip's limit.

Per case: accepted or the compiler's refusal, compile seconds, and per kernel the core's fast
memory the compiler planned (TPU: scoped VMEM of the custom call; GPU: shared memory of the
launch, read from XLA's thunk sequence) or, refused, what it asked for and the limit; the
program's HBM temporaries; the TPU compiler's FLOPs (attention counted by the kernels' cost
estimates). About 80 minutes on 2 busy cores; needs `make compilers`. The last line printed is
`default_tiles_accepted: N/M`.

  python benchmarks/kernel_compile.py [--quick] [--out benchmarks/results/kernel_compile.json]
"""
import argparse
import sys

import _common  # repo on sys.path
from orl_jax.aot import targets

targets.prepare_host()   # the compilers go in before JAX starts

import jax  # noqa: E402

from orl_jax.aot import kernels  # noqa: E402

TPU_CHIPS, GPU_CHIPS = ("v5e", "v5p", "v6e"), ("h100", "a100")
SEQ_LENS = (4096, 16384)
# other tile choices: (kernel, shape, tiles); the last of each kernel is meant to overflow
TILE_CHOICES = (
    [("pallas-tpu", "llada2.1-mini", t) for t in
     [(256, 256), (512, 512), (128, 512), (512, 128), (1024, 1024), (2048, 2048)]]
    + [("splash", "llada2.1-mini", t) for t in [(256, 256), (512, 512)]]
    + [("pallas-gpu", "llada2.1-mini", t) for t in [(32, 32), (128, 64), (64, 128), (128, 128)]]
    + [("pallas-gpu", "dgemma-sliding", t) for t in [(32, 32), (128, 128)]]
    + [("pallas-gpu", "dgemma-full", t) for t in [(64, 64), (32, 64)]])


def default_cases(quick: bool) -> list:
  chips = {"pallas-tpu": TPU_CHIPS, "splash": TPU_CHIPS, "pallas-gpu": GPU_CHIPS}
  cases = []
  for kernel, kernel_chips in chips.items():
    for chip in kernel_chips[:1] if quick else kernel_chips:
      for shape, dims in kernels.SHAPES.items():
        for seq_len in SEQ_LENS[:1] if quick else SEQ_LENS:
          for backward in (False, True):
            if kernel == "pallas-gpu" and chip != "h100" and not backward:
              continue   # the A100: forward + backward only
            tiles = kernels.default_tiles(kernel, dims.head_dim)
            cases.append(kernels.KernelCase(kernel, chip, shape, seq_len, tiles, backward))
  return cases


def tile_cases(quick: bool) -> list:
  cases = []
  for kernel, shape, tiles in TILE_CHOICES:
    chips = TPU_CHIPS if kernel != "pallas-gpu" else GPU_CHIPS[:1]
    for chip in chips[:1] if quick else chips:
      oversized = tiles[0] >= 2048   # refused: its forward alone says the limit
      cases.append(kernels.KernelCase(kernel, chip, shape, 4096, tiles, not oversized))
  return cases


def _mib(n: int) -> str:
  return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def describe(r: kernels.KernelCompile) -> str:
  memory = ", ".join(f"{name} {_mib(n)}" for name, n in sorted(r.fast_memory.items()))
  if not r.accepted:
    limit = f" (limit {_mib(r.limit_bytes)})" if r.limit_bytes else ""
    return (f"REFUSED {r.compile_seconds:5.1f} s: asked {memory or '?'}{limit}\n"
            f"      {r.error}")
  cost = f"; {r.flops / 1e9:,.0f} GFLOP" if r.flops else ""
  return (f"ok      {r.compile_seconds:5.1f} s: {memory or r.fast_memory_source}; HBM temp "
          f"{_mib(r.temp_bytes)}{cost}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/results/kernel_compile.json")
  parser.add_argument("--quick", action="store_true",
                      help="one chip per platform, 4k rows only (a smoke run)")
  args = parser.parse_args()
  results = {}
  for group, cases in (("default", default_cases(args.quick)), ("tiles", tile_cases(args.quick))):
    results[group] = []
    for case in cases:
      r = kernels.compile_case(case)
      print(f"{group:<7} {case.label:<52} {describe(r)}", flush=True)
      results[group].append(r.as_json())
  accepted = sum(r["accepted"] for r in results["default"])
  report = dict(jax=jax.__version__, libtpu=_libtpu_version(), chips=kernels.CHIP_TARGETS,
                shapes={k: vars(v) for k, v in kernels.SHAPES.items()}, **results)
  print(f"wrote {_common.write_json(args.out, report)}")
  print(f"default_tiles_accepted: {accepted}/{len(results['default'])}")


def _libtpu_version() -> str:
  import importlib.metadata as metadata
  found = metadata.distributions(name="libtpu", path=[targets.compilers_dir("tpu"), *sys.path])
  return next((d.version for d in found), "unknown")


if __name__ == "__main__":
  main()
