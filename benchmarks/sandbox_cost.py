"""Where one sandboxed sample's CPU goes (docs/verifier.md#verifier-throughput).

Runs `orl_sandbox.run_judged` on the canonical solutions of HumanEval/0 to /N-1 (honest samples
that pass), one at a time, and measures the CPU of the processes each run starts (user +
system): R's rusage, which covers the judge children and the supervisor it reaps (which reaps
the sample). An R forked by the runner fork server F is F's child, so its CPU is read from the
run (`SandboxResult.runner_cpu_s`, from F's reaping) and F's own CPU (its forks and reaps, from
/proc in clock ticks) is added as its mean per sample; an R started as a fresh interpreter (a
revision without F) is this process's child, read from the children's rusage. Median over
`--repeats` rounds. The stages it can isolate:

* `interpreter`: `python -I -S -c pass`, spawned as a launcher without F spawns R;
* `runner_imports`: the same interpreter loading `runner.py` with its siblings (`wire`,
  `syscalls`, `judge`) and `ctypes`, minus `interpreter` (F pays both once per process);
* `judge_children`: the two contained judge children (collection, replay) with R's own CPU,
  as each run reports it (`SandboxResult.judge_cpu_s`);
* `fork_server_self`: F's own CPU per run (0 without F);
* `run_python_tree`: `run_python("pass")` (R, supervisor, sample; namespaces, private root,
  Landlock, seccomp, no judge), minus the interpreter and imports where R was not forked: the
  contained tree's set-up;
* `launcher_self`: this process's own CPU per judged run (cgroups, files, teardown; not in
  `total`).

`--baseline REF` measures the sandbox of a git revision (`orl_sandbox/` as of REF, extracted to a
temporary directory) beside the working tree's, alternating rounds, each in its own process.

  python benchmarks/sandbox_cost.py [--samples 32] [--repeats 3] [--baseline REF]

The last line is `sandbox_cpu_ms_per_sample: X` (the default path); JSON goes to
benchmarks/results/sandbox_cost.json.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "sandbox_cost.json")
if "--sandbox-root" in sys.argv:   # a measuring process: that revision's sandbox first
  sys.path.insert(0, sys.argv[sys.argv.index("--sandbox-root") + 1])
sys.path.insert(1, ROOT)

import orl_sandbox as sandbox  # noqa: E402
from orl_jax.data.humaneval import load_humaneval  # noqa: E402
from orl_sandbox import launcher  # noqa: E402

_IMPORTS = ("import importlib.util as u, sys\n"
            "s = u.spec_from_file_location('r', sys.argv[1]); m = u.module_from_spec(s)\n"
            "s.loader.exec_module(m); m._sibling('judge'); m._libc()\n")


def _cpu(who: int) -> float:
  usage = resource.getrusage(who)
  return usage.ru_utime + usage.ru_stime


def _forked(limits) -> bool:
  """Whether runs start R from the fork server (a revision without one never does)."""
  try:
    from orl_sandbox import forkserver  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  return bool(getattr(limits, "fork_server", False)) and forkserver.available()


def _fork_server_cpu() -> float:
  """CPU seconds the fork servers of this process used themselves (not their children)."""
  from orl_sandbox import forkserver  # pylint: disable=import-outside-toplevel
  return forkserver.cpu_s(runners=False)


def _measured(forked: bool, fn, *args):
  """(the started processes' CPU s, own CPU s, fn's result) of one call: the children's rusage
  of this process, plus the runner tree's when the fork server reaped it (`forked`: R is then
  F's child, and its CPU is not in this process's children's rusage)."""
  children, own = _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF)
  result = fn(*args)
  started = _cpu(resource.RUSAGE_CHILDREN) - children
  if forked and isinstance(result, sandbox.SandboxResult):
    started += result.runner_cpu_s or 0.0
  return (started, _cpu(resource.RUSAGE_SELF) - own, result)


def _spawn(*args: str) -> None:
  subprocess.run([sys.executable, "-I", "-S", *args], check=True, stdin=subprocess.DEVNULL)


