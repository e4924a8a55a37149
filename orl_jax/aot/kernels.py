"""The staircase attention kernels compiled by the TPU and GPU compilers, on any host.

A case is a kernel (`pallas-tpu`: the block-sparse Mosaic kernel, `splash`, `pallas-gpu`: the
block-sparse Triton kernel), a chip, the attention shape of one of the paper's models, a packed
row length and a tile choice. It is traced for the chip's platform from abstract operands (bf16,
one packed row, traced metadata: what a train step hands the kernel) as forward + backward in
one program (`jax.grad` through the kernel's custom VJP, so the forward kernel, dq and dk/dv
are all in it) and compiled for one compile-only device of the chip (`targets`). The compiler's
word is the result: accepted, or its refusal in one paragraph (`report.refusal`), and per kernel
the core's fast memory it planned:

* TPU: the scoped VMEM the compiled custom call was given (`used_scoped_memory_configs`, memory
  space 1, in the compiled module's backend config); a refusal states the size asked for and
  the limit;
* GPU: the shared memory of the kernel's launch, from XLA's thunk sequence, which XLA writes
  only into a dump directory (the compile's `xla_dump_to` option: a temporary one per case).
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os
import re
import tempfile
import time

import jax
import jax.numpy as jnp

from orl_jax.aot import targets
from orl_jax.aot.programs import PER_ITERATION, Program
from orl_jax.aot.report import fast_memory_overflow, refusal
from pallas_kernels.staircase_attention import TokenMeta, gpu, splash, target_platform, tpu


@dataclasses.dataclass(frozen=True)
class AttentionShape:
  """One attention layer's heads as a paper model has them."""
  model: str
  heads_q: int
  heads_kv: int
  head_dim: int
  window: int = 0   # the sliding window of the rule (DiffusionGemma's sliding layers)


SHAPES = {
    "llada2.1-mini": AttentionShape("LLaDA2.1-mini", 16, 4, 128),
    "sdar-8b": AttentionShape("SDAR-8B / Qwen3-8B", 32, 8, 128),
    "llada-8b": AttentionShape("LLaDA-8B", 32, 32, 128),
    "dgemma-sliding": AttentionShape("DiffusionGemma sliding layers", 16, 8, 256, 1024),
    "dgemma-full": AttentionShape("DiffusionGemma full layers", 16, 2, 512),
}
PLATFORM = {"pallas-tpu": "tpu", "splash": "tpu", "pallas-gpu": "cuda"}
# A target whose first device is one chip of the kind (the kernels run on one device).
CHIP_TARGETS = {"v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2", "h100": "h100x1",
                "a100": "a100x1"}
# The custom call a kernel compiles to, as named in the compiled module / thunk sequence.
_TPU_CALL = re.compile(r"%(?P<name>[\w.-]+) = [^\n]*custom_call_target=\"tpu_custom_call\"")
_INSTRUCTION = re.compile(r"\n\s*(?:ROOT )?%[\w.-]+ = ")
_SCOPED = re.compile(r'"used_scoped_memory_configs":\[(?P<configs>[^\]]*)\]')
_VMEM_SPACE = "1"   # XLA's TPU memory space of scoped VMEM
_GPU_LAUNCH = re.compile(r"kCustomKernel .*?\] (?P<name>\S+) grid: .*shared_memory: "
                         r"(?P<bytes>\d+) bytes")


def default_tiles(kernel: str, head_dim: int) -> tuple[int, int]:
  """(block_q, block_k) the project runs `kernel` with at `head_dim`."""
  if kernel == "splash":
    return splash.TILE, splash.TILE
  if kernel == "pallas-gpu":
    return gpu.default_tile(head_dim), gpu.default_tile(head_dim)
  defaults = tpu.staircase_attention.__kwdefaults__
  assert defaults is not None, "tpu.staircase_attention takes its tiles as keyword arguments"
  return defaults["block_q"], defaults["block_k"]


