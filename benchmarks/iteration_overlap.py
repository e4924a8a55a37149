"""The host's share of an ORL iteration (docs/scaling.md#the-hosts-share-of-an-iteration).

Part (b), at the real configs' shapes, on this host:

* code verification: `HumanEvalVerifier.score_batch` of 8 prompts x 16 samples (128, the
  paper's rollout), 8 small HumanEval-style problems written here (or the first 8 of a
  HumanEval-format JSONL, `--tasks FILE`), each prompt's 16 samples a mix of right, wrong and
  raising completions; and the same with one looping sample (`while True: pass`) per prompt,
  which runs to its CPU limit (`--cpu-s`, the training default). Per isolation
  (`task.verify_isolation`: "sample", a prompt's samples side by side; "prompt", one after
  another in slots), variant and parallelism (1 and the verifier's default): wall time of one
  batch (a fresh verifier each run: no cached verdicts; median of `--repeats`) and CPU seconds
  per sample (this process's children's rusage and the fork server's: the sandboxes and
  judges);
* math verification: `MathAnswerVerifier.score_batch` of 128 GSM8K responses (half the gold
  solutions, half with a wrong final number), median of 5;
* planning: `replay.build_plan` for each paper model at its config's replay settings and
  rollout size, 256 new tokens, block 4 (SDAR) or 32 (QwenDLM, LLaDA2.1), on synthetic capture
  arrays of the rollout's shapes (every response verified: the most states to plan), median of
  5;
* the rollout snapshot's bytes (the capture buffers, as the dry-run counts them) and the time
  to write them at `--disk-gbps` when the snapshot is not written asynchronously.

Then per model and target (v5p-8, 8 x H100) with a compile result
(`benchmarks/results/compile_*.json`): the device's time of an iteration, lower bounds — the
compiled train step's roofline (`predicted.iteration_seconds`, the train step alone where the
rollout was not compiled) plus the rollout's 256 forwards, each chunk's at least one read of
the device's weights and its share of the forward's FLOPs at the chips' peak (dense models;
2 x parameters x tokens), whichever is longer (a chunk re-reads the weights: where reading
binds, chunking costs (K - 1) x 256 x one read) — and
the host's critical path of an iteration, per isolation: the serial loop (rollout, verify all,
plan, update); for every chunk count K dividing the group, the loop that verifies each chunk by
samples (every prompt, G / K samples) while the later chunks decode (the last chunk's
verification, what earlier chunks overran their decoding, then planning); and staleness 1
(`orl.max_staleness`: the next rollout decodes while this one is verified and planned, so only
what exceeds its decoding is exposed). Host costs are scaled to the target's host:
verification takes max(CPU per sample x samples / usable cores, the longest chain of samples
that cannot run at once at the wall each holds here: one sample with "sample" isolation, a
prompt's samples one after another with "prompt"); planning is one thread and keeps its time
here; each prompt's looping sample is put in the last chunk. Reported: the idle share
host / (device + host) serial, at the best K and with staleness 1, the host path as a share of
the device time, and the floors for "sample" isolation (host <= 10% of the device; with one
looping sample a prompt, at most the loop plus 10% of the device; staleness 1 with loops, idle
<= 10% where the rollout outlasts the loop). Device times being lower bounds, the idle shares
are upper bounds. The last line is `iteration_overlap_worst_idle_fraction_sample_isolation: X`
(best chunk count, no looping samples, worst model and target). JSON:
benchmarks/results/iteration_overlap.json.

Part (a): the tiny ORL iteration (configs/tiny.py's ORL stage, a random model, the eight
problems above as a HumanEval-format JSONL, 8 prompts x 16 responses of 256 tokens) with
serial and with overlapped verification, `--a-rounds` runs of each alternating in this process,
the same settings (`--a-chunks` rollout chunks by samples): the medians of the phase times over
the iterations after each run's first, the wall time the overlap saves as a share of the serial
loop's verification time, and whether every run ended with the same parameters (they must).
This host's CPU is both the device and the host: by default XLA gets one thread
(`--a-device-threads 1`), leaving the other core to the verifier as an accelerator leaves a
host's cores to it (0: XLA's default, decoding and verification compete for both cores).
Last line `iteration_overlap_tiny_saved_share_of_verification: X`;
JSON: benchmarks/results/iteration_overlap_tiny.json.

  python benchmarks/iteration_overlap.py --part a
  python benchmarks/iteration_overlap.py [--part b] [--repeats 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import decimal
import glob
import importlib
import json
import math
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402  (puts the repository on sys.path)

RESULTS = os.path.join(_common.ROOT, "benchmarks", "results")

# The paper's models: (name, configs module, get_config arg, compile JSON stem, dense: every
# parameter multiplies every token; an MoE's FLOPs are not counted, only its weight reads).
MODELS = (("SDAR-8B", "sdar", "8b", "sdar_8b", True),
          ("QwenDLM-4B", "qwendlm", None, "qwendlm_4b", True),
          ("LLaDA2.1-mini", "llada", "2.1-mini", "llada21_mini", False))


@dataclasses.dataclass(frozen=True)
class TargetHost:
  """A target and the host CPUs its verification may use."""
  name: str            # as docs/scaling.md names it
  compile_stem: str    # the target in benchmarks/results/compile_<model>_<target>.json
  vcpus: int
  usable_cores: int
  source: str


# Google Cloud's machine pages: a v5p TPU VM (4 chips, ct5p-hightpu-4t) has 208 vCPUs, half of
# them usable when the process is bound to one NUMA node; an a3-highgpu-8g (8 x H100) has 208
# vCPUs. Assumed usable for verification: 104 physical cores, less 8 for the training process,
# the JAX runtime and data loading.
TARGETS = (TargetHost("v5p-8", "v5p_2x2x1", 208, 96, "Cloud TPU v5p VM: 208 vCPUs"),
           TargetHost("8xH100", "h100x8", 208, 96, "a3-highgpu-8g: 208 vCPUs"))

# --- the code task --------------------------------------------------------------------------

# Eight HumanEval-style problems: (entry point, prompt, right body, wrong body, tests).
_TASKS = (
    ("add_lists", "def add_lists(a: list, b: list) -> list:\n    \"\"\"Element-wise sums of two "
     "lists of equal length.\n    >>> add_lists([1, 2], [3, 4])\n    [4, 6]\n    \"\"\"\n",
     "    return [x + y for x, y in zip(a, b)]\n", "    return a + b\n",
     "def check(candidate):\n    assert candidate([1, 2], [3, 4]) == [4, 6]\n"
     "    assert candidate([], []) == []\n    assert candidate([-1], [1]) == [0]\n"),
    ("count_vowels", "def count_vowels(s: str) -> int:\n    \"\"\"How many of the letters of s "
     "are vowels (a, e, i, o, u, any case).\n    >>> count_vowels('Hello')\n    2\n"
     "    \"\"\"\n", "    return sum(c in 'aeiouAEIOU' for c in s)\n",
     "    return sum(c in 'aeiou' for c in s)\n",
     "def check(candidate):\n    assert candidate('Hello') == 2\n    assert candidate('') == 0\n"
     "    assert candidate('AEIOUxyz') == 5\n    assert candidate('rhythm') == 0\n"),
    ("is_palindrome", "def is_palindrome(s: str) -> bool:\n    \"\"\"True when s reads the same "
     "backwards, ignoring case and anything but letters and digits.\n"
     "    >>> is_palindrome('A man, a plan, a canal: Panama')\n    True\n    \"\"\"\n",
     "    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
     "    return s == s[::-1]\n",
     "def check(candidate):\n    assert candidate('A man, a plan, a canal: Panama') is True\n"
     "    assert candidate('abc') is False\n    assert candidate('') is True\n"
     "    assert candidate('No lemon, no melon') is True\n"),
    ("fib", "def fib(n: int) -> int:\n    \"\"\"The n-th Fibonacci number, fib(0) = 0, fib(1) = 1."
     "\n    >>> fib(10)\n    55\n    \"\"\"\n",
     "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
     "    a, b = 1, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
     "def check(candidate):\n    assert candidate(0) == 0\n    assert candidate(1) == 1\n"
     "    assert candidate(10) == 55\n    assert candidate(30) == 832040\n"),
    ("running_max", "def running_max(xs: list) -> list:\n    \"\"\"The largest element so far at "
     "each position.\n    >>> running_max([1, 3, 2, 5])\n    [1, 3, 3, 5]\n    \"\"\"\n",
     "    out = []\n    for x in xs:\n        out.append(x if not out else max(out[-1], x))\n"
     "    return out\n", "    return sorted(xs)\n",
     "def check(candidate):\n    assert candidate([1, 3, 2, 5]) == [1, 3, 3, 5]\n"
     "    assert candidate([]) == []\n    assert candidate([5, 4, 3]) == [5, 5, 5]\n"),
    ("word_lengths", "def word_lengths(sentence: str) -> dict:\n    \"\"\"Each word of the "
     "sentence (split on spaces) and its length.\n    >>> word_lengths('to be')\n"
     "    {'to': 2, 'be': 2}\n    \"\"\"\n",
     "    return {w: len(w) for w in sentence.split()}\n",
     "    return {w: len(w) for w in sentence.split(' ')}\n",
     "def check(candidate):\n    assert candidate('to be') == {'to': 2, 'be': 2}\n"
     "    assert candidate('') == {}\n    assert candidate('a  bcd') == {'a': 1, 'bcd': 3}\n"),
    ("flatten", "def flatten(nested: list) -> list:\n    \"\"\"The elements of a list of lists, "
     "in order.\n    >>> flatten([[1, 2], [3]])\n    [1, 2, 3]\n    \"\"\"\n",
     "    return [x for part in nested for x in part]\n", "    return nested[0]\n",
     "def check(candidate):\n    assert candidate([[1, 2], [3]]) == [1, 2, 3]\n"
     "    assert candidate([]) == []\n    assert candidate([[], [4], [5, 6]]) == [4, 5, 6]\n"),
    ("gcd_list", "def gcd_list(xs: list) -> int:\n    \"\"\"The greatest common divisor of "
     "positive integers.\n    >>> gcd_list([12, 18, 24])\n    6\n    \"\"\"\n",
     "    import math\n    g = 0\n    for x in xs:\n        g = math.gcd(g, x)\n    return g\n",
     "    return min(xs)\n",
     "def check(candidate):\n    assert candidate([12, 18, 24]) == 6\n"
     "    assert candidate([7]) == 7\n    assert candidate([8, 12]) == 4\n"),
)
RAISING = "    raise ValueError('not implemented')\n"
LOOPING = "    while True:\n        pass\n"


@dataclasses.dataclass(frozen=True)
class CodeTask:
  problem: object   # orl_jax.problem.Problem
  right: str        # a completion that passes
  wrong: str        # a completion that fails a test


def builtin_tasks() -> list[CodeTask]:
  from orl_jax.problem import Problem
  return [CodeTask(Problem(f"bench/{i}", prompt, tests=tests, entry_point=entry), right, wrong)
          for i, (entry, prompt, right, wrong, tests) in enumerate(_TASKS)]


def file_tasks(path: str, n: int) -> list[CodeTask]:
  """The first `n` problems of a HumanEval-format JSONL: right = the canonical solution, wrong =
  `return None` (a wrong value for every HumanEval problem)."""
  from orl_jax.data.humaneval import load_humaneval
  return [CodeTask(p, p.target, "    return None\n") for p in load_humaneval(path)[:n]]


def sample_kinds(group: int, looping: bool) -> list[str]:
  """The kinds of a prompt's `group` samples: 5/8 right, 1/4 wrong, the rest raising; with
  `looping`, one wrong sample loops instead."""
  right, wrong = round(group * 5 / 8), round(group / 4)
  kinds = ["right"] * right + ["wrong"] * wrong + ["raise"] * (group - right - wrong)
  if looping:
    kinds[right] = "loop"
  return kinds


def code_batch(tasks: list[CodeTask], group: int, looping: bool, tag: str) -> tuple[list, list]:
  """(problems, responses) of len(tasks) x group samples, prompt-major as a rollout returns them;
  every response distinct (a comment with `tag` and its index), so none is a cached verdict."""
  body = {"wrong": lambda t: t.wrong, "raise": lambda t: RAISING, "loop": lambda t: LOOPING,
          "right": lambda t: t.right}
  problems, responses = [], []
  for t in tasks:
    for j, kind in enumerate(sample_kinds(group, looping)):
      problems.append(t.problem)
      responses.append(body[kind](t) + f"    # {tag} {len(responses)} {j}\n")
  return problems, responses


def children_cpu_s() -> float:
  """CPU seconds of the processes this one started and reaped, with the sandboxes the runner
  fork server started for it (an R forked by F is F's child, not this process's)."""
  from orl_sandbox import forkserver
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime + forkserver.cpu_s()


def score_once(problems, responses, parallelism: int | None, timeout_s: float,
               cpu_s: int, isolation: str) -> dict:
  """One timed `score_batch` on a fresh verifier (its smoke run and one warm-up sample first)."""
  import orl_sandbox as sandbox
  from orl_jax.verify.humaneval import HumanEvalVerifier
  limits = sandbox.SandboxLimits(timeout_s=timeout_s, cpu_s=cpu_s)
  with HumanEvalVerifier(limits, parallelism=parallelism, isolation=isolation) as verifier:
    verifier.score_batch(problems[:1], [responses[0] + f"    # warm-up {time.time()}\n"])
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    scores = verifier.score_batch(problems, responses)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu0
    return {"wall_s": wall, "cpu_s": cpu, "judge_cpu_s": verifier.stats.judge_cpu_s,
            "timeouts": verifier.stats.timeouts, "parallelism": verifier.parallelism,
            "passed": int(sum(scores))}


def default_parallelism() -> int:
  """What `HumanEvalVerifier(parallelism=None)` runs with on this host."""
  from orl_jax.verify.humaneval import HumanEvalVerifier
  with HumanEvalVerifier() as verifier:
    return verifier.parallelism


def measure_verification(tasks, group: int, parallelisms: list[int], repeats: int,
                         timeout_s: float, cpu_s: int) -> dict:
  """{isolation: {variant: {parallelism: record}}}: median wall, CPU per sample, of `repeats`
  runs each, the isolations and variants alternating."""
  runs: dict = {}
  for repeat in range(repeats):
    for isolation in ISOLATIONS:
      for variant in ("clean", "looping"):
        for p in parallelisms:
          problems, responses = code_batch(tasks, group, variant == "looping",
                                           f"r{repeat} {isolation}")
          run = score_once(problems, responses, p, timeout_s, cpu_s, isolation)
          runs.setdefault(isolation, {}).setdefault(variant, {}).setdefault(p, []).append(run)
          print(f"  {isolation:6s} {variant:8s} parallelism {p}: {run['wall_s']:6.2f} s, "
                f"children CPU {run['cpu_s']:6.2f} s, {run['passed']} passed, "
                f"{run['timeouts']} timeouts", flush=True)
  return {i: {v: {p: summarize_runs(rs, group * len(tasks)) for p, rs in by_p.items()}
              for v, by_p in by_v.items()} for i, by_v in runs.items()}


def summarize_runs(runs: list[dict], n_samples: int) -> dict:
  wall = statistics.median(r["wall_s"] for r in runs)
  cpu = statistics.median(r["cpu_s"] for r in runs)
  return {"wall_s": wall, "wall_runs_s": [r["wall_s"] for r in runs], "cpu_s": cpu,
          "cpu_per_sample_s": cpu / n_samples,
          "judge_cpu_per_sample_s": statistics.median(r["judge_cpu_s"] for r in runs) / n_samples,
          "timeouts": runs[0]["timeouts"], "passed": runs[0]["passed"],
          "n_samples": n_samples}


# The verifier's isolation modes (`task.verify_isolation`; orl_jax/verify/humaneval.py).
ISOLATIONS = ("sample", "prompt")


@dataclasses.dataclass(frozen=True)
class VerifyCost:
  """What one sample costs, measured here: CPU seconds and the wall seconds it holds its
  worker (with "prompt" isolation also its prompt: a prompt's samples run one after another,
  each for at least its slot), for an ordinary and a looping sample."""
  cpu_s: float
  held_s: float
  loop_cpu_s: float
  loop_held_s: float


def verify_cost(serial: dict, n_prompts: int, group: int) -> VerifyCost:
  """From the parallelism-1 runs ({variant: record}): an ordinary sample's CPU and held wall
  (the batch / samples); a looping sample's: the looping batch less its ordinary samples."""
  n = n_prompts * group
  clean, looping = serial["clean"], serial["looping"]
  cpu_s, held_s = clean["cpu_s"] / n, clean["wall_s"] / n
  ordinary = n - n_prompts
  return VerifyCost(cpu_s, held_s, (looping["cpu_s"] - ordinary * cpu_s) / n_prompts,
                    (looping["wall_s"] - ordinary * held_s) / n_prompts)


