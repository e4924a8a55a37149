"""Compiling programs for a target and reading what the compiler says of them.

Per program: compile time, per-device argument / output / temporary / aliased bytes
(`Compiled.memory_analysis`), the buffers of the iteration it does not take but that are alive
while it runs (`Program.resident_bytes`), whether the sum fits the device, FLOPs and bytes
accessed, and a roofline lower bound on its time (FLOPs over the chip's peak, bytes over its
bandwidth). FLOPs and bytes are the TPU compiler's own figures (`Compiled.cost_analysis`, per
device, after optimisation). XLA's GPU compiler gives none: there FLOPs are the program's
before optimisation (XLA's cost analysis of the lowered module, divided by the devices) and
bytes the least a device must move (its arguments read and outputs written, donated buffers
not counted) — both stated as such in the report. A compiler's refusal (a buffer that does not
fit HBM or VMEM, a kernel tile Mosaic or Triton rejects) is the answer: one paragraph naming
the program, what overflowed and by how much.
"""
from __future__ import annotations

import dataclasses
import re
import time

import jax

from orl_jax.aot import memory_report
from orl_jax.aot.programs import DECODE, PER_FORWARD, PER_ITERATION, PER_ROLLOUT, Program
from orl_jax.aot.targets import GIB, DeviceBudget, Target
from pallas_kernels.platform import target_platform

# JAX keeps this fraction of a GPU's memory for its buffers unless told otherwise
GPU_MEMORY_FRACTION_DEFAULT = 0.75


@dataclasses.dataclass
class ProgramReport:
  """What compiling one program for one target gave."""
  name: str
  role: str
  runs: str
  compile_seconds: float
  error: str = ""              # the compiler's refusal, as one paragraph ("" = compiled)
  argument_bytes: int = 0      # per device
  output_bytes: int = 0
  temp_bytes: int = 0
  alias_bytes: int = 0         # outputs written into donated arguments
  resident_bytes: int = 0      # live buffers of the iteration it does not take
  flops: float = 0.0           # per device
  bytes_accessed: float = 0.0  # per device
  cost_source: str = ""        # "compiler" (optimised) | "estimate" (see the module doc)
  compiler_seconds: float = 0.0   # the TPU compiler's own time estimate, 0 when it gives none
  kernel_calls: int = 0        # Pallas kernels (Mosaic / Triton custom calls) in the program

  @property
  def ok(self) -> bool:
    return not self.error

  @property
  def peak_bytes(self) -> int:
    """Per-device bytes alive while it runs: its buffers (donated ones once) + the rest."""
    return (self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes
            + self.resident_bytes)

  def roofline_seconds(self, budget: DeviceBudget) -> float:
    """Lower bound on its time on one device: compute- or bandwidth-bound, whichever binds."""
    return max(self.flops / budget.peak_flops, self.bytes_accessed / budget.hbm_bandwidth)


def usable_bytes(target: Target, budget: DeviceBudget, memory_fraction: float | None) -> int:
  """What a program may use on one device: TPU HBM as the chip has it (its compiler checks
  too), GPU memory times the fraction JAX preallocates (XLA_PYTHON_CLIENT_MEM_FRACTION)."""
  if target.platform != "cuda":
    return budget.hbm_bytes
  fraction = GPU_MEMORY_FRACTION_DEFAULT if memory_fraction is None else memory_fraction
  return int(budget.hbm_bytes * fraction)


def _gb(n: float) -> str:
  return f"{n / GIB:.2f} GiB"


def host_cost(lowered, n_devices: int) -> float:
  """FLOPs per device of a lowered program before optimisation (XLA's HLO cost analysis on
  this host, divided evenly over the devices); kernels' custom calls count nothing."""
  from jax._src.lib import _jax
  module = lowered.compiler_ir("hlo").as_hlo_module()
  cost = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
  return float(cost.get("flops", 0.0)) / n_devices