@dataclasses.dataclass(frozen=True)
class KernelCase:
  """One kernel compiled for one chip at one shape and tile choice."""
  kernel: str              # pallas-tpu | splash | pallas-gpu
  chip: str                # a key of CHIP_TARGETS
  shape: str               # a key of SHAPES
  seq_len: int             # tokens of the packed row
  tiles: tuple[int, int]   # (block_q, block_k); splash: (tile, tile)
  backward: bool = True    # forward + backward (else the forward kernel alone)

  @property
  def label(self) -> str:
    return (f"{self.kernel} {self.chip} {self.shape} {self.seq_len // 1024}k "
            f"{self.tiles[0]}x{self.tiles[1]} {'fwd+bwd' if self.backward else 'fwd'}")


@dataclasses.dataclass
class KernelCompile:
  """What the compiler said of one case."""
  case: KernelCase
  accepted: bool
  compile_seconds: float
  error: str = ""                  # the refusal, one paragraph
  fast_memory: dict = dataclasses.field(default_factory=dict)  # kernel -> bytes (VMEM / shared)
  fast_memory_source: str = ""     # where the figures were read, or why they were not
  limit_bytes: int = 0             # the limit a refusal states (0: none stated)
  temp_bytes: int = 0              # the program's HBM temporaries (memory_analysis)
  flops: float = 0.0               # the compiler's cost analysis (TPU; 0 on GPU: none given)
  bytes_accessed: float = 0.0

  def as_json(self) -> dict:
    out = dataclasses.asdict(self)
    out["case"] = dict(dataclasses.asdict(self.case), label=self.case.label)
    return out


@functools.lru_cache(maxsize=None)
def chip_device(chip: str):
  """One compile-only device of `chip` (the compilers must be set up: `targets.use_compiler`)."""
  return targets.topology_devices(targets.parse_target(CHIP_TARGETS[chip]))[0]


