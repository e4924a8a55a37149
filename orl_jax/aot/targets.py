"""Compile targets: the accelerators a run is meant for, as compile-only devices on any host.

A target names a TPU topology (`v5e:2x2`, `v5p:2x2x1`, `v6e:4x4`, `v4:2x2x1`, `tpu7x:2x2x1`,
or a Cloud name such as `v5p-8`, `v5e-16`) or a GPU node (`h100x8`, `h200x8`, `a100x8`), with a
number of slices (TPU slices over the data-center network, or GPU nodes). `topology_devices`
asks the platform's compiler for that many devices without owning any: libtpu for TPUs
(`jax.experimental.topologies.get_topology_desc`), XLA's GPU compiler with a target
description (`gpu_specs/*.txtpb`, one per GPU model) for NVIDIA GPUs. `jax.devices()` stays
this host's; programs built on a mesh of these devices are compiled, never run.

The compilers are the accelerator builds of jaxlib's plugins: `pip install "jax[tpu]"` (libtpu)
or `"jax[cuda12]"`, or `make compilers`, which installs only what compiling needs into
`<venv>/compilers/{tpu,cuda}` where no other program of the venv loads them (a libtpu on the
import path would make every JAX process probe for a TPU at start-up).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
import sys
from typing import TYPE_CHECKING

from orl_jax.aot import memory_report

if TYPE_CHECKING:    # jax is imported only once the compilers are set up (`prepare_host`)
  from pallas_kernels.platform import GpuTarget

GIB = 2 ** 30
SPECS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip as its maker states it (dense bf16 matmul peak, HBM)."""
  name: str
  hbm_bytes: int           # per chip
  peak_flops: float        # bf16 FLOP/s per chip, dense
  hbm_bandwidth: float     # bytes/s per chip
  source: str              # where the figures come from


# TPU figures: Cloud TPU system-architecture pages; GPU figures: NVIDIA data sheets (SXM).
CHIPS = {
    "v4": Chip("TPU v4", 32 * GIB, 275e12, 1.2e12, "cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", 16 * GIB, 197e12, 819e9, "cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", 95 * GIB, 459e12, 2.765e12, "cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", 32 * GIB, 918e12, 1.64e12, "cloud.google.com/tpu/docs/v6e"),
    "tpu7x": Chip("TPU7x", 192 * GIB, 2307e12, 7.37e12, "cloud.google.com/tpu/docs/tpu7x"),
    # GPU memory: what the device reports (gpu_specs/<name>.txtpb device_memory_size)
    "a100": Chip("A100 80GB SXM", 85899345920, 312e12, 2.039e12, "NVIDIA A100 data sheet"),
    "h100": Chip("H100 80GB SXM", 84978434048, 989e12, 3.35e12, "NVIDIA H100 data sheet"),
    "h200": Chip("H200 141GB SXM", 150754820096, 989e12, 4.8e12, "NVIDIA H200 data sheet"),
}
# libtpu's device_kind -> chip
TPU_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5": "v5p", "TPU v6 lite": "v6e",
             "TPU7x": "tpu7x"}