# The custom-call targets Pallas kernels compile to (Mosaic TPU; Triton and Mosaic GPU)
KERNEL_TARGETS = {"tpu": ("tpu_custom_call",),
                  "cuda": ("__gpu$xla.gpu.triton", "mosaic_gpu")}


def kernel_calls(compiled_text: str, platform: str) -> int:
  """Pallas kernel calls in a compiled module's text."""
  return sum(compiled_text.count(f'custom_call_target="{name}') for name in
             KERNEL_TARGETS.get(platform, ()))


_HBM = re.compile(r"required for (?P<what>[^(]+)\((?P<need>[\d.]+)(?P<u>[GMK])\) exceeds "
                  r"available HBM \((?P<have>[\d.]+)(?P<v>[GMK])\)")
_VMEM = re.compile(r"(?:would exceed|exceeds?) (?:the )?(?:memory|vmem)", re.IGNORECASE)
# libtpu 0.0.42: "Ran out of memory in memory space vmem while allocating on stack for
# %staircase_fwd.1 = ... Scoped allocation with size 36.25M and limit 16.00M exceeded scoped
# vmem limit by 20.25M."
_SCOPED_VMEM = re.compile(r"memory space vmem while allocating on stack for %(?P<call>[\w.-]+)"
                          r"(?s:.*)Scoped allocation with size (?P<need>[\d.]+)(?P<u>[KMG]) and "
                          r"limit (?P<limit>[\d.]+)(?P<v>[KMG]) exceeded scoped vmem limit")
# XLA's GPU compiler on a Triton kernel (jaxlib 0.10.2)
_SHARED = re.compile(r"Shared memory size limit exceeded: requested (?P<need>\d+), available: "
                     r"(?P<limit>\d+)")
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30}


def fast_memory_overflow(text: str) -> dict | None:
  """A kernel's tiles overflowing its core's fast memory, as a compiler error states it:
  {memory: "VMEM" | "shared memory", kernel (or ""), need, limit (bytes)}; None otherwise."""
  m = _SCOPED_VMEM.search(text)
  if m:
    return dict(memory="VMEM", kernel=m.group("call"),
                need=int(float(m.group("need")) * _UNIT[m.group("u")]),
                limit=int(float(m.group("limit")) * _UNIT[m.group("v")]))
  m = _SHARED.search(text)
  if m:
    return dict(memory="shared memory", kernel="", need=int(m.group("need")),
                limit=int(m.group("limit")))
  return None


def _kib(n: int) -> str:
  return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def refusal(program: Program, target: Target, error: BaseException) -> str:
  """One paragraph: which program the compiler refused for `target`, what did not fit and by
  how much, and what to try."""
  text = str(error).strip()
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  head = lines[0] if lines else type(error).__name__
  where = f"{program.name} ({program.role}) does not compile for {target.label}"
  m = _HBM.search(text)
  if m:
    need = float(m.group("need")) * _UNIT[m.group("u")]
    have = float(m.group("have")) * _UNIT[m.group("v")]
    return (f"{where}: its {m.group('what').strip()} need {_gb(need)} per device, "
            f"{_gb(need - have)} more than the {_gb(have)} of HBM a device has. Shard it "
            "over more devices (mesh.fsdp / mesh.tensor), a larger topology, or fewer rows "
            "per step (orl.prompts_per_step, replay.n_rows, replay.row_len)."
            + _largest_buffers_said(target))
  over = fast_memory_overflow(text)
  if over:
    name = re.sub(r"\.\d+$", "", over["kernel"])   # the custom call's instruction name
    kernel = f"its kernel {name}" if name else "a kernel"
    core = "TensorCore's VMEM" if over["memory"] == "VMEM" else "GPU's shared memory per block"
    return (f"{where}: {kernel} needs {_kib(over['need'])} of the {core}, "
            f"{_kib(over['need'] - over['limit'])} more than its limit of "
            f"{_kib(over['limit'])}. Smaller kernel tiles are needed for this shape.")
  if "space=vmem" in text or _VMEM.search(text) and "vmem" in text.lower():
    return (f"{where}: a kernel's blocks do not fit the TensorCore's VMEM ({head}). Smaller "
            "kernel tiles are needed for this shape.")
  detail = " ".join(lines[:3])
  if len(detail) > 600:
    detail = detail[:600] + " ..."
  return f"{where}: {detail}"