# --- the host's critical path ----------------------------------------------------------------

def verification_seconds(cost: VerifyCost, n_prompts: int, group: int, cores: int,
                         looping: bool, isolation: str = "prompt") -> float:
  """Scaled verification time of `n_prompts` x `group` samples on `cores` cores: the CPU spread
  over the cores, but never below the longest chain of samples that cannot run at once — with
  "prompt" isolation one prompt's samples one after another, with "sample" isolation one
  sample (the looping one when there is one)."""
  loops = n_prompts if looping else 0
  cpu = (n_prompts * group - loops) * cost.cpu_s + loops * cost.loop_cpu_s
  if isolation == "sample":
    return max(cpu / cores, cost.loop_held_s if looping else cost.held_s)
  one_prompt = (group - int(looping)) * cost.held_s + int(looping) * cost.loop_held_s
  return max(cpu / cores, one_prompt)


def exposed_verification(chunk_s: float, n_chunks: int, decode_chunk_s: float | None) -> float:
  """Verification the device waits for when chunk c is verified while chunk c + 1 decodes: the
  last chunk's, plus what earlier chunks' verification overran the decoding (a two-stage
  pipeline: v + (K - 1) max(0, v - d)). Decode time unknown (None): assumed to hide them."""
  if decode_chunk_s is None:
    return chunk_s
  return chunk_s + (n_chunks - 1) * max(0.0, chunk_s - decode_chunk_s)


