"""Run untrusted Python in a contained process tree (docs/verifier.md#threat-model).

Model completions are untrusted code. Nothing here executes them in the calling (JAX) process or
forks it: every run's R (the runner, below) is forked by a *fork server* F, a fresh interpreter
that this module starts once per process with `subprocess` (fork+exec in C, no Python
`preexec_fn`) running `runner.py` as its `__main__` (from its cached bytecode) and that only
imports and forks (`forkserver.py`); with `SandboxLimits(fork_server=False)` R itself is started
that way, per run. This module is the launcher.

Two entry points:

* `run_judged(candidate_source, entry_point, tests, prelude)` — for verdicts. The tests run in a
  *judge* process that the sample never shares; the sample process only defines the candidate
  function and answers calls to it. Arguments, results and exceptions cross the boundary as
  values of Python's and the standard library's value types, identity and in-place changes to
  arguments included (`wire`); anything else, an exception that is not an `Exception`, the
  sample exiting, or a malformed message fails the run. The verdict is written by the judge to
  a file the sample cannot see. So frame walking, tracing, monkeypatching, writing to inherited
  descriptors and objects with forged `__eq__` cannot change a verdict: the sample can only
  return data, which the judge rebuilds as real instances of those types. The sample learns
  nothing about its correctness while it runs (`judge.py`): the calls it answers are collected
  before it answers any, and the tests judge the stored answers only after its processes are
  dead. The judge runs under its own CPU and address-space limits (`judge_cpu_s`, by default
  a quarter of the timeout; `judge_memory_bytes`) and, where cgroups are writable, in its own
  cgroup (`judge-cgroup`: memory, one CPU); what it used is in
  `SandboxResult.judge_cpu_s/judge_peak_rss_bytes`. Replies are decoded with caps on bytes,
  values, depth, expanded size and hash collisions (`wire`).
* `run_python(source)` — runs a whole program; `passed` is "exited with status 0", which the
  program itself controls. Use it for containment, never to score untrusted code.

Process tree (F, R, I and P run `runner.py`; the launcher is the calling process):

  launcher ── F: fork server (one per process; forks R, reaps it when the launcher asks)
               └─ R: runner (root, host namespaces; moves bytes, writes the status file)
                   ├─ J1, J2: the judge's collection and replay (run's uid, private root and
                   │          namespaces, limits, Landlock, seccomp; run the tests, answer on
                   │          a pipe)
                   └─ I: supervisor, PID 1 of a new PID namespace (stays root inside the
                        │ sandbox)
                        └─ P: the sample (per-sample uid, limits, Landlock, seccomp)

Layers, each named in `SandboxResult.isolation` when it took effect on this machine:

* `judge-process` — tests and verdict live in R, never in P (run_judged only).
* `pidns` — I is PID 1 of a new PID namespace and is never the sample. When I exits or is killed
  the kernel kills every process of the namespace (`setsid`, double forks, ignored signals
  included). I dies with R (parent-death signal, set by a process that never changes uid, and a
  liveness pipe for the start-up race); R dies with its parent (F, which exits as soon as
  the launcher process has: its stdin ends) and on its own alarm. At the end of every run the
  launcher kills R's group, then every process left in the sample's cgroup, of the sample's
  uid, or whose command line names the run (R, I: a forked R writes the run's spec path over
  F's slot argument), and returns only when none is left (a uid that keeps a process is
  retired, never reused).
* `mountns`, `tmpfs-disk` — I builds a new root on a small tmpfs: read-only, nosuid bind mounts of
  `/usr`, `/lib*` and the interpreter's standard library only (its `site-packages` masked unless
  `site_packages=True`), `/dev/{null,full,random,urandom}` and `/tmp` (the working directory,
  `HOME`, `TMPDIR`; also `/dev/shm`): a tmpfs capped at
  `disk_bytes` and `max_inodes`, gone with the namespace. The sample's stdout and stderr are
  pipes that I reads, keeping `max_output_bytes` of each and closing them after
  `max_file_bytes`: no host file is ever open in the sample. It then `pivot_root`s and
  detaches the host tree. No host path is visible, so no pathname unix socket outside the
  sandbox is reachable (abstract sockets are per network namespace), and no dataset or test file.
  There is no `/proc` (its machine-wide files are counters other samples move) and no
  `/dev/zero` (a shared mapping of it draws an inode number from a machine-wide counter).
* `memory-image` — as root, the system files come from a copy in memory (`system_image.py`:
  the standard library and the shared libraries it loads, about 80 MiB on `/dev/shm`, built once
  per machine and interpreter), not from the host's disk: whether a file is in the page cache
  (the time a read takes) can carry nothing from one sample to the next.
* `netns`, `ipcns`, `utsns` — no network devices but a down loopback; private SysV/POSIX IPC.
* `cgroup-memory`, `cgroup-pids`, `cgroup-cpu` — a cgroup per sample (v2, or v1 controllers)
  caps the memory of all the sample's processes together, tmpfs pages included, at
  `total_memory_bytes + disk_bytes`, their number at `max_processes`, and their CPU bandwidth
  at `cpu_cores`.
* `uid:N` — as root, P runs as a uid reserved for this one run (a lock per uid; a uid still
  owning a process is never reused), so `RLIMIT_NPROC` counts this sample only and the uid's
  processes can be found and killed. Without root: `userns` (a user namespace; on Linux >= 5.14
  `RLIMIT_NPROC` is counted per user namespace) and `caps-dropped`. Without the private root
  (opted out), `cap-dac-read-search` marks that the sample kept that one capability so that it
  can read an interpreter installed under a private directory; Landlock then bounds its reads.
* `rlimits` — `RLIMIT_AS` (per process), `RLIMIT_CPU`, `RLIMIT_NPROC`, `RLIMIT_FSIZE`,
  `RLIMIT_NOFILE`, `RLIMIT_CORE`, `RLIMIT_MEMLOCK`, `RLIMIT_MSGQUEUE` and `RLIMIT_RTPRIO` 0,
  `RLIMIT_SIGPENDING` 64. Without `cgroup-memory`, total memory is bounded by
  `max_processes × memory_bytes` (+ `disk_bytes` of tmpfs).
* `no-new-privs`; `landlock-fs`/`-net`/`-scope` (Linux ≥ 5.13): reads below the bound paths,
  writes below `/tmp`, no TCP, no signals or abstract sockets outside; `seccomp`: an allowlist
  of the calls a Python function needs (`syscalls.py` lists what else is refused and why:
  machine-wide resources such as asynchronous I/O, key rings, SysV and POSIX IPC, huge pages;
  machine-wide counters such as pipe and pidfd inode numbers; the page cache; locks, watches and
  shared futexes on the read-only files every sample sees; sockets and new namespaces).

Scheduling (`orl_jax.verify.humaneval.PromptScheduler`, with `claim_exclusive` across processes):
two samples of one prompt never run at the same time, so what they share only while both run
(CPU and cache contention, counters that fall back when their holder exits) carries nothing;
a claim is released at the end of its sample's scheduling slot, not when the sample exits.

Essential layers (`ESSENTIAL_LAYERS`): without one of them the run is refused with
`SandboxUnavailableError` before any untrusted code runs, unless the caller opts out with
`SandboxLimits(require_isolation=False)` or `ORL_SANDBOX_ALLOW_WEAK_ISOLATION=1`.

A run the *infrastructure* failed (a spawn, a fork or a setup step failed, the host's disk was
too full for the run's records, the runner recorded no verdict) has `infra_error` set; callers
must not treat it as the sample's failure (the HumanEval verifier retries once and never caches
it). Cleanup (process reaping, cgroup removal, directory removal of any depth) never raises.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

from orl_sandbox import forkserver, runner, system_image
from orl_sandbox.runner import ESSENTIAL_LAYERS, missing_essentials  # noqa: F401

ALLOW_WEAK_ENV = "ORL_SANDBOX_ALLOW_WEAK_ISOLATION"
SHARED_UID = 65534   # `nobody`: only when no per-sample uid is free (not a per-sample layer)
RUNNER_PATH = os.path.abspath(runner.__file__)


# Runs the runner script as `__main__` from its cached bytecode (`python runner.py` would compile
# its source on every start: about 6 ms of CPU per sample).
_BOOT = ("import importlib.util as u, sys\n"
         "sys.argv = sys.argv[1:]\n"
         "s = u.spec_from_file_location('__main__', sys.argv[0])\n"
         "m = sys.modules['__main__'] = u.module_from_spec(s)\n"
         "s.loader.exec_module(m)\n")


class SandboxUnavailableError(RuntimeError):
  """This machine cannot provide the essential isolation layers; no untrusted code was run."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Resource limits of one sandboxed run.

  Attributes:
    timeout_s: wall-clock seconds (start-up included) before the whole process tree is killed.
    memory_bytes: `RLIMIT_AS` (virtual address space) of each process of the sample.
    total_memory_bytes: memory cgroup limit for all the sample's processes; None → memory_bytes.
      tmpfs pages are charged too, so the cgroup gets `total_memory_bytes + disk_bytes`.
    cpu_s: `RLIMIT_CPU` seconds; None → `ceil(timeout_s) + 1`.
    max_processes: processes and threads of the sample together (pids cgroup and
      `RLIMIT_NPROC` of its own uid).
    cpu_cores: CPU bandwidth of all the sample's processes together (cpu cgroup quota), so a
      busy sample cannot starve the others; None → no quota.
    max_file_bytes: `RLIMIT_FSIZE`: the largest file the code can write; also how much of
      stdout and of stderr is read before the pipe is closed.
    disk_bytes: size of the sample's tmpfs (`/tmp`, its working directory).
    max_inodes: files and directories the tmpfs can hold.
    max_output_bytes: how much of stdout and of stderr is kept in the result.
    max_open_files: `RLIMIT_NOFILE`.
    max_message_bytes: the largest judge/sample message (run_judged).
    max_reply_bytes: all the sample's replies together (run_judged); calls past it go
      unanswered and fail the sample.
    judge_cpu_s: CPU seconds of the judge process (run_judged); None -> a quarter of the
      timeout (at least 1).
    judge_memory_bytes: `RLIMIT_AS` of the judge process.
    site_packages: False runs the interpreter with `-S` and masks `site-packages` in the
      sandbox (stdlib only); True makes installed packages importable (and readable).
    require_isolation: refuse to run when an essential layer is missing (see module docstring).
    skip_layers: layers not to set up, to exercise the fallbacks and the refusal: any of
      "pidns", "mountns", "netns", "ipcns", "utsns", "cgroup", "uid", "landlock", "seccomp",
      "image" (the memory-resident copy of the system files, `system_image.py`).
    fork_server: start R by forking this process's runner fork server (`forkserver.py`:
      no interpreter start-up or imports per sample) rather than as a fresh interpreter; the
      sandbox below R is the same either way.
  """
  timeout_s: float = 10.0
  memory_bytes: int = 1 << 30
  total_memory_bytes: int | None = None
  cpu_s: int | None = None
  max_processes: int = 16
  cpu_cores: float | None = 1.0
  max_file_bytes: int = 16 << 20
  disk_bytes: int = 64 << 20
  max_inodes: int = 4096
  max_output_bytes: int = 16 << 10
  max_open_files: int = 256
  max_message_bytes: int = 8 << 20
  max_reply_bytes: int = 16 << 20
  judge_cpu_s: int | None = None
  judge_memory_bytes: int = 1 << 30
  site_packages: bool = False
  require_isolation: bool = True
  skip_layers: tuple[str, ...] = ()
  fork_server: bool = True


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """What one sandboxed run did.

  Attributes:
    passed: run_judged: the judge's tests passed; run_python: the program exited with status 0.
    timed_out: the wall-clock timeout fired and the process tree was killed, or a phase of
      the judge ran past its CPU limit (collecting the calls of tests that loop on an answer,
      or checking answers costly to decode or compare; `detail` says so).
    returncode: exit status of the sample process (negative = killed by that signal); None if
      unknown (timed out, or stopped by the judge).
    stdout: the first `max_output_bytes` of the sample's stdout, decoded with replacement.
    stderr: the same for stderr (tracebacks land here).
    isolation: names of the isolation layers that took effect (see module docstring).
    wall_s: seconds from launch to the end of cleanup.
    verdict: "pass", "fail" or "" (no verdict: timed out or infrastructure failure).
    detail: why the judge failed the sample (the test's exception, a protocol violation).
    infra_error: set when the sandbox itself failed; the score then says nothing about the
      sample and must not be cached.
    judge_cpu_s: CPU seconds the runner and judge process used (None if it reported nothing).
    judge_peak_rss_bytes: its peak resident memory since its exec (None where /proc is not
      readable).
    runner_cpu_s: CPU seconds of R and every process it waited for (the judge children, the
      supervisor and so the sample), from R's own reaping; None if it was not reaped.
  """
  passed: bool
  timed_out: bool
  returncode: int | None
  stdout: str
  stderr: str
  isolation: tuple[str, ...]
  wall_s: float
  verdict: str = ""
  detail: str = ""
  infra_error: str | None = None
  judge_cpu_s: float | None = None
  judge_peak_rss_bytes: int | None = None
  runner_cpu_s: float | None = None


def run_python(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
  """Runs `source` as `__main__` in the sandbox; `passed` = it exited with status 0.

  The program decides its own exit status, so this is no verdict on untrusted code (use
  `run_judged`). Safe to call from many threads at once.
  """
  return _launch({"mode": "program", "program": source}, None, limits)


def run_judged(candidate_source: str, entry_point: str, tests: str, prelude: str = "",
               limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
  """Runs `tests` (which define `check(candidate)`) in a judge process against the function
  `entry_point` defined by `candidate_source`, which runs in the sandbox.

  The judge executes `prelude` (errors ignored; e.g. the problem prompt, whose helper functions
  tests may call), then `tests`, then `check(candidate)` where `candidate` is a proxy that sends
  its arguments to the sample and returns its answer, both as plain data (`wire`).
  """
  return _launch({"mode": "judged", "program": candidate_source, "entry_point": entry_point},
                 {"prelude": prelude, "tests": tests}, limits)


def probe_isolation(limits: SandboxLimits = SandboxLimits(timeout_s=30.0)) -> tuple[str, ...]:
  """Names the isolation layers this machine grants (runs one trivial program)."""
  return run_python("pass\n", dataclasses.replace(limits, require_isolation=False)).isolation


def isolation_required(limits: SandboxLimits) -> bool:
  weak = os.environ.get(ALLOW_WEAK_ENV, "").strip().lower() in ("1", "true", "yes")
  return limits.require_isolation and not weak


# --------------------------------------------------------------------------------------------
# Launcher: runs in the calling process (from any thread). Never forks it without exec.
# --------------------------------------------------------------------------------------------

_COUNTER = itertools.count()


def _log(message: str) -> None:
  try:
    print(f"orl_sandbox: {message}", file=sys.stderr)
  except Exception:  # pylint: disable=broad-except
    pass


def judge_cpu_s(limits: SandboxLimits) -> int:
  """The judge's CPU seconds: a quarter of the wall timeout by default, so that a reply that
  keeps the judge busy fails on the judge's limit (counted, cached) rather than by the timeout,
  also on a loaded machine (the judge decodes about 75,000 containers a second)."""
  cpu_s = int(limits.cpu_s or int(limits.timeout_s + 0.999) + 1)
  return int(limits.judge_cpu_s or max(1, min(cpu_s, int(limits.timeout_s // 4))))


def _runner_settings(limits: SandboxLimits, paths: dict, uid, as_root: bool, has_judge: bool,
                     cgroups) -> dict:
  """The runner's part of its spec file: where it works, which uid and cgroups, its limits."""
  cpu_s = int(limits.cpu_s or int(limits.timeout_s + 0.999) + 1)
  cgroup, judge_cgroup = cgroups
  return {
      "timeout_s": float(limits.timeout_s),
      "uid": uid if uid is not None else (SHARED_UID if as_root else None),
      "per_sample_uid": uid is not None,
      "root_dir": paths["root"],
      "host_work_dir": paths["work"],
      "status": paths["status"],
      "judge_file": paths["judge.json"] if has_judge else None,
      "cgroup_procs": cgroup.procs_files() if cgroup else [],
      "judge_cgroup_procs": judge_cgroup.procs_files() if judge_cgroup else [],
      "memory_bytes": int(limits.memory_bytes),
      "cpu_s": cpu_s,
      "max_processes": int(limits.max_processes),
      "max_file_bytes": int(limits.max_file_bytes),
      "max_open_files": int(limits.max_open_files),
      "disk_bytes": int(limits.disk_bytes),
      "max_inodes": int(limits.max_inodes),
      "max_message_bytes": int(limits.max_message_bytes),
      "max_reply_bytes": int(limits.max_reply_bytes),
      "max_output_bytes": int(limits.max_output_bytes),
      "judge_cpu_s": judge_cpu_s(limits),
      "judge_memory_bytes": int(limits.judge_memory_bytes),
      "site_packages": bool(limits.site_packages),
      "image": (system_image.image() if as_root and not limits.site_packages
                and "image" not in limits.skip_layers and "mountns" not in limits.skip_layers
                else None),
      "require_isolation": isolation_required(limits),
      "skip_layers": sorted(set(limits.skip_layers)),
  }


def _launch(spec: dict, judge: dict | None, limits: SandboxLimits) -> SandboxResult:
  start = time.monotonic()
  as_root = os.geteuid() == 0
  skip = set(limits.skip_layers)
  base_dir = tempfile.mkdtemp(prefix="orl_sandbox_")
  paths = {name: os.path.join(base_dir, name)
           for name in ("spec.json", "judge.json", "status", "runner.log", "stdout", "stderr",
                        "root", "work")}
  uid = proc = None
  cgroups = [None, None]   # the sample's, the judge's
  timed_out = False
  infra = None
  try:
    try:
      os.chmod(base_dir, 0o711 if as_root else 0o700)   # the sample's uid may reach work/
      os.mkdir(paths["work"], 0o700)
      os.mkdir(paths["root"], 0o755)
      if as_root and "uid" not in skip:
        uid = _SLOTS.acquire()
        if uid is None:
          _log("no free per-sample uid: the sample runs as the shared uid 65534")
      if "cgroup" not in skip:
        name = f"orl_sandbox_{os.getpid()}_{next(_COUNTER)}_{os.urandom(4).hex()}"
        cgroups[0] = _Cgroup.create(name, limits)
        if judge is not None:
          cgroups[1] = _Cgroup.create(name + "_judge", limits, judge=True)
      spec.update(_runner_settings(limits, paths, uid, as_root, judge is not None, cgroups))
      _write_private(paths["spec.json"], json.dumps(spec))
      if judge is not None:
        _write_private(paths["judge.json"], json.dumps(judge))
      _write_private(paths["status"], "")
      proc = _start_runner(paths, base_dir, limits)
      timed_out = not _wait_unreaped(proc.pid, start + limits.timeout_s - time.monotonic())
    except OSError as error:   # spawn or set-up failed: the machine's fault, not the sample's
      infra = f"launch failed: {error!r}"
    finally:
      survivors = _teardown(proc, uid, cgroups, paths["spec.json"])
    status = _parse_status(_read_text(paths["status"], 1 << 20))
    stdout = _read_text(paths["stdout"], limits.max_output_bytes)
    stderr = _read_text(paths["stderr"], limits.max_output_bytes)
    runner_log = _read_text(paths["runner.log"], 8192)
  finally:
    remove_tree(base_dir)
  if status["refused"]:
    raise SandboxUnavailableError(
        "Refusing to run untrusted code: this machine does not provide "
        + "; ".join(status["refused"]) + f" (active layers: {status['layers']}). Run as root on "
        "Linux with namespaces and cgroups available, or opt out explicitly with "
        f"SandboxLimits(require_isolation=False) or {ALLOW_WEAK_ENV}=1.")
  if infra is None and status["infra"]:
    infra = "; ".join(status["infra"])
  if infra is None and status["timeout"]:   # the judge's own CPU limit, while collecting
    timed_out, status["detail"] = True, status["timeout"]
  if infra is None and not timed_out:
    infra = _runner_failure(status, proc, spec.get("judge_cpu_s"), runner_log)
  if survivors:
    _log(f"{survivors} process(es) of a sample could not be killed; their uid is retired")
  verdict = status["verdict"] if not (timed_out or infra) else ""
  return SandboxResult(passed=verdict == "pass", timed_out=timed_out,
                       returncode=status["exit"], stdout=stdout, stderr=stderr,
                       isolation=tuple(status["layers"]), wall_s=time.monotonic() - start,
                       verdict=verdict, detail=status["detail"], infra_error=infra,
                       judge_cpu_s=status["judge_cpu_s"],
                       judge_peak_rss_bytes=status["judge_peak_rss_bytes"],
                       runner_cpu_s=getattr(proc, "cpu_s", None))


def _start_runner(paths: dict, base_dir: str, limits: SandboxLimits):
  """Starts R on the run's spec: forked by this process's fork server (`forkserver.py`), or as
  a fresh interpreter (`fork_server=False`, or a machine without pidfds)."""
  command = [sys.executable, "-I"] + ([] if limits.site_packages else ["-S"])
  command += ["-c", _BOOT, RUNNER_PATH]
  env = _scrubbed_env(paths["work"])
  if (limits.fork_server and forkserver.available()
      and len(paths["spec.json"].encode()) < runner.FORK_SERVER_SLOT):
    for name in ("stdout", "stderr"):
      with open(paths[name], "wb"):
        pass
    server = forkserver.server_for(command, _scrubbed_env("/"))
    return server.start(paths["spec.json"], base_dir, env, paths["stdout"], paths["stderr"])
  with open(paths["stdout"], "wb") as out, open(paths["stderr"], "wb") as err:
    return subprocess.Popen(command + [paths["spec.json"]], cwd=base_dir, env=env,
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True,
                            start_new_session=True)


def _runner_failure(status: dict, proc, judge_cpu_s, runner_log: str) -> str | None:
  """Why a runner that was not timed out gave no verdict (an infrastructure failure), or None.
  A judge killed by its own CPU limit while it checked the answers (a long computation in C,
  where its SIGXCPU handler cannot run) failed the sample: that verdict is set here."""
  returncode = proc.returncode if proc is not None else None
  runner_cpu = getattr(proc, "cpu_s", None)
  if (returncode is not None and returncode < 0 and status["judging"] and not status["verdict"]
      and judge_cpu_s and runner_cpu is not None and runner_cpu >= 0.9 * judge_cpu_s):
    status["verdict"] = "fail"
    status["detail"] = "the judge's CPU limit ran out while checking the sample's answers"
    status["judge_cpu_s"] = runner_cpu
    return None
  if returncode != 0:
    return f"sandbox runner exited with status {returncode}: {runner_log[-2000:]}"
  if not status["verdict"]:
    return f"the sandbox runner recorded no verdict: {runner_log[-2000:]}"
  return None


def _parse_status(text: str) -> dict:
  """Reads R's status file: one record per "\\n"-terminated line (R flattens every other line
  separator); the first verdict counts and must be exactly "pass" or "fail"."""
  status = {"layers": [], "infra": [], "refused": [], "verdict": "", "detail": "", "exit": None,
            "judging": False, "timeout": "",
            "judge_cpu_s": None, "judge_peak_rss_bytes": None}
  for line in text.split("\n"):
    key, _, value = line.partition(":")
    if key == "layer":
      if value not in status["layers"]:
        status["layers"].append(value)
    elif key in ("infra", "refused"):
      status[key].append(value)
    elif key == "verdict" and not status["verdict"]:
      status["verdict"] = value if value in ("pass", "fail", "unsupported") else "fail"
    elif key == "judging":
      status["judging"] = True
    elif key == "timeout" and not status["timeout"]:
      status["timeout"] = value
    elif key == "detail" and not status["detail"]:
      status["detail"] = value
    elif key == "judge" and status["judge_cpu_s"] is None:
      try:
        cpu, rss = value.split(":")
        status["judge_cpu_s"] = float(cpu)
        status["judge_peak_rss_bytes"] = int(rss) if int(rss) >= 0 else None
      except ValueError:
        pass
    elif key == "exit" and status["exit"] is None:
      try:
        status["exit"] = int(value)
      except ValueError:
        pass
  return status


def _wait_unreaped(pid: int, timeout: float) -> bool:
  """Waits until `pid` (a child) exits, without reaping it. False on timeout."""
  try:
    pidfd = os.pidfd_open(pid)
  except (AttributeError, OSError):
    pidfd = None
  deadline = time.monotonic() + max(timeout, 0.0)
  try:
    while True:
      left = deadline - time.monotonic()
      if pidfd is not None:
        if select.select([pidfd], [], [], max(left, 0.0))[0]:
          return True
        if left <= 0:
          return False
        continue
      if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
        return True
      if left <= 0:
        return False
      time.sleep(min(0.01, left))
  finally:
    if pidfd is not None:
      os.close(pidfd)


def _teardown(proc, uid, cgroups, token: str) -> int:
  """Kills everything the run started and releases its uid and cgroup. Never raises.

  `token` (the spec path) is on the command line of R and I. Returns the number of processes
  that could not be killed (0 when all are gone)."""
  survivors = 0
  try:
    if proc is not None:
      # R is not reaped yet, so its process group id cannot have been reused.
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
      if isinstance(proc, forkserver.ForkedRunner):   # F's child: F reaps it once it is dead
        try:   # (R itself too, in case it had not yet made its own session)
          os.kill(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
          pass
        _wait_unreaped(proc.pid, 60.0)
        proc.reap()
      else:
        try:   # reaps R with its CPU time (see `_runner_failure`)
          _, wait_status, usage = os.wait4(proc.pid, 0)
          proc.returncode = os.waitstatus_to_exitcode(wait_status)
          proc.cpu_s = usage.ru_utime + usage.ru_stime
        except ChildProcessError:
          proc.wait()
    deadline = time.monotonic() + 10.0
    while True:
      left = _kill_cmdline(token.encode()) if proc is not None else []
      for cgroup in cgroups:
        if cgroup is not None:
          left += cgroup.kill_all()
      if uid is not None:
        left += _kill_uid(uid)
      if not left or time.monotonic() > deadline:
        survivors = len(set(left))
        break
      time.sleep(0.005)
  except Exception as error:  # pylint: disable=broad-except
    _log(f"cleanup failed: {error!r}")
    survivors = max(survivors, 1)
  for cgroup in cgroups:
    if cgroup is not None:
      cgroup.remove()
  if uid is not None:
    _SLOTS.release(uid, clean=survivors == 0)
  return survivors


def _scrubbed_env(work_dir: str) -> dict[str, str]:
  """A minimal environment: nothing secret from the parent survives."""
  return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
          "HOME": work_dir, "TMPDIR": work_dir, "PYTHONDONTWRITEBYTECODE": "1"}


def _write_private(path: str, text: str) -> None:
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(text)


def _read_text(path: str, max_bytes: int) -> str:
  try:
    with open(path, "rb") as f:
      return f.read(max_bytes).decode("utf-8", errors="replace")
  except OSError:
    return ""


def _signal_if(pid: int, belongs) -> None:
  """SIGKILLs `pid` if `belongs(pid)` still holds once the process is pinned by a pidfd (so a
  recycled pid is never signalled)."""
  try:
    pidfd = os.pidfd_open(pid)
  except OSError:
    return
  try:
    if belongs(pid):
      signal.pidfd_send_signal(pidfd, signal.SIGKILL)
  except OSError:
    pass
  finally:
    os.close(pidfd)


def _real_uid(pid) -> int | None:
  try:
    with open(f"/proc/{pid}/status", "rb") as f:
      for line in f:
        if line.startswith(b"Uid:"):
          return int(line.split()[1])
  except (OSError, ValueError, IndexError):
    pass
  return None


def _pids_of_uid(uid: int) -> list[int]:
  pids = []
  try:
    names = os.listdir("/proc")
  except OSError:
    return pids
  for name in names:
    if name.isdigit() and _real_uid(name) == uid:
      pids.append(int(name))
  return pids


CMDLINE_PREFIX_BYTES = 4096   # R's and I's command lines name the run within their first bytes


def _cmdline_has(pid, token: bytes) -> bool:
  """Whether the first `CMDLINE_PREFIX_BYTES` of `pid`'s command line contain `token`: any
  process's command line may be megabytes, and teardown reads every process's."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return token in f.read(CMDLINE_PREFIX_BYTES)
  except OSError:
    return False


def _kill_cmdline(token: bytes) -> list[int]:
  """SIGKILLs every process whose command line contains `token`; returns those found."""
  try:
    pids = [int(name) for name in os.listdir("/proc")
            if name.isdigit() and _cmdline_has(name, token)]
  except OSError:
    return []
  for pid in pids:
    _signal_if(pid, lambda p: _cmdline_has(p, token))
  return pids


def _kill_uid(uid: int) -> list[int]:
  """SIGKILLs every process whose real uid is `uid`; returns those that existed (zombies too)."""
  pids = _pids_of_uid(uid)
  for pid in pids:
    _signal_if(pid, lambda p: _real_uid(p) == uid)
  return pids


class _UidSlots:
  """Per-sample uids for a root launcher: one uid per concurrent run, on this whole machine.

  A uid is held by an exclusive `flock` on a file in a root-only directory, so concurrent
  launchers (threads or processes) never share one. A uid that still owns a process when its
  run ends is retired (its lock is kept) rather than reused.
  """
  BASE = 1_790_000_000
  COUNT = 1024

  def __init__(self):
    self._lock = threading.Lock()
    self._held: dict[int, int] = {}
    self._clean: set[int] = set()   # released by this process with no process left
    self._candidates: list[int] | None = None

  def _candidate_uids(self) -> list[int]:
    if self._candidates is None:
      ranges = []
      try:
        with open("/proc/self/uid_map", encoding="ascii") as f:
          for line in f:
            inside, _, count = (int(x) for x in line.split())
            ranges.append((inside, inside + count))
      except (OSError, ValueError):
        ranges = [(0, 1 << 32)]
      known = set()
      try:
        with open("/etc/passwd", encoding="utf-8", errors="replace") as f:
          known = {int(line.split(":")[2]) for line in f if line.count(":") >= 3
                   and line.split(":")[2].isdigit()}
      except OSError:
        pass
      if any(lo <= self.BASE and self.BASE + self.COUNT <= hi for lo, hi in ranges):
        uids = range(self.BASE, self.BASE + self.COUNT)
      else:   # a container with a small id map: take the top of its largest range
        lo, hi = max(ranges, key=lambda r: r[1] - r[0])
        top = min(hi, 65534)
        uids = range(max(lo + 1000, top - self.COUNT), top)
      self._candidates = [u for u in uids if u not in known and u not in (65534, 65535)]
    return self._candidates

  @staticmethod
  def _lock_dir() -> str | None:
    for parent in ("/run", tempfile.gettempdir()):
      path = os.path.join(parent, "orl_sandbox_uids")
      try:
        os.mkdir(path, 0o700)
      except FileExistsError:
        pass
      except OSError:
        continue
      try:
        info = os.lstat(path)
      except OSError:
        continue
      if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077:
        return path
    return None

  def acquire(self) -> int | None:
    import fcntl  # pylint: disable=import-outside-toplevel
    directory = self._lock_dir()
    candidates = self._candidate_uids()
    if directory is None or not candidates:
      return None
    offset = int.from_bytes(os.urandom(4), "little") % len(candidates)
    for i in range(len(candidates)):
      uid = candidates[(offset + i) % len(candidates)]
      with self._lock:
        if uid in self._held:
          continue
        try:
          fd = os.open(os.path.join(directory, f"{uid}.lock"),
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
          continue
        try:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
          os.close(fd)
          continue
        self._held[uid] = fd
        if uid in self._clean:
          return uid
      # Unlocked but still owning processes: left by a launcher that died. Kill, then verify.
      deadline = time.monotonic() + 1.0
      while _kill_uid(uid) and time.monotonic() < deadline:
        time.sleep(0.01)
      if not _pids_of_uid(uid):
        return uid
      self.release(uid, clean=False)
    return None

  def release(self, uid: int, clean: bool) -> None:
    with self._lock:
      fd = self._held.pop(uid, None) if clean else None
      if clean:
        self._clean.add(uid)
      else:
        self._clean.discard(uid)
    if fd is not None:
      try:
        os.close(fd)   # drops the flock
      except OSError:
        pass


_SLOTS = _UidSlots()
_EXCLUSIVE_BUCKETS = 4096


def claim_exclusive(key: str) -> int | None:
  """Claims `key` for this process on this whole machine (an exclusive `flock`, without
  waiting, on one of `_EXCLUSIVE_BUCKETS` lock files that keys share by hash). Returns the
  descriptor to pass to `release_exclusive`, -1 when this machine offers no lock directory
  (the claim then holds in this process only), or None when another process holds it."""
  import fcntl  # pylint: disable=import-outside-toplevel
  import hashlib  # pylint: disable=import-outside-toplevel
  directory = _UidSlots._lock_dir()  # pylint: disable=protected-access
  if directory is None:
    return -1
  bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:4],
                          "little") % _EXCLUSIVE_BUCKETS
  try:
    fd = os.open(os.path.join(directory, f"exclusive_{bucket}.lock"),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
  except OSError:
    return -1
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    return None
  return fd


def release_exclusive(fd: int | None) -> None:
  if fd is not None and fd >= 0:
    try:
      os.close(fd)   # drops the flock
    except OSError:
      pass


class _Cgroup:
  """A memory + pids cgroup for one sample (cgroup v2, else the v1 controllers), if writable."""

  _hierarchy: dict | None = None
  _hierarchy_lock = threading.Lock()

  def __init__(self):
    self.dirs: list[tuple[str, str]] = []   # (layer name, directory)

  @classmethod
  def _parents(cls) -> dict:
    """{controller: (version, dir)} of this process's own cgroups, for memory, pids, cpu."""
    with cls._hierarchy_lock:
      if cls._hierarchy is not None:
        return cls._hierarchy
      found = {}
      try:
        own = {}
        with open("/proc/self/cgroup", encoding="utf-8") as f:
          for line in f:
            hid, controllers, path = line.rstrip("\n").split(":", 2)
            for name in (controllers.split(",") if hid != "0" else ["<v2>"]):
              own[name] = path
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
          mounts = []
          for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            mounts.append((tail[0], fields[3], fields[4], set(tail[2].split(","))))
        for fstype, root, mount_point, _options in mounts:
          if fstype == "cgroup2" and "<v2>" in own:
            path = own["<v2>"]
            rel = path[len(root):] if root != "/" and path.startswith(root) else path
            directory = mount_point + rel.rstrip("/")
            try:
              with open(os.path.join(directory, "cgroup.subtree_control"), encoding="ascii") as f:
                enabled = set(f.read().split())
            except OSError:
              enabled = set()
            for controller in ("memory", "pids", "cpu"):
              if controller in enabled:
                found[controller] = ("v2", directory)
        for fstype, root, mount_point, options in mounts:
          if fstype != "cgroup":
            continue
          for controller in ("memory", "pids", "cpu"):
            if controller in options and controller in own and controller not in found:
              path = own[controller]
              rel = path[len(root):] if root != "/" and path.startswith(root) else path
              found[controller] = ("v1", mount_point + rel.rstrip("/"))
      except (OSError, ValueError, IndexError):
        pass
      cls._hierarchy = found
      return found

  @classmethod
  def create(cls, name: str, limits: SandboxLimits, judge: bool = False) -> _Cgroup | None:
    """A cgroup for a sample (memory, pids, CPU), or for a judge (memory, one CPU)."""
    total = int(limits.total_memory_bytes or limits.memory_bytes) + int(limits.disk_bytes)
    quota = max(1000, int(float(limits.cpu_cores or 0) * 100_000))
    if judge:   # the judge's address-space limit, and its supervisor child's few MiB
      total, quota = int(limits.judge_memory_bytes) + (64 << 20), 100_000
    settings = {
        ("memory", "v1"): [("memory.limit_in_bytes", total),
                           ("memory.memsw.limit_in_bytes", total)],
        ("memory", "v2"): [("memory.max", total), ("memory.swap.max", 0)],
        ("pids", "v1"): [("pids.max", int(limits.max_processes))],
        ("pids", "v2"): [("pids.max", int(limits.max_processes))],
        ("cpu", "v1"): [("cpu.cfs_period_us", 100_000), ("cpu.cfs_quota_us", quota)],
        ("cpu", "v2"): [("cpu.max", f"{quota} 100000")],
    }
    optional = ("memory.memsw.limit_in_bytes", "memory.swap.max")
    by_parent: dict[tuple[str, str], list[str]] = {}
    for controller, (version, parent) in sorted(cls._parents().items()):
      if (controller == "cpu" and not limits.cpu_cores and not judge) or (
          controller == "pids" and judge):
        continue
      by_parent.setdefault((version, parent), []).append(controller)
    group = cls()
    for (version, parent), controllers in by_parent.items():
      directory = os.path.join(parent, name)
      try:
        os.mkdir(directory)
      except OSError:
        continue
      try:
        for controller in controllers:
          for file_name, value in settings[(controller, version)]:
            target = os.path.join(directory, file_name)
            if file_name in optional and not os.path.exists(target):
              continue
            with open(target, "w", encoding="ascii") as f:
              f.write(str(value))
      except OSError:
        _rmdir_quiet(directory)
        continue
      group.dirs += [(f"cgroup-{controller}", directory) for controller in controllers]
    return group if group.dirs else None

  def procs_files(self) -> list[list[str]]:
    """[cgroup.procs path, comma-separated layer names] per directory."""
    by_dir: dict[str, list[str]] = {}
    for layer, directory in self.dirs:
      by_dir.setdefault(directory, []).append(layer)
    return [[os.path.join(d, "cgroup.procs"), ",".join(names)] for d, names in by_dir.items()]

  def _members(self) -> list[int]:
    pids = set()
    for _, directory in self.dirs:
      try:
        with open(os.path.join(directory, "cgroup.procs"), encoding="ascii") as f:
          pids.update(int(x) for x in f.read().split())
      except (OSError, ValueError):
        pass
    return sorted(pids)

  def kill_all(self) -> list[int]:
    """SIGKILLs every process in the cgroup; returns those that were there."""
    pids = self._members()
    for _, directory in self.dirs:
      kill_file = os.path.join(directory, "cgroup.kill")
      if pids and os.path.exists(kill_file):
        try:
          with open(kill_file, "w", encoding="ascii") as f:
            f.write("1")
        except OSError:
          pass
    for pid in pids:
      _signal_if(pid, self._contains)
    return pids

  def _contains(self, pid: int) -> bool:
    try:
      with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
        text = f.read()
    except OSError:
      return False
    leaf = "/" + os.path.basename(self.dirs[0][1])
    return any(line.endswith(leaf) for line in text.splitlines())

  def remove(self) -> None:
    deadline = time.monotonic() + 5.0
    for directory in dict.fromkeys(d for _, d in self.dirs):
      while not _rmdir_quiet(directory) and time.monotonic() < deadline:
        time.sleep(0.01)


def _rmdir_quiet(path: str) -> bool:
  try:
    os.rmdir(path)
    return True
  except FileNotFoundError:
    return True
  except OSError:
    return False


def remove_tree(path: str) -> bool:
  """Deletes `path` and everything below it, at any depth, never following symlinks.

  Iterative and relative to directory descriptors (no recursion, no path length limit); gives
  up on entries it cannot delete. Never raises; returns whether `path` is gone.
  """
  flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
  try:
    try:
      fd = os.open(path, flags)
    except FileNotFoundError:
      return True
    except NotADirectoryError:
      os.unlink(path)
      return True
    stack: list[str] = []      # names from `path` down to the directory `fd` refers to
    skip: set[int] = set()     # inodes of entries that could not be deleted
    budget = 10_000_000
    try:
      while budget > 0:
        budget -= 1
        descended = False
        try:
          os.fchmod(fd, 0o700)
        except OSError:
          pass
        with os.scandir(fd) as entries:
          listing = list(entries)
        for entry in listing:
          key = entry.inode()
          if key in skip:
            continue
          try:
            is_dir = entry.is_dir(follow_symlinks=False)
          except OSError:
            is_dir = False
          if not is_dir:
            try:
              os.unlink(entry.name, dir_fd=fd)
            except FileNotFoundError:
              pass
            except OSError:
              skip.add(key)
            continue
          try:
            try:
              os.chmod(entry.name, 0o700, dir_fd=fd)
            except OSError:
              pass
            child = os.open(entry.name, flags, dir_fd=fd)
          except OSError:
            skip.add(key)
            continue
          os.close(fd)
          fd = child
          stack.append(entry.name)
          descended = True
          break
        if descended:
          continue
        if not stack:
          break
        name = stack.pop()
        inode = os.fstat(fd).st_ino
        parent = os.open("..", flags & ~os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = parent
        try:
          os.rmdir(name, dir_fd=fd)
        except FileNotFoundError:
          pass
        except OSError:
          skip.add(inode)
    finally:
      os.close(fd)
    os.rmdir(path)
    return True
  except Exception as error:  # pylint: disable=broad-except
    _log(f"could not remove {path}: {error!r}")
    return False