def _largest_buffers_said(target: Target) -> str:
  """" Largest buffers: ..." from libtpu's memory usage report of the refusal ("" off TPU or
  without a report)."""
  if target.platform != "tpu":
    return ""
  buffers = memory_report.largest_buffers(memory_report.latest_report())
  return f" Largest buffers: {memory_report.describe(buffers)}." if buffers else ""


def compile_program(program: Program, target: Target, n_devices: int) -> ProgramReport:
  """Lowers `program` for `target`'s platform and compiles it with the target's compiler."""
  t0 = time.perf_counter()
  report = ProgramReport(program.name, program.role, program.runs, 0.0,
                         resident_bytes=program.resident_bytes)
  try:
    with target_platform(target.platform, target.gpu):
      lowered = program.lower()
    compiled = lowered.compile()
  except Exception as e:   # noqa: BLE001 - the compiler's refusal is the answer
    report.compile_seconds = time.perf_counter() - t0
    report.error = refusal(program, target, e)
    return report
  report.compile_seconds = time.perf_counter() - t0
  report.kernel_calls = kernel_calls(compiled.as_text() or "", target.platform)
  mem = compiled.memory_analysis()
  if mem is None:
    raise RuntimeError(f"the compiler for {target.label} gave no memory analysis of "
                       f"{program.name}")
  report.argument_bytes = int(mem.argument_size_in_bytes)
  report.output_bytes = int(mem.output_size_in_bytes)
  report.temp_bytes = int(mem.temp_size_in_bytes)
  report.alias_bytes = int(mem.alias_size_in_bytes)
  (report.flops, report.bytes_accessed, report.compiler_seconds,
   report.cost_source) = program_cost(lowered, compiled, n_devices)
  return report