# Our TPU names -> libtpu's topology prefix (v5p is "v5" to libtpu)
TPU_PREFIX = {"v4": "v4", "v5e": "v5e", "v5p": "v5", "v6e": "v6e", "tpu7x": "tpu7x"}
# Cloud names `v5e-16`: chips for v5e / v6e, TensorCores (2 a chip) for v4 / v5p
CLOUD_TOPOLOGIES = {
    "v5e-1": "v5e:1x1", "v5e-4": "v5e:2x2", "v5e-8": "v5e:2x4", "v5e-16": "v5e:4x4",
    "v5e-32": "v5e:4x8", "v5e-64": "v5e:8x8", "v5e-128": "v5e:8x16", "v5e-256": "v5e:16x16",
    "v6e-1": "v6e:1x1", "v6e-4": "v6e:2x2", "v6e-8": "v6e:2x4", "v6e-16": "v6e:4x4",
    "v6e-32": "v6e:4x8", "v6e-64": "v6e:8x8", "v6e-128": "v6e:8x16", "v6e-256": "v6e:16x16",
    "v4-8": "v4:2x2x1", "v4-16": "v4:2x2x2", "v4-32": "v4:2x2x4", "v4-64": "v4:2x4x4",
    "v4-128": "v4:4x4x4",
    "v5p-8": "v5p:2x2x1", "v5p-16": "v5p:2x2x2", "v5p-32": "v5p:2x2x4", "v5p-64": "v5p:2x4x4",
    "v5p-128": "v5p:4x4x4", "v5p-256": "v5p:4x4x8",
}
GPU_NODE = re.compile(r"^(?P<chip>[a-z]\d+)(?:x(?P<n>\d+))?$")
TPU_TOPOLOGY = re.compile(r"^(?P<chip>v4|v5e|v5p|v6e|tpu7x):(?P<dims>\d+(?:x\d+){1,2})$")


class TargetError(ValueError):
  """A target the compile command cannot build devices for (said in one sentence)."""


@dataclasses.dataclass(frozen=True)
class Target:
  """Where a program is meant to run."""
  name: str               # as the user wrote it
  platform: str           # "tpu" | "cuda"
  chip: Chip
  topology: str           # libtpu's topology name, or "gpu"
  n_slices: int = 1       # TPU slices, or GPU nodes
  devices_per_slice: int = 0
  spec_file: str = ""     # GPU: the target description

  @functools.cached_property
  def gpu(self) -> GpuTarget | None:
    """The GPU a `cuda` target describes (generation and SM count, read once from its spec
    file)."""
    from pallas_kernels.platform import GpuTarget
    if self.platform != "cuda":
      return None
    with open(self.spec_file) as f:
      spec = f.read()
    cc = re.search(r"cuda_compute_capability\s*{\s*major:\s*(\d+)\s*minor:\s*(\d+)", spec)
    sms = re.search(r"core_count:\s*(\d+)", spec)
    if not cc or not sms:
      raise TargetError(f"{self.spec_file}: no cuda_compute_capability / core_count")
    return GpuTarget((int(cc.group(1)), int(cc.group(2))), int(sms.group(1)))

  @property
  def label(self) -> str:
    return self.name if self.n_slices == 1 else f"{self.n_slices} x {self.name}"


def _tpu_chips(dims: str) -> int:
  return math.prod(int(d) for d in dims.split("x"))


def parse_target(text: str, slices: int = 1) -> Target:
  """`Target` of a TPU topology (`v5e:2x2`, `v5p-8`) or a GPU node (`h100x8`) with `slices`."""
  name = text.strip().lower()
  if slices < 1:
    raise TargetError(f"--slices={slices}: a target has at least one slice")
  name = CLOUD_TOPOLOGIES.get(name, name)
  tpu = TPU_TOPOLOGY.match(name)
  if tpu:
    chip = tpu.group("chip")
    topology = f"{TPU_PREFIX[chip]}:{tpu.group('dims')}"
    return Target(text, "tpu", CHIPS[chip], topology, slices, 0)
  gpu = GPU_NODE.match(name)
  if gpu and gpu.group("chip") in CHIPS and os.path.exists(_spec_path(gpu.group("chip"))):
    n = int(gpu.group("n") or 1)
    if not 1 <= n <= 8:
      raise TargetError(f"target {text!r}: a GPU node holds 1 to 8 GPUs; use --slices for "
                        "several nodes")
    return Target(text, "cuda", CHIPS[gpu.group("chip")], "gpu", slices, n,
                  _spec_path(gpu.group("chip")))
  raise TargetError(f"unknown target {text!r}: use a TPU topology ({', '.join(TPU_PREFIX)} "
                    f"as in v5e:2x2, v5p:2x2x1, or a Cloud name such as v5p-8) or a GPU node "
                    f"({', '.join(gpu_models())} as in h100x8)")


