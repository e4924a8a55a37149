"""`compile_run(config, target)`: every program of a run compiled for a target, with the fit
verdict and the predicted times (what `launch/compile.py` prints)."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from orl_jax.aot import programs as programs_lib
from orl_jax.aot import report as report_lib
from orl_jax.aot import targets as targets_lib
from orl_jax import sharding as sharding_lib


@dataclasses.dataclass
class CompileResult:
  target: targets_lib.Target
  mesh: dict                       # {axis: size}
  n_devices: int
  n_params: int
  budget: targets_lib.DeviceBudget
  usable_bytes: int                # per device
  reports: list[report_lib.ProgramReport]
  fits: bool
  verdict: str
  time: report_lib.IterationTime


def compile_run(config, target: targets_lib.Target, *, programs: list[str] | None = None,
                tpf: float = 1.0, memory_fraction: float | None = None,
                progress: Callable[[str], None] | None = None) -> CompileResult:
  """Compiles the programs of `config` (all, or those named in `programs`) for `target`."""
  devices = targets_lib.topology_devices(target)
  built = programs_lib.orl_programs(config, devices, target.platform, target.gpu)
  chosen = built.programs
  if programs:
    unknown = sorted(set(programs) - {p.name for p in chosen})
    if unknown:
      raise targets_lib.TargetError(f"--programs: no program {', '.join(unknown)} (this run "
                                    f"has {', '.join(p.name for p in chosen)})")
    chosen = [p for p in chosen if p.name in programs]
  reports = []
  with sharding_lib.tracing_mesh(built.mesh):
    for program in chosen:
      if progress:
        progress(f"compiling {program.name} for {target.label} ...")
      reports.append(report_lib.compile_program(program, target, len(devices)))
  budget = targets_lib.device_budget(target, devices)
  usable = report_lib.usable_bytes(target, budget, memory_fraction)
  fits, verdict = report_lib.verdict(reports, target, usable)
  time = report_lib.predict(reports, budget, gen_length=built.gen_length, tpf=tpf)
  mesh = dict(built.mesh.shape)
  return CompileResult(target, mesh, len(devices), built.n_params, budget, usable, reports,
                       fits, verdict, time)


def format_result(r: CompileResult) -> str:
  """The table, the verdict paragraph and the predicted times."""
  gib = targets_lib.GIB
  mesh = " x ".join(f"{k}={v}" for k, v in r.mesh.items())
  chip = r.target.chip
  lines = [f"target {r.target.label}: {r.n_devices} devices ({chip.name}; per device "
           f"{r.budget.hbm_bytes / gib:.1f} GiB, usable {r.usable_bytes / gib:.1f} GiB, "
           f"{r.budget.peak_flops / 1e12:.0f} TFLOP/s bf16, "
           f"{r.budget.hbm_bandwidth / 1e9:.0f} GB/s), mesh {mesh}, "
           f"{r.n_params / 1e9:.3f}B parameters",
           report_lib.format_table(r.reports, r.target, r.budget, r.usable_bytes), "",
           r.verdict]
  sources = {x.cost_source for x in r.reports if x.ok}
  if "estimate" in sources:
    lines.append("GPU FLOPs: the program's before optimisation; bytes moved: its arguments "
                 "and outputs (the least a device reads and writes) — XLA's GPU compiler "
                 "gives no cost of its own.")
  t = r.time
  if t.complete:
    lines.append(f"predicted (roofline lower bounds, TPF {t.tpf:g}): one ORL iteration "
                 f"{t.iteration_seconds:.3g} s ({t.rollout_forwards:.0f} forwards a rollout)")
  if t.decode_tokens_per_second:
    lines.append(f"predicted decode at batch 1 (TPF {t.tpf:g}): "
                 f"{t.decode_tokens_per_second:,.0f} tokens/s at most")
  return "\n".join(lines)


def result_json(r: CompileResult) -> dict:
  """The results as plain JSON (per-device bytes, FLOPs, roofline seconds per program)."""
  def program(x: report_lib.ProgramReport) -> dict:
    out = dataclasses.asdict(x)
    out.update(ok=x.ok, peak_bytes=x.peak_bytes,
               roofline_seconds=x.roofline_seconds(r.budget) if x.ok else None,
               fits=x.ok and x.peak_bytes <= r.usable_bytes)
    return out
  return {"target": r.target.label, "platform": r.target.platform, "chip": r.target.chip.name,
          "n_devices": r.n_devices, "mesh": r.mesh, "n_params": r.n_params,
          "device_hbm_bytes": r.budget.hbm_bytes, "usable_bytes": r.usable_bytes,
          "fits": r.fits, "verdict": r.verdict,
          "predicted": dataclasses.asdict(r.time) if math.isfinite(r.time.iteration_seconds)
          else None,
          "programs": [program(x) for x in r.reports]}