def _judged_round(problems, limits) -> dict[str, float]:
  """Per-sample medians over one pass of `problems` (ms); the fork server's own CPU (its forks
  and reaps) is added to the total as its mean per sample (it is read in clock ticks)."""
  rows = []
  forked = _forked(limits)
  server_before = _fork_server_cpu() if forked else 0.0
  for problem in problems:
    children, own, result = _measured(
        forked, sandbox.run_judged, problem.prompt + problem.target + "\n",
        problem.entry_point, problem.tests, problem.prompt, limits)
    if not result.passed:
      raise RuntimeError(f"{problem.problem_id}: canonical solution did not pass: "
                         f"{result.verdict} {result.detail} {result.infra_error}")
    rows.append((children, own, result.judge_cpu_s or 0.0))
  server = (_fork_server_cpu() - server_before) / len(problems) if forked else 0.0
  medians = {name: 1000 * statistics.median(row[i] for row in rows)
             for i, name in enumerate(("total", "launcher_self", "judge_children"))}
  medians["total"] += 1000 * server
  medians["fork_server_self"] = 1000 * server
  return medians


def _stage_round(count: int, limits) -> dict[str, float]:
  """Per-start medians (ms) of the bare interpreter, the runner's imports, run_python."""
  forked = _forked(limits)
  take = lambda fn, *a: 1000 * statistics.median(_measured(forked, fn, *a)[0]
                                                 for _ in range(count))
  interpreter = take(_spawn, "-c", "pass")
  imports = take(_spawn, "-c", _IMPORTS, launcher.RUNNER_PATH)
  tree = take(sandbox.run_python, "pass\n", limits)
  return {"interpreter": interpreter, "runner_imports": imports - interpreter,
          "run_python_tree": tree - (0.0 if forked else imports)}


def _median_rounds(rounds: list[dict[str, float]]) -> dict[str, float]:
  return {key: round(statistics.median(r[key] for r in rounds), 2) for key in rounds[0]}


def measure(samples: int) -> dict[str, float]:
  """One round in this process: per-sample and per-stage medians (ms)."""
  problems = load_humaneval()[:samples]
  limits = sandbox.SandboxLimits(timeout_s=10.0)
  first = problems[0]   # builds the memory image, warms the page cache
  sandbox.run_judged(first.prompt + first.target, first.entry_point, first.tests, first.prompt,
                     limits)
  return {**_judged_round(problems, limits), **_stage_round(8, limits)}


def _extract(ref: str, into: str) -> str:
  """`orl_sandbox/` as of git revision `ref`, under `into`."""
  archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "orl_sandbox"], check=True,
                           capture_output=True).stdout
  with tempfile.TemporaryFile() as f:
    f.write(archive)
    f.seek(0)
    with tarfile.open(fileobj=f) as tar:
      tar.extractall(into)
  return into


def _round(samples: int, sandbox_root: str) -> dict[str, float]:
  command = [sys.executable, os.path.abspath(__file__), "--measure", "--samples", str(samples),
             "--sandbox-root", sandbox_root]
  out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--samples", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--baseline", default="")
  parser.add_argument("--measure", action="store_true")
  parser.add_argument("--sandbox-root", default=ROOT)
  args = parser.parse_args()
  if args.measure:
    print(json.dumps(measure(args.samples)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    roots = {"current": ROOT}
    if args.baseline:
      roots[args.baseline] = _extract(args.baseline, tmp)
    rounds: dict[str, list] = {name: [] for name in roots}
    for _ in range(args.repeats):
      for name, root in roots.items():
        rounds[name].append(_round(args.samples, root))
  report = {"samples": args.samples, "repeats": args.repeats, "cores": os.cpu_count(),
            "load": round(os.getloadavg()[0], 2),
            "ms_per_sample": {name: _median_rounds(r) for name, r in rounds.items()}}
  for name, figures in report["ms_per_sample"].items():
    print(name, json.dumps(figures))
  if args.baseline:
    ratio = report["ms_per_sample"][args.baseline]["total"] / report["ms_per_sample"]["current"][
        "total"]
    report["ratio"] = round(ratio, 2)
    print(f"{args.baseline} / current: {ratio:.2f}x")
  os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
  with open(RESULTS, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(f"sandbox_cpu_ms_per_sample: {report['ms_per_sample']['current']['total']:.1f}")


if __name__ == "__main__":
  main()