def gpu_models() -> list[str]:
  """The GPU models a target description ships for."""
  return sorted(f[:-len(".txtpb")] for f in os.listdir(SPECS_DIR) if f.endswith(".txtpb"))


def _spec_path(chip: str) -> str:
  return os.path.join(SPECS_DIR, f"{chip}.txtpb")


# ------------------------------------------------------------------------------ compilers

def compilers_dir(platform: str) -> str:
  """Where `make compilers` puts a platform's compiler (beside the running interpreter)."""
  return os.path.join(sys.prefix, "compilers", platform)


def _libtpu_path() -> str | None:
  if _installed("libtpu"):
    return None    # jax finds the installed package itself
  path = os.path.join(compilers_dir("tpu"), "libtpu", "libtpu.so")
  if os.path.isfile(path):
    return path
  raise TargetError("compiling for a TPU needs libtpu, which is not installed: run `make "
                    "compilers` (or pip install \"jax[tpu]\" matching your jax)")


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:   # its parent package is not there
    return False


def _cuda_plugin_dir() -> str | None:
  if _installed("jax_plugins.xla_cuda12"):
    return None
  path = compilers_dir("cuda")
  if os.path.isdir(os.path.join(path, "jax_plugins")):
    return path
  raise TargetError("compiling for an NVIDIA GPU needs jaxlib's CUDA plugin, which is not "
                    "installed: run `make compilers` (or pip install \"jax[cuda12]\" matching "
                    "your jax)")


def use_compiler(platform: str) -> None:
  """Makes `platform`'s compiler loadable by this process and keeps JAX's own backend the
  CPU (no device is probed for, no cloud metadata is queried). Must run before JAX
  initialises its backends: the compile launcher calls `prepare_host` first thing."""
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["TPU_SKIP_MDS_QUERY"] = "1"
  # libtpu asks for these when no TPU VM describes itself; any value keeps it quiet
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  # compile-only processes hold no chip: let several load libtpu at once (else every one but
  # the first stops on libtpu's lockfile, e.g. two compile tests on two pytest workers)
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # where libtpu writes its log, whose memory usage report names the buffers of an HBM refusal
  os.environ.setdefault("TPU_LOG_DIR", memory_report.DEFAULT_LOG_DIR)
  if platform == "tpu":
    path = _libtpu_path()
    if path:
      os.environ["TPU_LIBRARY_PATH"] = path
  elif platform == "cuda":
    path = _cuda_plugin_dir()
    if path and path not in sys.path:
      sys.path.append(path)


# what the CUDA plugin's stub library logs each time it is loaded on a host without a GPU
# (three times as JAX imports the plugin, once as the backends start), each after absl's note
_CUDA_NOTICE = re.compile(rb"(WARNING: All log messages before absl::InitializeLog\(\) is called "
                          rb"are written to STDERR|.*cudart_stub\.cc.*Could not find cuda "
                          rb"drivers.*)\n?")


def _start_jax_quietly() -> None:
  """Imports JAX and starts its backends with the process's stderr (file descriptor 2, where
  the plugin's C++ logging writes) caught, and writes back what it caught without the CUDA
  stub's start-up notice: a compile-only host is expected to have no GPU driver."""
  import tempfile
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as caught:
    os.dup2(caught.fileno(), 2)
    try:
      import jax
      jax.devices()
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      caught.seek(0)
      text = caught.read()
  os.write(2, _CUDA_NOTICE.sub(b"", text))


def prepare_host() -> None:
  """`use_compiler` for every platform whose compiler is installed, then JAX started (the
  target is known only once the command line is read)."""
  cuda = False
  for platform in ("tpu", "cuda"):
    try:
      use_compiler(platform)
      cuda = cuda or platform == "cuda"
    except TargetError:
      pass   # said when a target of that platform is asked for (`topology_devices`)
  if cuda:
    _start_jax_quietly()