def program_cost(lowered, compiled, n_devices: int) -> tuple[float, float, float, str]:
  """(FLOPs, bytes accessed, the compiler's own time estimate or 0, source) per device of a
  compiled program: the compiler's figures where it gives them (TPU), else the estimates of
  the module docstring (source "estimate")."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
  if cost:
    return (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
            max(float(cost.get("optimal_seconds", 0.0)), 0.0), "compiler")
  mem = compiled.memory_analysis()
  moved = (mem.argument_size_in_bytes + mem.output_size_in_bytes
           - 2 * mem.alias_size_in_bytes)
  return host_cost(lowered, n_devices), float(moved), 0.0, "estimate"


@dataclasses.dataclass
class IterationTime:
  """The predicted time of one ORL iteration and of one decoded token (roofline bounds)."""
  tpf: float                  # tokens per forward assumed
  iteration_seconds: float    # rollout forwards + the once-per-iteration programs
  rollout_forwards: float     # forwards of one rollout (every row in lock-step)
  decode_tokens_per_second: float   # the decode launcher at batch 1
  complete: bool              # every program it sums compiled


def predict(reports: list[ProgramReport], budget: DeviceBudget, *, gen_length: int,
            tpf: float) -> IterationTime:
  """Lower bounds from the rooflines: a rollout takes gen_length / tpf forwards (the paper's
  count, the commit forwards included, each priced as a denoising step) plus its prefill; the
  iteration adds its once-per-iteration programs except the rollout itself (whose compiled
  cost counts each loop body once). Decoding at batch 1 makes `tpf` tokens per forward."""
  by_name = {r.name: r for r in reports}
  t = lambda name: by_name[name].roofline_seconds(budget) if name in by_name else 0.0
  forwards = gen_length / tpf
  others = sum(r.roofline_seconds(budget) for r in reports
               if r.runs == PER_ITERATION and r.name != "rollout")
  rollout = t("rollout_prefill") + forwards * t("rollout_step")
  step = t("decode_step")
  needed = [r for r in reports if r.runs in (PER_ITERATION, PER_FORWARD, PER_ROLLOUT)]
  return IterationTime(tpf, rollout + others, forwards,
                       tpf / step if step else 0.0,
                       all(r.ok for r in needed) and "rollout_step" in by_name)


def format_table(reports: list[ProgramReport], target: Target, budget: DeviceBudget,
                 usable: int) -> str:
  """The per-program table, one line each: GiB per device (`+live`: the iteration's other
  buffers alive meanwhile), GFLOP and GB per device, the roofline bound, and the TPU
  compiler's own time estimate. The rollout's cost counts each loop body once (its time is
  predicted from the prefill and step programs)."""
  head = (f"{'program':<20} {'compile s':>9} {'args GiB':>8} {'out GiB':>8} {'temp GiB':>8} "
          f"{'alias GiB':>9} {'+live GiB':>9} {'peak GiB':>8}  {'fits':<4} {'GFLOP':>9} "
          f"{'GB moved':>9} {'roofline':>10} {'compiler':>10}")
  lines = [head, "-" * len(head)]
  g = lambda b: f"{b / GIB:8.2f}"
  w = lambda b: f"{b / GIB:9.2f}"
  for r in reports:
    if not r.ok:
      lines.append(f"{r.name:<20} {r.compile_seconds:9.1f}   does not compile (below)")
      continue
    fits = "yes" if r.peak_bytes <= usable else "NO"
    lines.append(f"{r.name:<20} {r.compile_seconds:9.1f} {g(r.argument_bytes)} "
                 f"{g(r.output_bytes)} {g(r.temp_bytes)} {w(r.alias_bytes)} "
                 f"{w(r.resident_bytes)} {g(r.peak_bytes)}  {fits:<4} {r.flops / 1e9:9.1f} "
                 f"{r.bytes_accessed / 1e9:9.2f} {_seconds(r.roofline_seconds(budget)):>10} "
                 f"{_seconds(r.compiler_seconds) if r.compiler_seconds else '-':>10}")
  return "\n".join(lines)


def _seconds(s: float) -> str:
  if s >= 1:
    return f"{s:.2f} s"
  if s >= 1e-3:
    return f"{s * 1e3:.2f} ms"
  return f"{s * 1e6:.1f} us"


def verdict(reports: list[ProgramReport], target: Target, usable: int) -> tuple[bool, str]:
  """(fits, one paragraph): every program compiled and fits a device, or what does not."""
  refused = [r for r in reports if not r.ok]
  over = [r for r in reports if r.ok and r.peak_bytes > usable]
  if not refused and not over:
    worst = max(reports, key=lambda r: r.peak_bytes)
    return True, (f"fits {target.label}: every program compiled; the largest, {worst.name}, "
                  f"needs {_gb(worst.peak_bytes)} of the {_gb(usable)} a device has.")
  parts = [r.error for r in refused]
  for r in over:
    parts.append(f"{r.name} ({r.role}) compiled for {target.label} but needs "
                 f"{_gb(r.peak_bytes)} per device ({_gb(r.argument_bytes)} arguments, "
                 f"{_gb(r.output_bytes)} outputs, {_gb(r.temp_bytes)} temporaries, "
                 f"{_gb(r.resident_bytes)} of the iteration's other live buffers), "
                 f"{_gb(r.peak_bytes - usable)} more than the {_gb(usable)} a device has.")
  return False, "does not fit: " + " ".join(parts)


RUNS_TEXT = {PER_ITERATION: "once per iteration", PER_FORWARD: "once per rollout forward",
             PER_ROLLOUT: "once per rollout", DECODE: "decode launcher"}