def idle_fraction(host_s: float, device_s: float) -> float:
  """The device's idle share of an iteration whose host critical path is `host_s`."""
  return host_s / (device_s + host_s)


def host_paths(cost: VerifyCost, plan_s: float, n_prompts: int, group: int, cores: int,
               n_chunks: int, looping: bool, decode_chunk_s: float | None,
               isolation: str = "prompt") -> dict:
  """Host critical path of the serial loop (verify all, then plan) and of the loop that
  verifies each of `n_chunks` chunks by samples (every prompt, group / n_chunks samples each)
  while the later chunks decode: the last chunk's verification, what earlier ones overran
  their decoding, then plan. With `looping`, each prompt's looping sample is in the last chunk
  (the worst place for it)."""
  verify_s = verification_seconds(cost, n_prompts, group, cores, looping, isolation)
  chunk_s = verification_seconds(cost, n_prompts, group // n_chunks, cores, False, isolation)
  last_s = verification_seconds(cost, n_prompts, group // n_chunks, cores, looping, isolation)
  exposed = verify_s if n_chunks == 1 else (
      last_s - chunk_s + exposed_verification(chunk_s, n_chunks, decode_chunk_s))
  return {"verify_s": verify_s, "verify_last_chunk_s": last_s, "plan_s": plan_s,
          "serial_s": verify_s + plan_s, "overlapped_s": exposed + plan_s}


def stale_path(host_s: float, rollout_s: float) -> float:
  """The host time the device waits for with `orl.max_staleness` 1: the next rollout is
  dispatched before this one is verified and planned, so the host's `host_s` (verify all, plan)
  hides behind the next rollout's `rollout_s` of decoding, and only what exceeds it is exposed."""
  return max(0.0, host_s - rollout_s)


def chip_of(device: dict):
  """The `orl_jax.aot.targets.Chip` a compile result ran for (by its name)."""
  from orl_jax.aot.targets import CHIPS
  return next(c for c in CHIPS.values() if c.name == device["chip"])


def weights_read_s(device: dict) -> float:
  """Seconds one forward takes at least to read the bf16 weights a device holds (the
  parameters split over every mesh axis but `data`) at the chip's HBM bandwidth."""
  mesh = device["mesh"]
  shards = math.prod(v for k, v in mesh.items() if k != "data") or 1
  return 2 * device["n_params"] / shards / chip_of(device).hbm_bandwidth


def forward_flops_s(device: dict, rows: int, block: int, dense: bool) -> float:
  """Seconds one rollout forward of `rows` rows of a `block`-token block takes at least at the
  chips' bf16 peak: 2 x parameters x tokens (attention left out); 0 for an MoE."""
  if not dense:
    return 0.0
  return 2 * device["n_params"] * rows * block / (device["n_devices"]
                                                  * chip_of(device).peak_flops)


def device_seconds(device: dict, n_chunks: int, rows: int, block: int, dense: bool) -> dict:
  """The device's time of an iteration with `n_chunks` rollout chunks, lower bounds: the
  compiled train step's roofline (`predicted.iteration_seconds`: the train step alone where
  the rollout was not compiled) + the rollout's forwards (prefill left out), each chunk's at
  least one read of the weights and its share of the FLOPs, whichever is longer (a chunk's
  forward reads the weights again: where reading binds, chunking costs (K - 1) x forwards x
  one read)."""
  per_forward = max(weights_read_s(device),
                    forward_flops_s(device, rows, block, dense) / n_chunks)
  decode_chunk = device["forwards"] * per_forward
  rollout = n_chunks * decode_chunk
  return {"train_s": device["seconds"], "rollout_s": rollout, "decode_chunk_s": decode_chunk,
          "total_s": device["seconds"] + rollout}


# --- the compile results ---------------------------------------------------------------------

def read_compile(path: str) -> dict:
  """The predicted device time of an iteration in one launch/compile.py JSON: seconds, whether
  every program of the iteration was compiled (`complete`), the programs, the mesh."""
  with open(path) as f:
    result = json.load(f)
  predicted = result.get("predicted") or {}
  programs = [p["name"] for p in result.get("programs", []) if p.get("ok")]
  seconds = predicted.get("iteration_seconds")
  if seconds is None or not math.isfinite(seconds):
    raise ValueError(f"{path} has no predicted iteration time (a program did not compile).")
  return {"seconds": float(seconds), "complete": bool(predicted.get("complete")),
          "programs": programs, "tpf": predicted.get("tpf"), "mesh": result.get("mesh", {}),
          "target": result.get("target"), "chip": result["chip"],
          "n_devices": int(result["n_devices"]),
          "n_params": int(result["n_params"]),
          "forwards": float(predicted.get("rollout_forwards") or 256),
          "file": os.path.relpath(path, _common.ROOT)}


def compile_result(stem: str, target: TargetHost, results_dir: str = RESULTS) -> dict | None:
  paths = glob.glob(os.path.join(results_dir, f"compile_{stem}_{target.compile_stem}.json"))
  return read_compile(paths[0]) if paths else None


# --- planning and snapshot -------------------------------------------------------------------

def real_config(module: str, arg: str | None):
  """(RunConfig, model config, sampler) of a real-model config, built without weights."""
  from orl_jax.config import build as run_config
  from orl_jax.decode import build as decode_build
  from orl_jax.setup.build import sizing_model_config
  get_config = importlib.import_module(f"configs.{module}").get_config
  config = run_config.build(get_config(arg) if arg else get_config())
  model_cfg = sizing_model_config(config)
  return config, model_cfg, decode_build.sampler_of(config, model_cfg)


def snapshot_bytes(config, model_cfg, sampler) -> int:
  """The rollout's capture buffers as the dry-run counts them (the bulk of a snapshot)."""
  import jax.numpy as jnp
  from orl_jax.decode.trajectories import block_final_bytes, capture_bytes, route_capture_bytes
  from orl_jax.setup.resolve import special_ids
  mask_id, eos_id = special_ids(config, model_cfg)
  decode_cfg = sampler.forward_config("rollout", mask_id=mask_id, eos_id=eos_id)
  n = config.orl.prompts_per_step * config.orl.group_size
  width = jnp.dtype(model_cfg.compute_dtype).itemsize
  out = (capture_bytes(n, decode_cfg, model_cfg.d_model, width)
         + block_final_bytes(n, decode_cfg))
  if model_cfg.moe is not None and decode_cfg.capture_routes:
    out += route_capture_bytes(n, decode_cfg, config.task.prompt_len, model_cfg.n_moe_layers,
                               model_cfg.moe.top_k, decode_cfg.max_blocks)
  return int(out)


def synthetic_capture(n_prompts: int, group: int, prompt_len: int, gen_length: int, block: int,
                      capture_states: int, rng) -> dict:
  """Capture metadata of a rollout at TPF 1 (each block takes `block` forwards, one state
  each), responses of a quarter to all of `gen_length` tokens, prompts of a quarter to all of
  `prompt_len`; every response verified."""
  import numpy as np
  n = n_prompts * group
  lengths = rng.integers(gen_length // 4, gen_length + 1, size=n)
  states = np.minimum(-(-lengths // block) * block, capture_states)
  slot = np.arange(capture_states)
  prompt_tokens = rng.integers(prompt_len // 4, prompt_len + 1, size=n_prompts)
  first = (prompt_len - prompt_tokens)[:, None]   # prompts end at the prompt's last position
  return {"prompt_valid": np.arange(prompt_len)[None, :] >= first,                    # [P, Lp]
          "capture_valid": slot[None, :] < states[:, None],                           # [P*G, S]
          "capture_block": np.broadcast_to(slot // block, (n, capture_states)).astype(np.int32),
          "eligible": np.ones(n, np.float32)}                                          # [P*G]


def time_planning(config, sampler, model_cfg, n_shards: int, repeats: int) -> dict:
  """Median seconds of `build_plan` on one synthetic rollout of the config's shape."""
  import numpy as np
  from orl_jax.config import derive as config_lib
  from orl_jax.replay.plan import build_plan
  from orl_jax.setup.resolve import special_ids
  cfg = config_lib.replay_config(config, n_shards, sampler.replay_context)
  mask_id, eos_id = special_ids(config, model_cfg)
  decode_cfg = sampler.forward_config("rollout", mask_id=mask_id, eos_id=eos_id)
  o = config.orl
  arrays = synthetic_capture(o.prompts_per_step, o.group_size, config.task.prompt_len,
                             config.decode.gen_length, cfg.block_size, decode_cfg.capture_states,
                             np.random.default_rng(0))
  stats = {}

  def run():
    stats.update(build_plan(**arrays, group_size=o.group_size, cfg=cfg,
                            rng=np.random.default_rng(1))[1])
  seconds, runs = _common.median_time(run, repeats)
  return {"seconds": seconds, "runs_s": runs, "block_size": cfg.block_size,
          "responses": o.prompts_per_step * o.group_size, "n_shards": n_shards,
          "states_packed": stats["states_packed"], "states_dropped": stats["states_dropped"]}


def measure_math(n: int, repeats: int) -> dict:
  """Median seconds of scoring `n` GSM8K responses: half gold solutions, half off by one."""
  from orl_jax.data.gsm8k import load_gsm8k_test
  from orl_jax.verify.math_answer import MathAnswerVerifier
  problems = load_gsm8k_test()[:n]
  responses = [p.target if i % 2 == 0 else
               p.target.rsplit("####", 1)[0] + f"#### {decimal.Decimal(p.answer) + 1}"
               for i, p in enumerate(problems)]
  verifier, scores = MathAnswerVerifier(), []
  seconds, runs = _common.median_time(
      lambda: scores.append(verifier.score_batch(problems, responses)), repeats)
  return {"seconds": seconds, "runs_s": runs, "responses": n, "right": int(sum(scores[0]))}


# --- part (b) --------------------------------------------------------------------------------

def chunk_choices(group: int) -> list[int]:
  """The chunk counts a group of `group` samples can be cut into (divisors)."""
  return [k for k in range(1, group + 1) if group % k == 0]


def model_row(cost: VerifyCost, plan: dict, device: dict, cores: int, dense: bool,
              args, isolation: str = "prompt") -> dict:
  """Per chunk count (staleness 0): device time, host paths (clean, looping), iteration and
  idle share; the serial loop is one chunk with all verification exposed; `best` the chunk
  count with the shortest clean iteration. `stale`: staleness 1 with one chunk (the whole
  verification and planning behind the next rollout's decoding)."""
  by_k = {}
  for k in chunk_choices(args.group):
    dev = device_seconds(device, k, args.prompts * args.group, plan["block_size"], dense)
    entry: dict = {"device": dev}
    for variant in ("clean", "looping"):
      paths = host_paths(cost, plan["seconds"], args.prompts, args.group, cores, k,
                         variant == "looping", dev["decode_chunk_s"], isolation)
      host = paths["serial_s"] if k == 1 else paths["overlapped_s"]
      entry[variant] = dict(paths, host_s=host, iteration_s=dev["total_s"] + host,
                            idle=idle_fraction(host, dev["total_s"]),
                            host_share_of_device=host / dev["total_s"])
    by_k[k] = entry
  best = min(by_k, key=lambda k: by_k[k]["clean"]["iteration_s"])
  one = by_k[1]
  stale: dict = {"device": one["device"]}
  for variant in ("clean", "looping"):
    host = stale_path(one[variant]["serial_s"], one["device"]["rollout_s"])
    stale[variant] = {"host_s": host, "iteration_s": one["device"]["total_s"] + host,
                      "idle": idle_fraction(host, one["device"]["total_s"]),
                      "host_share_of_device": host / one["device"]["total_s"]}
  return {"by_chunks": by_k, "best_chunks": best, "stale": stale}


def model_rows(costs: dict, planning: dict, snapshots: dict, args) -> list[dict]:
  """Per paper model and target with a compile result: the serial and best chunked loop."""
  rows = []
  for name, _, _, stem, dense in MODELS:
    for target in TARGETS:
      device = compile_result(stem, target)
      if device is None:
        continue
      for isolation in ISOLATIONS:
        row = {"model": name, "target": target.name, "isolation": isolation, "device": device,
               "usable_cores": target.usable_cores, "snapshot_bytes": snapshots[name],
               "snapshot_write_s": snapshots[name] / (args.disk_gbps * 1e9)}
        row.update(model_row(costs[isolation], planning[name][target.name], device,
                             target.usable_cores, dense, args, isolation))
        rows.append(row)
  return rows


def measure_host(args) -> dict:
  """Every host phase measured here (verification, math, planning, snapshot sizes)."""
  tasks = file_tasks(args.tasks, args.prompts) if args.tasks else builtin_tasks()[:args.prompts]
  default = default_parallelism()
  parallelisms = sorted({1, default})
  print(f"code verification: {len(tasks)} prompts x {args.group} samples, parallelism "
        f"{parallelisms} (default here: {default}), timeout {args.timeout_s} s, CPU limit "
        f"{args.cpu_s} s", flush=True)
  verification = measure_verification(tasks, args.group, parallelisms, args.repeats,
                                      args.timeout_s, args.cpu_s)
  math_task = measure_math(args.prompts * args.group, 5)
  planning, snapshots = {}, {}
  for name, module, arg, _, _ in MODELS:
    config, model_cfg, sampler = real_config(module, arg)
    snapshots[name] = snapshot_bytes(config, model_cfg, sampler)
    planning[name] = {}
    for target in TARGETS:
      device = compile_result(dict((m[0], m[3]) for m in MODELS)[name], target)
      mesh = (device or {}).get("mesh") or {"fsdp": 8}
      shards = mesh.get("data", 1) * mesh.get("fsdp", 1) * mesh.get("expert", 1)
      planning[name][target.name] = time_planning(config, sampler, model_cfg, shards, 5)
  return {"verification": verification, "default_parallelism": default, "math": math_task,
          "planning": planning, "snapshot_bytes": snapshots}


def _fmt(x: float | None, spec: str = ".2f") -> str:
  return "–" if x is None else format(x, spec)


def print_host(host: dict, costs: dict) -> None:
  print("\ncode verification on this host (median wall of one batch; CPU a sample):")
  for isolation, by_v in host["verification"].items():
    for variant, by_p in by_v.items():
      for p, r in sorted(by_p.items()):
        print(f"  {isolation:6s} {variant:8s} parallelism {p}: {r['wall_s']:7.2f} s   CPU "
              f"{r['cpu_per_sample_s'] * 1e3:6.1f} ms a sample (judge "
              f"{r['judge_cpu_per_sample_s'] * 1e3:5.1f})   {r['passed']} passed, "
              f"{r['timeouts']} timeouts")
  for isolation, cost in costs.items():
    print(f"  {isolation} isolation: a sample {cost.cpu_s * 1e3:.1f} ms CPU, holds its worker "
          f"{cost.held_s * 1e3:.0f} ms; a looping one: {cost.loop_cpu_s:.2f} s CPU, "
          f"{cost.loop_held_s:.2f} s held")
  m = host["math"]
  print(f"math verification: {m['responses']} GSM8K responses {m['seconds'] * 1e3:.1f} ms "
        f"({m['right']} right)")
  for name, by_target in host["planning"].items():
    for target, r in by_target.items():
      print(f"planning {name} on {target}: {r['responses']} responses, block {r['block_size']}, "
            f"{r['n_shards']} shards: {r['seconds'] * 1e3:.1f} ms ({r['states_packed']} states)")


def print_table(rows: list[dict], args) -> None:
  print(f"\nper model and target ({args.prompts} x {args.group} code samples, host scaled to its "
        "usable cores; device time = compiled train step + rollout forwards at max(one weight "
        "read, the FLOPs at peak) each, lower bounds; seconds):")
  print("| model | target | isolation | device, 1 chunk | idle serial | best chunks | host "
        "then | host / device | idle then | idle, 1 loop a prompt | staleness 1: idle | "
        "staleness 1: idle, 1 loop a prompt |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    one, k, stale = r["by_chunks"][1], r["best_chunks"], r["stale"]
    best = r["by_chunks"][k]
    print(f"| {r['model']} | {r['target']} | {r['isolation']} | "
          f"{one['device']['total_s']:.2f} | {one['clean']['idle']:.0%} | {k} | "
          f"{best['clean']['host_s']:.2f} | {best['clean']['host_share_of_device']:.0%} | "
          f"{best['clean']['idle']:.0%} | {best['looping']['idle']:.0%} | "
          f"{stale['clean']['idle']:.0%} | {stale['looping']['idle']:.0%} |")


def floors(rows: list[dict], costs: dict) -> dict:
  """Whether each model and target meets the floors with "sample" isolation: at its best
  chunk count the host's critical path at most 10% of the device time; with one looping sample
  a prompt, at most the loop's hold plus 10% of the device time (the loop costs its limit
  once); with staleness 1 and loops, idle at most 10% where the rollout's device time exceeds
  the loop's hold (None where it does not)."""
  out = {}
  loop_s = costs["sample"].loop_held_s
  for r in rows:
    if r["isolation"] != "sample":
      continue
    best, stale = r["by_chunks"][r["best_chunks"]], r["stale"]
    device_s = best["device"]["total_s"]
    out[f"{r['model']} {r['target']}"] = {
        "clean": best["clean"]["host_share_of_device"] <= 0.10,
        "looping": best["looping"]["host_s"] <= loop_s + 0.10 * device_s,
        "stale_looping": (stale["looping"]["idle"] <= 0.10
                          if stale["device"]["rollout_s"] > loop_s else None)}
  return out


def scaling_assumption(args) -> str:
  cores = ", ".join(f"{t.name} {t.usable_cores} of {t.vcpus} vCPUs ({t.source})" for t in TARGETS)
  return (f"verification on the target's host: max(CPU a sample measured here x samples / "
          f"usable cores, the longest chain of samples that cannot run at once at the wall each "
          f"holds here: one sample with \"sample\" isolation, a prompt's samples one after "
          f"another with \"prompt\"); staleness 1 hides verification and planning behind the "
          f"next rollout's decoding; "
          f"usable cores {cores}; planning one thread at this host's speed; chunks by samples, "
          f"each prompt's looping sample in the last chunk; the rollout snapshot written in the "
          f"background (a synchronous write at {args.disk_gbps} GB/s would add its bytes / that)")


def load_host(path: str) -> dict:
  """The host measurements of an earlier part (b) run (its JSON's "host"), parallelisms as
  ints again."""
  with open(path) as f:
    host = json.load(f)["host"]
  host["verification"] = {i: {v: {int(p): r for p, r in by_p.items()}
                              for v, by_p in by_v.items()}
                          for i, by_v in host["verification"].items()}
  return host


def part_b(args) -> float:
  host = load_host(args.host_from) if args.host_from else measure_host(args)
  costs = {i: verify_cost({v: by_p[1] for v, by_p in by_v.items()}, args.prompts, args.group)
           for i, by_v in host["verification"].items()}
  rows = model_rows(costs, host["planning"], host["snapshot_bytes"], args)
  print_host(host, costs)
  print_table(rows, args)
  met = floors(rows, costs)
  worst = max(r["by_chunks"][r["best_chunks"]]["clean"]["idle"] for r in rows
              if r["isolation"] == "sample")
  stale = [m["stale_looping"] for m in met.values() if m["stale_looping"] is not None]
  clean = sum(m["clean"] for m in met.values())
  print(f"floors met, sample isolation (host <= 10% of device: {clean} of {len(met)}; with "
        f"loops <= the loop + 10%: "
        f"{sum(m['looping'] for m in met.values())} of {len(met)}; staleness 1 with loops, idle "
        f"<= 10% where the rollout outlasts the loop: {sum(stale)} of {len(stale)})")
  print(f"host scaling: {scaling_assumption(args)}")
  _common.write_json(args.out, {
      "host": host, "verify_cost": {i: dataclasses.asdict(c) for i, c in costs.items()},
      "rows": rows, "floors": met,
      "assumption": scaling_assumption(args), "disk_gbps": args.disk_gbps,
      "host_from": os.path.basename(args.host_from) if args.host_from else None,
      "targets": [dataclasses.asdict(t) for t in TARGETS], "host_cpus": os.cpu_count(),
      "load_average": os.getloadavg(), "worst_idle_fraction_overlapped_sample_isolation": worst})
  print(f"wrote {args.out}")
  return worst


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--part", choices=("a", "b", "all"), default="b")
  parser.add_argument("--tasks", default=None,
                      help="a HumanEval-format JSONL (first 8 problems); default: 8 written here")
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--group", type=int, default=16, help="samples a prompt")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--timeout-s", type=float, default=10.0,
                      help="sandbox wall timeout a sample (the verifier's default limits)")
  parser.add_argument("--cpu-s", type=int, default=None,
                      help="a sample's CPU limit (default: task.verify_cpu_s's default)")
  parser.add_argument("--disk-gbps", type=float, default=1.0,
                      help="assumed disk bandwidth of a synchronous snapshot write, GB/s")
  parser.add_argument("--out", default=os.path.join(RESULTS, "iteration_overlap.json"))
  parser.add_argument("--host-from", default=None,
                      help="part b: reuse the host measurements of this earlier results JSON "
                           "(recompute only the per-model table)")
  parser.add_argument("--out-a", default=os.path.join(RESULTS, "iteration_overlap_tiny.json"))
  parser.add_argument("--a-iterations", type=int, default=4,
                      help="part a: ORL iterations a run (the first, which compiles, is left "
                           "out of the medians)")
  parser.add_argument("--a-group", type=int, default=16,
                      help="part a: responses a prompt (orl.group_size; 8 prompts)")
  parser.add_argument("--a-chunks", type=int, default=16,
                      help="part a: rollout chunks (by samples) of both loops")
  parser.add_argument("--a-gen-length", type=int, default=256,
                      help="part a: response tokens (decode.gen_length)")
  parser.add_argument("--a-device-threads", type=int, default=1,
                      help="part a: XLA CPU threads, 1 (the other cores verify, as beside an "
                           "accelerator) or 0 (XLA's default: decoding and verification share "
                           "every core)")
  parser.add_argument("--a-rounds", type=int, default=2,
                      help="part a: serial and overlapped runs, alternating, this many each")
  parser.add_argument("--a-workers", type=int, default=0,
                      help="part a: task.verify_workers of both loops (0: this host's cores)")
  return parser.parse_args(argv)


# --- part (a) --------------------------------------------------------------------------------

def tiny_code_file(path: str) -> str:
  """A JSONL of the eight HumanEval-format problems above with their signatures as prompts
  (at most 64 tokens: two of the tiny config's blocks)."""
  with open(path, "w") as f:
    for entry, prompt, _, _, tests in _TASKS:
      signature = next(line for line in prompt.splitlines() if line.startswith("def "))
      f.write(json.dumps({"id": entry, "prompt": signature + "\n", "entry_point": entry,
                          "tests": tests}) + "\n")
  return path


def tiny_code_config(workdir: str, task_path: str, overlap: bool, args):
  """configs/tiny.py's ORL stage on the code task, from a random model (its responses do not
  pass; `orl.min_reward=0` trains on every one, so each iteration updates)."""
  from configs import tiny
  c = tiny.get_config("orl")
  c.workdir = workdir
  c.model.init_from, c.model.vocab_size = "", 260   # random, the byte-level tokenizer's ids
  c.task.name, c.task.path, c.task.prompt_len = "jsonl", task_path, 64
  c.task.verify_workers = args.a_workers
  c.decode.gen_length = args.a_gen_length
  c.orl.min_reward, c.orl.group_size = 0.0, args.a_group
  c.orl.rollout_chunks, c.orl.chunk_by = args.a_chunks, "samples"
  c.orl.verify_while_decoding = overlap
  c.train.steps, c.train.log_every, c.checkpoint.every = args.a_iterations, 1, 0
  c.train.warmup_steps = 1
  return c


def run_tiny(workdir: str, task_path: str, overlap: bool, args) -> tuple[dict, list[dict]]:
  """(final parameters, metrics rows) of one tiny ORL run."""
  from safetensors.numpy import load_file
  from orl_jax.metrics import read_jsonl
  from orl_jax.train.entry import train
  out = train(tiny_code_config(workdir, task_path, overlap, args), progress=False)
  return (load_file(os.path.join(out, "params.safetensors")),
          read_jsonl(os.path.join(workdir, "metrics.jsonl")))


def same_params(a: dict, b: dict) -> bool:
  import numpy as np
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


PHASES = ("sec_iteration", "sec_rollout", "sec_verify_exposed", "sec_verify_host", "sec_plan",
          "sec_gather", "sec_update", "device_busy")


def phase_medians(rows: list[dict]) -> dict:
  """Median of each phase time over `rows` (the runs' iterations after their first, which
  compiles)."""
  return {k: statistics.median(r[k] for r in rows) for k in PHASES}


def part_a(args) -> float:
  """Serial against overlapped verification of the tiny ORL iteration on a code task: the
  wall time saved, as a share of the serial loop's verification time; the same parameters."""
  import tempfile
  root = tempfile.mkdtemp(prefix="iteration_overlap_")
  task = tiny_code_file(os.path.join(root, "code.jsonl"))
  runs: dict = {"serial": [], "overlapped": []}
  for r in range(args.a_rounds):
    for overlap in (False, True):
      name = "overlapped" if overlap else "serial"
      print(f"tiny ORL on a code task, {name} (round {r + 1} of {args.a_rounds}): "
            f"{args.a_iterations} iterations, {args.a_chunks} chunks by samples", flush=True)
      runs[name].append(run_tiny(os.path.join(root, f"{name}_{r}"), task, overlap, args))
  serial, overlapped = (phase_medians([row for _, rows in runs[k] for row in rows[1:]])
                        for k in ("serial", "overlapped"))
  saved = serial["sec_iteration"] - overlapped["sec_iteration"]
  share = saved / serial["sec_verify_exposed"]
  identical = all(same_params(runs["serial"][0][0], params)
                  for params, _ in runs["serial"] + runs["overlapped"])
  print("\n| loop | iteration | rollout | verification exposed | verification calls | plan | "
        "gather | update | device busy |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name, m in (("serial", serial), ("overlapped", overlapped)):
    print(f"| {name} | {m['sec_iteration']:.2f} | {m['sec_rollout']:.2f} | "
          f"{m['sec_verify_exposed']:.2f} | {m['sec_verify_host']:.2f} | {m['sec_plan']:.3f} | "
          f"{m['sec_gather']:.3f} | {m['sec_update']:.3f} | {m['device_busy']:.0%} |")
  hidden = 1 - overlapped["sec_verify_exposed"] / serial["sec_verify_exposed"]
  slower = overlapped["sec_rollout"] / serial["sec_rollout"] - 1
  print(f"saved {saved:.2f} s an iteration = {share:.0%} of the serial verification time "
        f"(floor 80%); verification hidden behind decoding: {hidden:.0%}; decoding "
        f"{slower:+.0%} beside the verifier (the host's cores are the device's here); final "
        f"parameters identical: {identical}")
  result = {"serial": serial, "overlapped": overlapped, "saved_s": saved,
            "saved_share_of_serial_verification": share, "same_parameters": identical,
            "verification_hidden_share": hidden, "rollout_slowdown": slower,
            "rows": {k: [rows for _, rows in v] for k, v in runs.items()},
            "iterations": args.a_iterations, "rounds": args.a_rounds,
            "device_threads": args.a_device_threads,
            "chunks": args.a_chunks, "group_size": args.a_group,
            "gen_length": args.a_gen_length,
            "verify_workers": args.a_workers, "host_cpus": os.cpu_count(),
            "load_average": os.getloadavg()}
  _common.write_json(args.out_a, result)
  print(f"wrote {args.out_a}")
  if not identical:
    sys.exit("iteration_overlap.py: the serial and overlapped runs ended with different "
             "parameters")
  return share


PARTS = {"a": part_a, "b": part_b}


def set_device_threads(threads: int) -> None:
  """Caps XLA's CPU threads (before JAX starts): on a CPU-only host the "device" that decodes
  and the host that verifies share the cores; one XLA thread leaves the others to the
  verifier, as an accelerator leaves a host's cores to it. 0: XLA's default (all cores)."""
  if threads:
    if threads != 1:
      sys.exit("--a-device-threads: 0 (XLA's default) or 1")
    flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flags).strip()


HEADLINES = {"a": "iteration_overlap_tiny_saved_share_of_verification",
             "b": "iteration_overlap_worst_idle_fraction_sample_isolation"}


def main(argv=None) -> None:
  args = parse_args(argv)
  if "a" in args.part or args.part == "all":
    set_device_threads(args.a_device_threads)
  if args.cpu_s is None:
    from orl_jax.config.sections import Task
    args.cpu_s = Task.verify_cpu_s
  wanted = ("a", "b") if args.part == "all" else (args.part,)
  figures = {part: PARTS[part](args) for part in wanted}
  for part in wanted:   # the headline (part b's with --part all) last
    print(f"{HEADLINES[part]}: {figures[part]:.3f}")

if __name__ == "__main__":
  main()