def kernel_function(case: KernelCase):
  """fn(q, k, v, *meta fields) of the case: the kernel's output, or the gradients of its sum
  with respect to q, k and v (the forward kernel, dq and dk/dv in one program)."""
  window = SHAPES[case.shape].window
  bq, bk = case.tiles
  if case.kernel == "splash":
    attend = functools.partial(splash.staircase_attention, tile=bq, window=window)
  else:
    fn = tpu.staircase_attention if case.kernel == "pallas-tpu" else gpu.staircase_attention
    attend = functools.partial(fn, block_q=bq, block_k=bk, window=window)

  def forward(q, k, v, *meta):
    meta = TokenMeta(*meta)
    return attend(q, k, v, meta, meta)

  def forward_backward(q, k, v, *meta):
    loss = lambda q, k, v: jnp.sum(forward(q, k, v, *meta).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  return forward_backward if case.backward else forward


def operands(case: KernelCase, device) -> list:
  """Abstract operands on `device`: q, k, v bf16 [1, T, H, Dh], five int32 [1, T] id fields."""
  shape, t = SHAPES[case.shape], case.seq_len
  placed = lambda dims, dtype: jax.ShapeDtypeStruct(
      dims, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
  q = placed((1, t, shape.heads_q, shape.head_dim), jnp.bfloat16)
  kv = placed((1, t, shape.heads_kv, shape.head_dim), jnp.bfloat16)
  return [q, kv, kv] + [placed((1, t), jnp.int32)] * len(TokenMeta._fields)


def kernel_name(instruction: str) -> str:
  """`transpose_jvp_staircase_dq__.1` -> `staircase_dq`: the pallas_call's own name."""
  name = re.sub(r"^(?:transpose_)?(?:jvp_)?", "", instruction)
  return re.sub(r"_*\.\d+$", "", name)


def tpu_scoped_vmem(compiled_text: str) -> dict[str, int]:
  """Kernel -> the scoped VMEM bytes the TPU compiler gave its custom call (an instruction's
  backend config can follow a metadata field that spans lines: read up to the next one)."""
  out: dict[str, int] = {}
  starts = [m.start() for m in _INSTRUCTION.finditer(compiled_text)] + [len(compiled_text)]
  for call in _TPU_CALL.finditer(compiled_text):
    end = next(s for s in starts if s > call.start())
    scoped = _SCOPED.search(compiled_text, call.end(), end)
    if scoped is None:
      continue
    configs = json.loads(f"[{scoped.group('configs')}]")
    name = kernel_name(call.group("name"))
    vmem = sum(int(c["size"]) for c in configs if c.get("memory_space") == _VMEM_SPACE)
    out[name] = max(out.get(name, 0), vmem)   # calls of one kernel (rows, heads) run in turn
  return out


def gpu_shared_memory(dump_dir: str) -> dict[str, int]:
  """Kernel -> shared-memory bytes of its launch, from the thunk sequence XLA's GPU compiler
  wrote into `dump_dir` (its `xla_dump_to` option)."""
  out = {}
  for path in glob.glob(os.path.join(dump_dir, "*.thunk_sequence.txt")):
    with open(path) as f:
      for launch in _GPU_LAUNCH.finditer(f.read()):
        if launch.group("name").startswith("staircase"):
          out[kernel_name(launch.group("name"))] = int(launch.group("bytes"))
  return out


def _compile(case: KernelCase, dump_dir: str):
  """The case's program compiled for one device of its chip (XLA's GPU compiler dumps into
  `dump_dir`, where its launches' shared memory is written)."""
  platform = PLATFORM[case.kernel]
  with target_platform(platform):
    lowered = jax.jit(kernel_function(case)).lower(*operands(case, chip_device(case.chip)))
  return lowered.compile({"xla_dump_to": dump_dir} if platform == "cuda" else None)


def _lowered_by_compile() -> jax.stages.Lowered:
  """A kernel case's `Program` only names the case in a refusal: `_compile` lowers it."""
  raise NotImplementedError("a kernel case is lowered by aot.kernels._compile, not its Program")


def compile_case(case: KernelCase) -> KernelCompile:
  """Compiles `case` for one device of its chip: accepted (with the kernels' fast memory, the
  program's HBM temporaries and, on TPU, the compiler's FLOPs and bytes) or the refusal."""
  program = Program(case.kernel, f"{SHAPES[case.shape].model}, {case.seq_len} tokens, tiles "
                    f"{case.tiles[0]}x{case.tiles[1]}", PER_ITERATION, _lowered_by_compile)
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="kernel_compile_") as dump_dir:
    try:
      compiled = _compile(case, dump_dir)
    except Exception as e:   # noqa: BLE001 - the compiler's refusal is the result
      over = fast_memory_overflow(str(e)) or {}
      target = targets.parse_target(CHIP_TARGETS[case.chip])
      return KernelCompile(
          case, False, time.perf_counter() - t0, error=refusal(program, target, e),
          fast_memory={kernel_name(over["kernel"]) or case.kernel: over["need"]} if over else {},
          fast_memory_source="the compiler's refusal: what the kernel asked for" if over else "",
          limit_bytes=over.get("limit", 0))
    result = KernelCompile(case, True, time.perf_counter() - t0,
                           temp_bytes=int(compiled.memory_analysis().temp_size_in_bytes))
    if PLATFORM[case.kernel] == "cuda":
      result.fast_memory = gpu_shared_memory(dump_dir)
      result.fast_memory_source = "XLA's GPU thunk sequence: shared memory of each launch"
      return result
  result.fast_memory = tpu_scoped_vmem(compiled.as_text())
  result.fast_memory_source = "the TPU compiler: scoped VMEM of each custom call"
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  result.flops = float(cost.get("flops", 0.0))
  result.bytes_accessed = float(cost.get("bytes accessed", 0.0))
  return result