def topology_devices(target: Target) -> list:
  """The compile-only devices of `target` (all slices), in the order a mesh takes them."""
  from jax.experimental import topologies
  use_compiler(target.platform)
  if target.platform == "tpu":
    kwargs: dict[str, int | tuple[int, ...]] = (
        {"num_slices": target.n_slices} if target.n_slices > 1 else {})
    dims = [int(d) for d in target.topology.split(":")[1].split("x")]
    if math.prod(dims) < 4:    # a host of fewer chips than libtpu's default 2x2x1 (Colab's v5e-1)
      kwargs["chips_per_host_bounds"] = tuple(dims + [1] * (3 - len(dims)))
    try:
      topo = topologies.get_topology_desc(platform="tpu", topology_name=target.topology,
                                          **kwargs)
    except Exception as e:   # noqa: BLE001 - libtpu refuses the name: say so in one line
      raise TargetError(f"libtpu has no topology {target.topology!r}: "
                        f"{str(e).splitlines()[0]}") from None
    return list(topo.devices)
  with open(target.spec_file) as f:
    spec = f.read()
  topo = topologies.get_topology_desc(platform="cuda", topology_name="gpu",
                                      target_config=spec,
                                      topology=f"{target.n_slices}x1x{target.devices_per_slice}")
  return list(topo.devices)


def devices_per_chip(devices) -> int:
  """TPU devices that share a chip (2 where each TensorCore is a device: v4 without
  megacore, TPU7x); 1 for megacore chips and GPUs."""
  coords = [tuple(getattr(d, "coords", ()) or ()) + (getattr(d, "slice_index", 0) or 0,)
            for d in devices]
  if not coords or not coords[0][:-1]:
    return 1
  return max(1, len(coords) // len(set(coords)))


def chip_of_device(device) -> Chip | None:
  """The chip of a real (or compile-only) device, from its `device_kind`; None if unknown."""
  kind = getattr(device, "device_kind", "")
  if kind in TPU_KINDS:
    return CHIPS[TPU_KINDS[kind]]
  name = kind.lower()
  return next((CHIPS[c] for c in ("h200", "h100", "a100") if c in name), None)


@dataclasses.dataclass(frozen=True)
class DeviceBudget:
  """What one compile-only device has: its share of its chip."""
  hbm_bytes: int
  peak_flops: float
  hbm_bandwidth: float


def device_budget(target: Target, devices) -> DeviceBudget:
  return chip_budget(target.chip, devices, target.platform)


def chip_budget(chip: Chip, devices, platform: str) -> DeviceBudget:
  """One device's share of its chip (TPU devices may split a chip; a GPU is one device)."""
  share = devices_per_chip(devices) if platform == "tpu" else 1
  return DeviceBudget(chip.hbm_bytes // share, chip.peak_flops / share,
                      chip.hbm_bandwidth / share)


def compiler_requirements(platform: str) -> list[str]:
  """pip requirements of `platform`'s compiler for this jax (`make compilers`): libtpu as
  jax's `tpu` extra pins it; the CUDA 12 plugin of this jaxlib with ptxas and nvJitLink (the
  CUDA runtime libraries are not needed to compile)."""
  import importlib.metadata as metadata
  if platform == "tpu":
    extra = [r.split(";")[0].strip() for r in metadata.requires("jax") or []
             if r.startswith("libtpu") and 'extra == "tpu"' in r]
    if not extra:
      raise TargetError("this jax declares no libtpu in its `tpu` extra")
    return extra
  if platform == "cuda":
    version = metadata.version("jaxlib")
    return [f"jax-cuda12-plugin=={version}", f"jax-cuda12-pjrt=={version}",
            "nvidia-cuda-nvcc-cu12>=12.6.85", "nvidia-nvjitlink-cu12>=12.1.105"]
  raise TargetError(f"no compiler for platform {platform!r}")


if __name__ == "__main__":   # `python -m orl_jax.aot.targets tpu`: the Makefile's pip arguments
  print(" ".join(compiler_requirements(sys.argv[1])))
