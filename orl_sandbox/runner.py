"""The sandbox's own processes: fork server (F), runner (R), judge children (J1, J2), supervisor
(I), sample (P).

Run as `__main__` by the launcher (`launcher.py`: `python -I [-S] -c BOOT runner.py SPEC`, or
`... runner.py --fork-server SLOT` for F, which then forks R per run), in a fresh interpreter;
see `launcher.py` for the design and the layers. Only light standard-library
modules are imported (start-up time is paid per sample) and the sibling `wire` codec is loaded
by path, so the script runs without the package on `sys.path`.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys


def _sibling(name: str):
  """A sibling module of this script, loaded by path (the script runs without its package)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  module_name = f"_orl_sandbox_script_{name}"
  if module_name not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        module_name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
  return sys.modules[module_name]


if __package__:
  from orl_sandbox import syscalls, wire
else:   # run as a script
  wire = _sibling("wire")
  syscalls = _sibling("syscalls")

# (what it protects, layers of which at least one must be active)
ESSENTIAL_LAYERS = (
    ("a PID namespace whose init is a supervisor (kills every process of the sample)",
     ("pidns",)),
    ("a private mount namespace (own root, size-capped /tmp, no host paths or unix sockets)",
     ("mountns",)),
    ("a network namespace", ("netns",)),
    ("an unprivileged sample (a per-sample uid, or a user namespace without capabilities)",
     ("uid:", "caps-dropped")),
    ("a per-sample process limit (pids cgroup, per-sample uid or user namespace)",
     ("cgroup-pids", "uid:", "userns")),
    ("a syscall filter (no new namespaces; no file locks, file watches or shared futexes, "
     "through which samples running at the same time could talk)", ("seccomp",)),
)


def missing_essentials(layers) -> list[str]:
  """The descriptions of `ESSENTIAL_LAYERS` that none of `layers` satisfies."""
  return [what for what, options in ESSENTIAL_LAYERS
          if not any(layer == option or (option.endswith(":") and layer.startswith(option))
                     for layer in layers for option in options)]


_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_KEEPCAPS = 8
_CAP_DAC_READ_SEARCH = 2
_PR_SET_SECCOMP = 22
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND = 32, 1024, 2048, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME = 1 << 14, 1 << 18, 1 << 21
_MNT_DETACH = 2
_ST_TO_MS = ((os.ST_NOSUID, _MS_NOSUID), (os.ST_NODEV, _MS_NODEV), (os.ST_NOEXEC, _MS_NOEXEC),
             (os.ST_NOATIME, _MS_NOATIME), (os.ST_NODIRATIME, _MS_NODIRATIME),
             (os.ST_RELATIME, _MS_RELATIME))

# Landlock (linux/landlock.h); the syscall numbers are the same on every architecture.
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_REMOVE_DIR, _FS_REMOVE_FILE = 1 << 4, 1 << 5
_FS_MAKE_ALL = sum(1 << bit for bit in range(6, 13))   # char, dir, reg, sock, fifo, block, sym
_FS_REFER, _FS_TRUNCATE = 1 << 13, 1 << 14
_FS_FILE_ONLY = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

def _libc():
  import ctypes  # pylint: disable=import-outside-toplevel
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                         ctypes.c_char_p]
  libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
  libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                         ctypes.c_ulong]
  return ctypes, libc


def _check(result: int, what: str) -> None:
  if result != 0:
    import ctypes  # pylint: disable=import-outside-toplevel
    code = ctypes.get_errno()
    raise OSError(code, f"{what}: {os.strerror(code)}")


def _write_line(fd: int, line: str) -> bool:
  """Writes one status line; False if it could not be written whole (e.g. the host's disk is
  full). Text that may come from the sample (exception messages) is flattened: every character
  that is not printable, line separators included, becomes "?", so no text can start a line of
  its own."""
  data = ("".join(c if c.isprintable() else "?" for c in line[:3000]) + "\n").encode(
      "utf-8", errors="replace")
  try:
    return os.write(fd, data) == len(data)
  except OSError:
    return False


def _close_fds_except(keep) -> None:
  low = 0
  for fd in sorted(set(keep)):
    if fd > low:
      os.closerange(low, fd)
    low = fd + 1
  os.closerange(low, 1 << 20)


class _Lines:
  """Line reader over a pipe (no buffering surprises across fork)."""

  def __init__(self, fd: int):
    self.fd, self.buffer = fd, b""

  def readline(self) -> str | None:
    while b"\n" not in self.buffer:
      try:
        chunk = os.read(self.fd, 65536)
      except InterruptedError:
        continue
      if not chunk:
        return None
      self.buffer += chunk
    line, self.buffer = self.buffer.split(b"\n", 1)
    return line.decode("utf-8", errors="replace")


def _unshare_pid_namespace(spec, ctypes, libc, layers) -> None:
  """R's children get a new PID namespace (and, without root, a user namespace mapping R's
  uid and gid to 0); appends the layers it entered."""
  as_root = os.geteuid() == 0
  uid, gid = os.getuid(), os.getgid()
  flags = _CLONE_NEWPID | (0 if as_root else _CLONE_NEWUSER)
  if "pidns" not in spec["skip_layers"] and libc.unshare(ctypes.c_int(flags)) == 0:
    layers.append("pidns")
    if not as_root:
      for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                         ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
          f.write(text)
      layers.append("userns")


def _relay_supervisor(ctrl, note, judged: bool):
  """Copies the supervisor's layer / infra / refused / exit lines to the status file until it
  is ready (judged mode) or gone. Returns (ready, the sample's exit code or None)."""
  ready = False
  exit_code = None
  while True:
    line = ctrl.readline()
    if line is None:
      break
    key, _, value = line.partition(":")
    if key in ("layer", "infra", "refused", "timeout"):
      note(line)
    elif key == "exit":
      exit_code = int(value)
      note(line)
    elif key == "ready":
      ready = True
      note("ready")
      if judged:
        break
  return ready, exit_code


class _Status:
  """R's status file; remembers whether every line reached it."""

  def __init__(self, path: str):
    self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    self.complete = True

  def note(self, line: str) -> None:
    self.complete &= _write_line(self.fd, line)


def _start_supervisor(spec, layers, judged: bool):
  """Forks I (the supervisor); returns (pid, ctrl_r, to_sample, from_sample) in R."""
  sample_out, sample_err = os.dup(1), os.dup(2)
  log_fd = os.open(os.path.join(os.path.dirname(spec["status"]), "runner.log"),
                   os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
  sys.stdout.flush()
  sys.stderr.flush()
  os.dup2(log_fd, 1)
  os.dup2(log_fd, 2)
  alive_r, _alive_w = os.pipe()   # never closed in R: I sees R's death as end of file
  ctrl_r, ctrl_w = os.pipe()
  to_sample = os.pipe() if judged else (-1, -1)
  from_sample = os.pipe() if judged else (-1, -1)
  child = os.fork()   # safe: R has a single thread (as F has)
  if child == 0:
    for fd in _JUDGE_FDS:
      os.close(fd)   # the judges see end of input when R, and only R, closes its end
    try:
      _supervisor_main(spec, layers, alive_r, ctrl_w, sample_out, sample_err,
                       to_sample[0], from_sample[1])
    except BaseException as error:  # pylint: disable=broad-except
      _write_line(ctrl_w, f"infra:supervisor failed: {error!r}")
    os._exit(70)
  for fd in (alive_r, ctrl_w, sample_out, sample_err, to_sample[0], from_sample[1]):
    if fd >= 0:
      os.close(fd)
  return child, ctrl_r, to_sample[1], from_sample[0]


def _limit_judge(spec: dict, judge_module) -> None:
  """R's own limits once I is forked: CPU (SIGXCPU raises JudgeOverloaded once, SIGKILL a
  second later) and address space, so that no reply can cost the host more than that."""
  import resource  # pylint: disable=import-outside-toplevel
  cpu = int(spec["judge_cpu_s"]) + int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]))
  fired = []

  def overloaded(signum, frame):
    if not fired:
      fired.append(True)
      raise judge_module.JudgeOverloaded()

  signal.signal(signal.SIGXCPU, overloaded)
  resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
  resource.setrlimit(resource.RLIMIT_AS, (spec["judge_memory_bytes"],) * 2)


def _judge_cost() -> str:
  """R's CPU time and peak resident memory. The peak is the address space's own high-water mark
  (`VmHWM`), which starts afresh at R's exec: `ru_maxrss` would not do, since Linux carries it
  across exec, so it would report the launching process's peak (a training process's GiBs)."""
  import resource  # pylint: disable=import-outside-toplevel
  usage = resource.getrusage(resource.RUSAGE_SELF)
  peak = -1
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          peak = int(line.split()[1]) * 1024
  except (OSError, ValueError):
    pass
  cpu = usage.ru_utime + usage.ru_stime + _JUDGE_COST[0]   # R's and its judge children's
  return f"judge:{cpu:.3f}:{max(peak, _JUDGE_COST[1])}"


def _end_sample(child: int) -> None:
  """Kills I, which ends the PID namespace; returns once the kernel has reaped every process of
  it (the exit of a namespace's init waits for all of them)."""
  try:
    os.kill(child, signal.SIGKILL)
  except ProcessLookupError:
    pass
  try:
    os.waitpid(child, 0)
  except ChildProcessError:
    pass


# Layers the contained judge must reach (one of each), like the sample's essential layers.
JUDGE_ESSENTIAL = (("a private mount namespace for the judge", ("judge-mountns",)),
                   ("a network namespace for the judge", ("judge-netns",)),
                   ("an unprivileged judge", ("judge-uid:", "judge-caps-dropped")))


def _contain_judge(spec: dict) -> list[str]:
  """In a judge child: the sample's kind of root, namespaces, limits, uid and filters."""
  import resource  # pylint: disable=import-outside-toplevel
  ctypes, libc = _libc()
  layers: list[str] = []
  as_root = os.geteuid() == 0
  uid, gid = os.getuid(), os.getgid()
  flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
  flags |= 0 if as_root else _CLONE_NEWUSER
  if "mountns" not in spec["skip_layers"] and libc.unshare(ctypes.c_int(flags)) == 0:
    if not as_root:
      for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                         ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
          f.write(text)
    _build_root(spec, libc)
    layers += ["judge-mountns", "judge-netns", "judge-ipcns", "judge-utsns"]
  # Each phase is its own process, so it has its own CPU budget. Soft = hard: the kernel kills
  # the phase at its limit (SIGKILL), so no exception is raised inside the tests' frames, where
  # a bare `except:` could swallow it and let the tests go on (`_finish_judge` reads the kill).
  cpu = int(spec["judge_cpu_s"])
  for limit, value in ((resource.RLIMIT_AS, spec["judge_memory_bytes"]),
                       (resource.RLIMIT_FSIZE, spec["max_file_bytes"]),
                       (resource.RLIMIT_NOFILE, spec["max_open_files"]),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_MEMLOCK, 0),
                       (resource.RLIMIT_CPU, cpu)):
    resource.setrlimit(limit, (value, value))
  layers.append("judge-rlimits")
  layers += _judge_identity(spec, ctypes, libc, as_root)
  _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
  layers.append("judge-no-new-privs")
  private = "judge-mountns" in layers
  work_dir = "/tmp" if private else spec["host_work_dir"]
  if "landlock" not in spec["skip_layers"]:
    layers += ["judge-" + layer for layer in
               _landlock_layers(ctypes, libc, work_dir, spec["site_packages"], private)]
  if "seccomp" not in spec["skip_layers"]:
    layers += ["judge-" + layer for layer in _seccomp_filter(ctypes, libc)]
  # Without a private root the judge never enters the host work directory, the sample's: the
  # supervisor hands it to the sample's uid while the judge starts (a race), and it is not the
  # judge's to share.
  os.chdir(work_dir if private else "/")
  return layers


def _judge_identity(spec: dict, ctypes, libc, as_root: bool) -> list[str]:
  """The judge child's uid: the run's own (root), or no capabilities (a user namespace)."""
  uid = spec["uid"]
  if as_root and uid is not None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid):
      raise RuntimeError(f"could not switch the judge to uid {uid}")
    return [f"judge-uid:{uid}"]
  if not as_root:
    libc.prctl(_PR_SET_SECUREBITS, 0x2F, 0, 0, 0)   # NOROOT, NO_SETUID_FIXUP, both locked
    _set_capabilities(ctypes, libc, 0)
    return ["judge-caps-dropped"]
  return []


def _read_all(fd: int, limit: int) -> bytes:
  chunks, total = [], 0
  while total <= limit:
    chunk = os.read(fd, 1 << 20)
    if not chunk:
      break
    chunks.append(chunk)
    total += len(chunk)
  return b"".join(chunks)


def _start_judge(spec: dict, judge_module, step):
  """Forks a contained judge child (`_contain_judge`) before the sample exists; it reads the
  task's tests, waits for its input on a pipe, and answers `step(judge, input)` as JSON on a
  pipe only it writes. Returns (pid, to_judge, from_judge)."""
  to_r, to_w = os.pipe()
  from_r, from_w = os.pipe()
  pid = os.fork()   # safe: R has a single thread
  if pid == 0:
    message = {}
    try:
      null = os.open("/dev/null", os.O_RDWR)
      for fd in (0, 1, 2):
        os.dup2(null, fd)
      _close_fds_except({0, 1, 2, to_r, from_w})   # no status file, no pipes to the sample
      with open(spec["judge_file"], encoding="utf-8") as f:
        judge = json.load(f)
      message["layers"] = _contain_judge(spec)
      _libc()[1].prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)   # reset by the uid change
      given = json.loads(_read_all(to_r, int(spec["judge_memory_bytes"])) or b"null")
      message["result"] = step(judge, given)
    except BaseException as error:  # pylint: disable=broad-except
      message["error"] = repr(error)[:300]
    try:
      wire.write_all(from_w, json.dumps(message).encode())
    finally:
      os._exit(0)
  os.close(to_r)
  os.close(from_w)
  _JUDGE_FDS.extend((to_w, from_r))
  return pid, to_w, from_r


_JUDGE_COST = [0.0, -1]   # the judge children's CPU seconds and peak resident bytes
_JUDGE_FDS: list[int] = []   # R's ends of the judges' pipes, closed in the supervisor
_JUDGES_REAPED: set[int] = set()   # judge children already waited for


def _finish_judge(spec: dict, judge, given) -> dict | None:
  """Sends the judge child its input, reads its answer, ends it; {"overloaded": True} if the
  kernel killed it at its CPU limit before it answered (`cpu_limit_line`), None if it said
  nothing otherwise."""
  pid, to_w, from_r = judge
  try:
    wire.write_all(to_w, json.dumps(given).encode())
  except OSError:
    pass
  os.close(to_w)
  data = _read_all(from_r, int(spec["judge_memory_bytes"]))
  os.close(from_r)
  ended = _reap_judge(pid)
  try:
    return json.loads(data)
  except ValueError:
    if ended is not None and cpu_limit_line(*ended, spec["judge_cpu_s"]) is not None:
      return {"overloaded": True}
    return None


def _reap_judge(pid: int) -> tuple[int, float] | None:
  """Kills and reaps a judge child (once), adding its CPU and memory to the judge's cost.
  Returns its (exit status, CPU seconds), None if it was reaped before."""
  if pid in _JUDGES_REAPED:   # its pid may belong to another process by now
    return None
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  try:
    _, status, usage = os.wait4(pid, 0)
  except ChildProcessError:   # not R's child (never expected): nothing to reap or count
    return None
  finally:
    _JUDGES_REAPED.add(pid)
  cpu_s = usage.ru_utime + usage.ru_stime
  _JUDGE_COST[0] += cpu_s
  _JUDGE_COST[1] = max(_JUDGE_COST[1], usage.ru_maxrss * 1024)
  return os.waitstatus_to_exitcode(status), cpu_s


def _end_judges(judges) -> None:
  """Reaps the judge children no step used (a candidate that did not load never reaches the
  replay): R's exit would orphan them, and an orphan is reaped by the host's init, which may
  take seconds while the launcher waits for the sample's uid to own no process."""
  for pid, _, _ in judges or ():
    _reap_judge(pid)


# Layers the contained judge must reach (one of each), like the sample's essential layers.
JUDGE_ESSENTIAL = (("a private mount namespace for the judge", ("judge-mountns",)),
                   ("a network namespace for the judge", ("judge-netns",)),
                   ("an unprivileged judge", ("judge-uid:", "judge-caps-dropped")))


def _judge_refused(spec: dict, reply: dict, note) -> bool:
  """True (with a refused line) when the judge lacks an essential layer."""
  judge_layers = reply.get("layers", [])
  missing = [what for what, options in JUDGE_ESSENTIAL
             if not any(layer == option or (option.endswith(":") and layer.startswith(option))
                        for layer in judge_layers for option in options)]
  if "error" in reply:
    missing.append(f"a judge that starts ({reply['error']})")
  if missing and spec["require_isolation"]:
    note("refused:" + "; ".join(missing))
    return True
  return False


def _collect_step(judge_module, entry):
  def step(judge, _given):
    calls, refusal = judge_module.collect(judge["prelude"], judge["tests"], entry)
    return {"calls": [call.decode("latin-1") for call in calls], "refusal": refusal}
  return step


def _replay_step(judge_module, entry):
  def step(judge, given):
    calls = [call.encode("latin-1") for call in given["calls"]]
    replies = [reply.encode("latin-1") for reply in given["replies"]]
    return list(judge_module.replay_verdict(judge["prelude"], judge["tests"], entry, calls,
                                            replies, given["stopped"]))
  return step


def _start_judges(spec: dict, judge_module):
  """The two judge children (collection, replay), forked before the sample's PID namespace."""
  entry = spec["entry_point"]
  return (_start_judge(spec, judge_module, _collect_step(judge_module, entry)),
          _start_judge(spec, judge_module, _replay_step(judge_module, entry)))


def _collect(spec, collector, note):
  """Step 1 in the contained judge: (the calls, the sentence refusing the tests or ""), or None
  (noted) when the judge failed."""
  reply = _finish_judge(spec, collector, None)
  if reply is None:
    note("infra:the judge died while collecting the tests' calls")
    return None
  for layer in reply.get("layers", []):
    note(f"layer:{layer}")
  if reply.get("overloaded"):
    # Tests that loop on an answer never end against the stand-in: the sample's timeout
    # (counted and cached as one), not a failure of the machine.
    note("timeout:collecting the tests' calls ran past the judge's CPU limit")
    return None
  if _judge_refused(spec, reply, note):
    return None
  if "result" not in reply:
    note(f"infra:the judge failed collecting the tests' calls: {reply.get('error', '')}")
    return None
  return ([call.encode("latin-1") for call in reply["result"]["calls"]],
          reply["result"]["refusal"])


def _replay(spec, replayer, calls, replies, stopped, note):
  """Step 3 in the other contained judge, with its own CPU budget. Answers that cost the judge
  its CPU limit (costly to decode or to compare) are the sample's timeout: no verdict, and the
  tests' code never saw the limit (the kernel ends the phase)."""
  given = {"calls": [c.decode("latin-1") for c in calls],
           "replies": [r.decode("latin-1") for r in replies], "stopped": stopped}
  reply = _finish_judge(spec, replayer, given)
  if reply is not None and reply.get("overloaded"):
    note("timeout:checking the sample's answers ran past the judge's CPU limit")
    return None
  if reply is None:
    return "fail", "the judge's limits ran out while checking the sample's answers"
  if "result" not in reply:
    return "fail", f"the judge failed checking the answers: {reply.get('error', '')}"
  return reply["result"][0], reply["result"][1]


def _judged_verdict(spec, judges, judge_module, child, ctrl, to_sample, from_sample, note):
  """Collect the calls, let the sample answer them, end it, then judge (judge.py's three
  steps); None when the judge itself failed (an infrastructure error). Steps 1 and 3 run the
  task's own code, each in its contained child (`_start_judge`); R only moves bytes."""
  collected = _collect(spec, judges[0], note)
  if collected is None:
    return None
  calls, refusal = collected
  if refusal:   # tests outside the contract (the task loader says so first): nothing is sent
    calls = []
  try:
    first = wire.read_message(from_sample, spec["max_message_bytes"])
  except (OSError, wire.WireError) as error:
    first = {"load_error": f"broken start-up message: {error}"}
  except judge_module.JudgeOverloaded:
    first = {"load_error": "the start-up message took more than the judge's CPU limit"}
  replies, stopped = [], ""
  if first == {"loaded": True}:
    try:
      replies, stopped = judge_module.exchange(calls, to_sample, from_sample,
                                               spec["max_message_bytes"],
                                               spec["max_reply_bytes"])
    except judge_module.JudgeOverloaded:   # (up to MAX_CALLS calls of a loop on an answer)
      note("timeout:exchanging the tests' calls ran past the judge's CPU limit")
      return None
  os.close(to_sample)   # end of input lets an honest sample flush its output and exit
  # A sample that is gone (it stopped mid-exchange, or never loaded) is reaped by I at once:
  # wait for that line (and a CPU limit's timeout line before it) rather than 0.2 s.
  gone = first is None or first != {"loaded": True} or stopped != ""
  while select.select([ctrl.fd], [], [], 2.0 if gone else 0.2)[0]:
    line = ctrl.readline()
    if line is None:
      break
    if line.startswith(("exit:", "timeout:")):
      note(line)
    if line.startswith("exit:"):
      break
  _end_sample(child)   # the verdict exists only once every process of the sample is dead
  if first is None:
    return "fail", "the sample exited before defining the candidate"
  if first != {"loaded": True}:
    return "fail", f"the candidate did not load: {str(first.get('load_error'))[:1000]}"
  if refusal:
    return "unsupported", f"not judged: {refusal}"
  note("judging")
  return _replay(spec, judges[1], calls, replies, stopped, note)


def _runner_main(spec_path: str) -> int:
  """R: namespaces for its children, the supervisor fork, the judge, the status file.
  Exits 0, or 4 when a status line could not be written (the launcher then reports an
  infrastructure failure, never a verdict)."""
  ctypes, libc = _libc()
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)   # dies with the launcher thread
  with open(spec_path, encoding="utf-8") as f:
    spec = json.load(f)
  signal.alarm(int(spec["timeout_s"]) + 5)                # and on its own clock
  status = _Status(spec["status"])
  judged = spec["mode"] == "judged"
  layers = ["judge-process"] if judged else []
  try:   # R (the judge) and its supervisor child run in the judge's cgroup
    for path, _ in spec["judge_cgroup_procs"]:
      with open(path, "w", encoding="ascii") as f:
        f.write("0")
    layers += ["judge-cgroup"] if spec["judge_cgroup_procs"] else []
  except OSError as error:
    status.note(f"infra:could not join the judge's cgroup: {error!r}")
    return 2
  try:
    judge_module = _sibling("judge") if not __package__ else _package_judge()
    _before_forks()
    judges = _start_judges(spec, judge_module) if judged else None
    _unshare_pid_namespace(spec, ctypes, libc, layers)
    child, ctrl_r, to_sample, from_sample = _start_supervisor(spec, layers, judged)
    _limit_judge(spec, judge_module)
  except BaseException as error:  # pylint: disable=broad-except
    status.note(f"infra:runner set-up failed: {error!r}")
    return 2
  ctrl = _Lines(ctrl_r)
  ready, exit_code = _relay_supervisor(ctrl, status.note, judged)
  verdict = None
  if judged and ready:
    verdict = _judged_verdict(spec, judges, judge_module, child, ctrl, to_sample, from_sample,
                              status.note)
  elif ready:
    verdict = ("pass" if exit_code == 0 else "fail"), ""
  _end_sample(child)
  _end_judges(judges)
  if verdict is not None:
    status.note(f"verdict:{verdict[0]}")
    status.note(f"detail:{verdict[1]}")
  status.note(_judge_cost())
  return 0 if status.complete else 4


def _before_forks() -> None:
  """What R does once so that its three children need not: the modules each of them imports
  anyway (the sample's error path imports `traceback`, task code `typing`), and a garbage
  collector that leaves every object R made alone (`gc.freeze`), so that a child's collections
  do not copy R's pages (copy-on-write). Nothing here depends on the sample or the tests."""
  import gc  # pylint: disable=import-outside-toplevel
  import traceback  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  import typing  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  gc.collect()
  gc.freeze()


def _package_judge():
  from orl_sandbox import judge  # pylint: disable=import-outside-toplevel
  return judge


def _supervisor_main(spec, layers, alive_r, ctrl_w, sample_out, sample_err, rpc_in, rpc_out):
  """I: PID 1 of the sample's namespace; never runs sample code. Never returns."""
  ctypes, libc = _libc()
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  if select.select([alive_r], [], [], 0)[0]:   # R died before the line above took effect
    os._exit(0)
  keep = {0, 1, 2, ctrl_w, sample_out, sample_err} | {fd for fd in (rpc_in, rpc_out) if fd >= 0}
  _close_fds_except(keep)
  layers = list(layers)
  if "pidns" in layers and os.getpid() != 1:
    layers.remove("pidns")
  cgroup_fds = []
  try:
    for path, names in spec["cgroup_procs"]:
      cgroup_fds.append((os.open(path, os.O_WRONLY | os.O_CLOEXEC), names.split(",")))
    for flags, name in ((_CLONE_NEWNS, "mountns"), (_CLONE_NEWNET, "netns"),
                        (_CLONE_NEWIPC, "ipcns"), (_CLONE_NEWUTS, "utsns")):
      if name not in spec["skip_layers"] and libc.unshare(ctypes.c_int(flags)) == 0:
        layers.append(name)
    work_dir = spec["host_work_dir"]
    if "mountns" in layers:
      layers.remove("mountns")
      try:
        _build_root(spec, libc)
        layers += ["mountns", "tmpfs-disk"] + (["memory-image"] if spec["image"] else [])
        work_dir = "/tmp"
      except OSError as error:
        _write_line(2, f"private root unavailable: {error!r}")
    if work_dir != "/tmp" and spec["uid"] is not None:
      os.chown(work_dir, spec["uid"], spec["uid"])
  except BaseException as error:  # pylint: disable=broad-except
    _write_line(ctrl_w, f"infra:supervisor set-up failed: {error!r}")
    os._exit(1)
  for layer in layers:
    _write_line(ctrl_w, f"layer:{layer}")
  sys.stdout.flush()
  sys.stderr.flush()
  try:
    # The sample's stdout and stderr are pipes that only I reads: no host file is ever open in
    # the sample (fallocate, ftruncate or writes on an inherited file would take host disk).
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sample = os.fork()
  except OSError as error:
    _write_line(ctrl_w, f"infra:fork of the sample failed: {error!r}")
    os._exit(1)
  if sample == 0:
    code = 71
    try:
      _sample_main(spec, layers, work_dir, ctrl_w, out_w, err_w, rpc_in, rpc_out, cgroup_fds)
    except BaseException as error:  # pylint: disable=broad-except
      _write_line(ctrl_w, f"infra:sample set-up failed: {error!r}")
      _write_line(2, f"sandbox: {error!r}")
    os._exit(code)
  for fd in [out_w, err_w, rpc_in, rpc_out] + [fd for fd, _ in cgroup_fds]:
    if fd >= 0:
      os.close(fd)
  status, cpu_s = _pump_until_exit(sample, {out_r: sample_out, err_r: sample_err},
                                   spec["max_output_bytes"], spec["max_file_bytes"])
  limit_line = cpu_limit_line(status, cpu_s, spec["cpu_s"])
  if limit_line is not None:
    _write_line(ctrl_w, limit_line)
  _write_line(ctrl_w, f"exit:{status}")
  # Exiting as PID 1 makes the kernel kill every process left in the namespace.
  os._exit(0)


def _reap(sample: int) -> tuple[int, float] | None:
  """Reaps every exited child (orphans of the sample are re-parented to I, PID 1); the
  sample's (exit status, CPU seconds) once it is among them."""
  while True:
    try:
      pid, status, usage = os.wait4(-1, os.WNOHANG)
    except ChildProcessError:
      return -1, 0.0
    if pid == 0:
      return None
    if pid == sample:
      return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def cpu_limit_line(exit_status: int, cpu_s: float, limit_s: float) -> str | None:
  """The supervisor's `timeout:` line for a sample the kernel killed at its CPU limit
  (`RLIMIT_CPU`, soft = hard: SIGKILL once its CPU time reaches the limit): a loop that burns
  CPU ends at its CPU budget instead of the wall timeout, and is a timeout like one. None for
  any other end (a SIGKILL with less CPU is the launcher's, the memory cgroup's, ...). The
  kernel checks the limit against the scheduler's exact CPU time, while the user and system
  times reported are sampled at ticks (measured: 0.94 s at a 1 s limit), hence the margin."""
  if exit_status == -signal.SIGKILL and cpu_s >= 0.8 * limit_s:
    return f"timeout:the sample ran past its CPU limit ({limit_s:g} s of CPU)"
  return None


def _pump_until_exit(sample: int, pipes: dict[int, int], keep_bytes: int,
                     max_bytes: int) -> tuple[int, float]:
  """I's loop until the sample exits: copies the first `keep_bytes` of each of its output pipes
  to the matching host file, reads and drops the rest up to `max_bytes`, then closes the pipe
  (the sample's next write fails with EPIPE). Returns the sample's (exit status, CPU
  seconds)."""
  wake_r, wake_w = os.pipe()
  for fd in (wake_r, wake_w, *pipes):
    os.set_blocking(fd, False)
  signal.signal(signal.SIGCHLD, lambda signum, frame: None)
  signal.set_wakeup_fd(wake_w)
  seen = dict.fromkeys(pipes, 0)
  status = _reap(sample)
  while status is None:
    ready = select.select(list(pipes) + [wake_r], [], [], 1.0)[0]
    for fd in ready:
      if fd == wake_r:
        _drain(wake_r)
      else:
        _copy_output(fd, pipes, seen, keep_bytes, max_bytes)
    status = _reap(sample)
  for fd in list(pipes):   # what the sample wrote just before it exited
    while fd in pipes and _copy_output(fd, pipes, seen, keep_bytes, max_bytes):
      pass
  return status


def _drain(fd: int) -> None:
  try:
    while os.read(fd, 4096):
      pass
  except (BlockingIOError, InterruptedError):
    pass


def _copy_output(fd: int, pipes: dict[int, int], seen: dict[int, int], keep_bytes: int,
                 max_bytes: int) -> bool:
  """Moves one chunk of pipe `fd` on; closes it at end of file or past `max_bytes`. Returns
  whether a chunk was read."""
  try:
    chunk = os.read(fd, 1 << 16)
  except (BlockingIOError, InterruptedError):
    return False
  keep = chunk[:max(keep_bytes - seen[fd], 0)]
  if keep:
    try:
      os.write(pipes[fd], keep)
    except OSError:
      pass
  seen[fd] += len(chunk)
  if not chunk or seen[fd] >= max_bytes:
    os.close(fd)
    del pipes[fd]
  return bool(chunk)


def _bind_paths(site_packages: bool) -> list[str]:
  """Absolute paths the sample may read: system libraries and the interpreter's import path."""
  paths = ["/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin",
           "/etc/ld.so.cache", "/etc/localtime"]
  paths += [os.path.abspath(p) for p in sys.path if p]
  return [p for p in dict.fromkeys(paths) if os.path.lexists(p)]


def _mount_flags(path: str) -> int:
  """The per-mount flags that a bind remount must keep (locked in a user namespace)."""
  flags = 0
  try:
    fs_flags = os.statvfs(path).f_flag
  except OSError:
    return flags
  for st_flag, ms_flag in _ST_TO_MS:
    if fs_flags & st_flag:
      flags |= ms_flag
  return flags


_DEVICES = ("null", "full", "random", "urandom")


def _build_root(spec: dict, libc) -> None:
  """Builds the sample's root on a tmpfs and pivots into it (I, in its new mount namespace)."""
  root = spec["root_dir"]
  enc = os.fsencode
  _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")
  _check(libc.mount(b"tmpfs", enc(root), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                    b"size=1m,nr_inodes=4096,mode=755"), "mount the root tmpfs")
  bound: list[str] = []
  links: list[str] = []
  own_dir = os.path.dirname(os.path.realpath(__file__))
  for path in sorted(_bind_paths(spec["site_packages"]), key=lambda p: len(os.path.realpath(p))):
    real = os.path.realpath(path)
    if any(real == b or real.startswith(b.rstrip("/") + "/") for b in bound):
      if real != path:
        links.append(path)
      continue
    # From the memory-resident copy (system_image.py) when there is one; then only the
    # sandbox's own modules come from the host.
    source = real if not spec["image"] or real == own_dir else spec["image"] + real
    if not os.path.lexists(source):
      continue
    target = root + real
    if os.path.isdir(source):
      os.makedirs(target, 0o755, exist_ok=True)
    else:
      os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
      with open(target, "wb"):
        pass
    _check(libc.mount(enc(source), enc(target), None, _MS_BIND | _MS_REC, None), f"bind {real}")
    _check(libc.mount(None, enc(target), None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID
                      | _MS_NODEV | _mount_flags(real), None), f"read-only {real}")
    bound.append(real)
    if real != path:
      links.append(path)
  for path in links:   # a path reached through symlinks (/lib -> usr/lib): recreate the first
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
      prefix = "/" + "/".join(parts[:i])
      if os.path.islink(prefix):
        if not os.path.lexists(root + prefix):
          os.makedirs(os.path.dirname(root + prefix), 0o755, exist_ok=True)
          os.symlink(os.readlink(prefix), root + prefix)
        break
  if not spec["site_packages"]:   # hide installed packages (and their data files, test sets)
    for directory in dict.fromkeys(os.path.join(p, "site-packages") for p in sys.path if p):
      if os.path.isdir(root + directory) and not os.path.islink(directory):
        _check(libc.mount(b"tmpfs", enc(root + directory), b"tmpfs",
                          _MS_RDONLY | _MS_NOSUID | _MS_NODEV, b"size=4k,nr_inodes=1"),
               f"mask {directory}")
  tmp = root + "/tmp"
  os.mkdir(tmp, 0o755)
  owner = spec["uid"] if spec["uid"] is not None else 0
  options = (f"size={spec['disk_bytes']},nr_inodes={spec['max_inodes']},mode=700,"
             f"uid={owner},gid={owner}")
  _check(libc.mount(b"tmpfs", enc(tmp), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()),
         "mount /tmp")
  os.makedirs(root + "/dev", 0o755, exist_ok=True)
  # No /dev/zero: a shared mapping of it takes an inode number from the machine-wide counter.
  for name in _DEVICES:
    if os.path.exists(f"/dev/{name}"):
      with open(f"{root}/dev/{name}", "wb"):
        pass
      _check(libc.mount(enc(f"/dev/{name}"), enc(f"{root}/dev/{name}"), None, _MS_BIND, None),
             f"bind /dev/{name}")
  os.symlink("/tmp", f"{root}/dev/shm")
  # No /proc: its machine-wide files (stat, loadavg, meminfo, vmstat, sys/fs/*-nr, pressure/*)
  # are counters other samples change, and its inodes take numbers from a machine-wide counter.
  os.chdir(root)
  syscall_numbers = syscalls.numbers(os.uname().machine)
  if "pivot_root" in syscall_numbers:
    _check(libc.syscall(syscall_numbers["pivot_root"], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", _MNT_DETACH), "detach the old root")
  else:
    _check(libc.mount(b".", b"/", None, 8192, None), "move the root")   # MS_MOVE
    os.chroot(".")
  os.chdir("/")
  _check(libc.mount(None, b"/", None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID
                    | _MS_NODEV, None), "read-only root")


_SIGNALS_PENDING = 64   # queued signals (kernel memory), per user: the sample's own uid


def _set_limits(spec: dict) -> None:
  import resource  # pylint: disable=import-outside-toplevel
  for limit, value in ((resource.RLIMIT_AS, spec["memory_bytes"]),
                       (resource.RLIMIT_CPU, spec["cpu_s"]),   # soft == hard: SIGKILL
                       (resource.RLIMIT_NPROC, spec["max_processes"]),
                       (resource.RLIMIT_FSIZE, spec["max_file_bytes"]),
                       (resource.RLIMIT_NOFILE, spec["max_open_files"]),
                       (resource.RLIMIT_CORE, 0), (resource.RLIMIT_MEMLOCK, 0),
                       (resource.RLIMIT_MSGQUEUE, 0), (resource.RLIMIT_RTPRIO, 0),
                       (resource.RLIMIT_SIGPENDING, _SIGNALS_PENDING)):
    resource.setrlimit(limit, (value, value))


def _set_capabilities(ctypes, libc, keep: int) -> None:
  """Sets the effective and permitted capabilities to `keep` (a bit mask), inheritable to none."""

  class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

  class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]

  data = (CapData * 2)(CapData(keep & 0xFFFFFFFF, keep & 0xFFFFFFFF, 0),
                       CapData(keep >> 32, keep >> 32, 0))
  if libc.capset(ctypes.byref(CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
    raise OSError(ctypes.get_errno(), "capset failed")


def _landlock_abi(ctypes, libc) -> int:
  abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
  return max(int(abi), 0)


def _landlock_layers(ctypes, libc, work_dir: str, site_packages: bool,
                     private_root: bool) -> list[str]:
  """Reads below the bound paths, writes below `work_dir`; no TCP, no outside signals."""
  abi = _landlock_abi(ctypes, libc)
  if abi < 1:
    return []

  class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]

  class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

  truncate = _FS_TRUNCATE if abi >= 3 else 0
  write_access = _FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_ALL | truncate
  write_access |= _FS_REFER if abi >= 2 else 0
  read_access = _FS_READ_FILE | _FS_READ_DIR
  layers = ["landlock-fs"]
  attr = RulesetAttr(handled_access_fs=read_access | write_access)
  attr_size = 8
  if abi >= 4:
    attr.handled_access_net = _NET_BIND_TCP | _NET_CONNECT_TCP   # no rule: all TCP denied
    attr_size, layers = 16, layers + ["landlock-net"]
  if abi >= 6:
    attr.scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    attr_size, layers = 24, layers + ["landlock-scope"]
  if private_root:   # everything visible was put there on purpose: read it all, write /tmp
    readable = ["/"]
  else:
    readable = _bind_paths(site_packages) + ["/dev/zero", "/dev/full", "/dev/random",
                                             "/dev/urandom"]
  rules = [(p, read_access) for p in dict.fromkeys(os.path.realpath(p) for p in readable)
           if os.path.exists(p)]
  rules += [(work_dir, read_access | write_access),
            ("/dev/null", _FS_READ_FILE | _FS_WRITE_FILE | truncate)]
  ruleset_fd = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr),
                            ctypes.c_size_t(attr_size), ctypes.c_uint32(0))
  if ruleset_fd < 0:
    return []
  try:
    for path, access in rules:
      path_fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
      if not os.path.isdir(path):
        access &= _FS_FILE_ONLY   # a rule on a file may name only file rights
      try:
        rule = PathBeneathAttr(allowed_access=access, parent_fd=path_fd)
        if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset_fd),
                        ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), ctypes.byref(rule),
                        ctypes.c_uint32(0)) != 0:
          raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
      finally:
        os.close(path_fd)
    if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset_fd),
                    ctypes.c_uint32(0)) != 0:
      raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
  finally:
    os.close(ruleset_fd)
  return layers


def _seccomp_filter(ctypes, libc) -> list[str]:
  """Installs the syscall filter (`syscalls.program`); [] on an unknown architecture."""
  program = syscalls.program(os.uname().machine)
  if not program:
    return []

  class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]

  class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]

  resolved = [SockFilter(*instruction) for instruction in program]
  filters = (SockFilter * len(resolved))(*resolved)
  prog = SockFprog(len(resolved), filters)
  _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0),
         "seccomp")
  return ["seccomp"]


def _sample_main(spec, layers, work_dir, ctrl_w, out_w, err_w, rpc_in, rpc_out, cgroup_fds):
  """P: joins its cgroup, drops every privilege, then runs the untrusted code. Never returns."""
  ctypes, libc = _libc()
  os.dup2(out_w, 1)
  os.dup2(err_w, 2)
  keep = {0, 1, 2, ctrl_w} | {fd for fd in (rpc_in, rpc_out) if fd >= 0}
  keep |= {fd for fd, _ in cgroup_fds}
  _close_fds_except(keep)
  layers = list(layers)
  inherited = len(layers)
  for fd, names in cgroup_fds:
    os.write(fd, b"0")   # moves this process (and all it will start) into the cgroup
    os.close(fd)
    layers += names
  _set_limits(spec)
  layers.append("rlimits")
  os.chdir(work_dir)
  import traceback  # noqa: F401  (loaded while every file is readable; used on errors)
  if spec["uid"] is not None:
    uid = spec["uid"]
    # Without the private root the interpreter may live where the uid cannot read it (e.g.
    # /root/.pyenv). With Landlock confining reads to the import path and system libraries,
    # the sample keeps the one capability that bypasses read permission checks.
    keep_read_search = ("mountns" not in layers and "landlock" not in spec["skip_layers"]
                        and _landlock_abi(ctypes, libc) >= 1)
    if keep_read_search:
      libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
      raise RuntimeError(f"could not switch to uid {uid}")
    layers.append(f"uid:{uid}" if spec["per_sample_uid"] else f"shared-uid:{uid}")
    if keep_read_search:
      _set_capabilities(ctypes, libc, 1 << _CAP_DAC_READ_SEARCH)
      layers.append("cap-dac-read-search")
  elif "userns" in layers:
    libc.prctl(_PR_SET_SECUREBITS, 0x2F, 0, 0, 0)   # NOROOT, NO_SETUID_FIXUP, both locked
    _set_capabilities(ctypes, libc, 0)
    layers.append("caps-dropped")
  _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
  layers.append("no-new-privs")
  if "landlock" not in spec["skip_layers"]:
    layers += _landlock_layers(ctypes, libc, work_dir, spec["site_packages"],
                               private_root="mountns" in layers)
  if "seccomp" not in spec["skip_layers"]:
    layers += _seccomp_filter(ctypes, libc)
  os.environ.clear()
  os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
                     "LC_ALL": "C.UTF-8", "HOME": work_dir, "TMPDIR": work_dir,
                     "PYTHONDONTWRITEBYTECODE": "1"})
  for layer in layers[inherited:]:
    _write_line(ctrl_w, f"layer:{layer}")
  missing = missing_essentials(layers)
  if missing and spec["require_isolation"]:
    _write_line(ctrl_w, "refused:" + "; ".join(missing))
    os._exit(3)
  _write_line(ctrl_w, "ready")
  os.close(ctrl_w)   # from here on the sample can report nothing but its answers
  sys.argv = ["program.py"]
  if spec["mode"] == "judged":
    _serve(spec, rpc_in, rpc_out)
  _run_program(spec["program"])


def _run_program(source: str) -> None:
  import traceback  # pylint: disable=import-outside-toplevel
  code = 1
  try:
    exec(compile(source, "program.py", "exec"),  # pylint: disable=exec-used
         {"__name__": "__main__", "__builtins__": __builtins__})
    code = 0
  except SystemExit as exit_request:
    value = exit_request.code
    if value is None or isinstance(value, int):
      code = value or 0
    else:
      try:
        print(value, file=sys.stderr)
      except BaseException:  # pylint: disable=broad-except
        pass
  except BaseException:  # pylint: disable=broad-except
    try:
      traceback.print_exc()
    except BaseException:  # pylint: disable=broad-except
      pass
  _flush_and_exit(code)


def _flush_and_exit(code: int) -> None:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
  os._exit(code & 0xFF)


def _serve(spec: dict, rpc_in: int, rpc_out: int) -> None:
  """Defines the candidate, then answers the judge's calls with plain data until EOF; each
  call's arguments are decoded afresh (by value: nothing is kept between calls)."""
  import traceback  # pylint: disable=import-outside-toplevel
  # No __name__, as in the usual harness's `exec(program, {})`: its classes' __module__ is
  # "builtins" and an `if __name__ == "__main__":` block does not run.
  namespace = {"__builtins__": __builtins__}
  try:
    exec(compile(spec["program"], "candidate.py", "exec"), namespace)  # pylint: disable=exec-used
    function = namespace.get(spec["entry_point"])
    if not callable(function):
      raise NameError(f"{spec['entry_point']!r} is not defined by the completion")
    first = {"loaded": True}
  except BaseException as error:  # pylint: disable=broad-except
    try:
      traceback.print_exc()
    except BaseException:  # pylint: disable=broad-except
      pass
    first = {"load_error": _describe(error)}
  try:
    wire.write_message(rpc_out, first)
  except OSError:
    _flush_and_exit(1)
  if "load_error" in first:
    _flush_and_exit(1)
  while True:
    try:
      message = wire.read_message(rpc_in, spec["max_message_bytes"])
      if message is None:
        _flush_and_exit(0)
      names = message["call"]["kw"]
      values = [wire.decode(v) for v in message["call"]["args"]]
      args, kwargs = values[:len(values) - len(names)], dict(zip(names, values[len(
          values) - len(names):]))
    except Exception:  # pylint: disable=broad-except
      _flush_and_exit(1)
    try:
      wire.write_message(rpc_out, _answer(namespace, function, args, kwargs))
    except (OSError, ValueError):
      _flush_and_exit(1)


def _answer(namespace: dict, function, args, kwargs) -> dict:
  """The reply to one call: its result as plain data, or the class of the exception it raised
  (`_raised`); "notdata" naming the result's type when it is not plain data; "abort" when a
  BaseException escaped. What the call prints, warns or logs, or does to its arguments, is not
  sent: no test inside the judge's contract can watch it (docs/verifier.md#what-crosses)."""
  try:
    try:
      result = function(*args, **kwargs)
    except Exception as error:  # pylint: disable=broad-except
      return {"raise": _raised(namespace, type(error))}
    return {"return": wire.encode(result)}
  except (wire.WireError, RecursionError) as error:
    return {"notdata": _message(error)}
  except BaseException as error:  # pylint: disable=broad-except
    return {"abort": f"{type(error).__name__} escaped the candidate"}


def _raised(namespace: dict, cls: type) -> dict:
  """An exception class as it crosses: the names of the classes of its hierarchy that the
  program binds to their names (the prompt's own classes among them), up to the nearest
  built-in exception class, which is sent too."""
  import builtins  # pylint: disable=import-outside-toplevel
  names = []
  for base in cls.__mro__:
    name = getattr(base, "__qualname__", "")
    if vars(builtins).get(name) is base:
      return {"names": names, "builtin": name}
    if namespace.get(name) is base:
      names.append(name)
  return {"names": names, "builtin": "Exception"}


def _message(error: BaseException) -> str:
  try:
    return str(error)[:1000]
  except BaseException:  # pylint: disable=broad-except
    return ""


def _describe(error: BaseException) -> str:
  try:
    return f"{type(error).__name__}: {error}"[:1000]
  except BaseException:  # pylint: disable=broad-except
    return type(error).__name__


# The fork server (F): `runner.py --fork-server SLOT` in a fresh interpreter, started once per
# launcher process (`forkserver.py`). It imports what R needs, then forks one R per request, so
# a sample pays neither the interpreter's start nor these imports. It never runs a sample's code
# or reads a sample's bytes: its requests come from the launcher alone (its stdin), its replies
# go to the launcher alone (its stdout). R is single-threaded as before (F has one thread).
FORK_SERVER_FLAG = "--fork-server"
FORK_SERVER_SLOT = 1024   # bytes of F's command line that a forked R overwrites with its spec


def _fork_server_main() -> int:
  """F: answers `start` (forks an R, replies its pid) and `reap` (waits for an R, replies its
  exit code and CPU seconds) requests, one JSON line each, until its stdin ends."""
  _libc()
  _sibling("judge") if not __package__ else _package_judge()
  _before_forks()
  requests = _Lines(0)
  while True:
    line = requests.readline()
    if line is None:
      return 0
    request = json.loads(line)
    try:
      if request["op"] == "start":
        reply = {"pid": _fork_runner(request)}
      else:   # reap: R was killed or has exited; the launcher saw it through a pidfd
        _, wait_status, usage = os.wait4(int(request["pid"]), 0)
        reply = {"returncode": os.waitstatus_to_exitcode(wait_status),
                 "cpu_s": usage.ru_utime + usage.ru_stime}
    except OSError as error:
      reply = {"error": repr(error)}
    if not _write_line(1, json.dumps(reply)):
      return 3


def _fork_runner(request: dict) -> int:
  """Forks an R that starts as `python runner.py SPEC` would: its own session, the run's
  directory and environment, stdin /dev/null, stdout and stderr the run's files, no other
  descriptor, and the spec path in its command line (the launcher's teardown finds R and I by
  it)."""
  sys.stdout.flush()
  sys.stderr.flush()
  pid = os.fork()   # safe: F has a single thread
  if pid:
    return pid
  code = 70
  try:
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                            (2, request["stderr"], os.O_WRONLY)):
      opened = os.open(path, flags)
      os.dup2(opened, fd)
      os.close(opened)
    _close_fds_except({0, 1, 2})
    _name_in_command_line(request["spec"])
    sys.argv = [sys.argv[0], request["spec"]]
    code = _runner_main(request["spec"])
  except BaseException as error:  # pylint: disable=broad-except
    _write_line(2, f"forked runner failed: {error!r}")
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
  os._exit(code)


def stat_fields(pid) -> list[bytes]:
  """The fields of `/proc/PID/stat` after the command name: field 3 of proc(5) (the state)
  first, so field N is at index N - 3."""
  with open(f"/proc/{pid}/stat", "rb") as f:
    return f.read().rsplit(b")", 1)[1].split()


def _name_in_command_line(text: str) -> None:
  """Writes `text` over F's slot argument in this process's memory, where the kernel reads
  `/proc/PID/cmdline` (between `arg_start` and `arg_end` of `/proc/self/stat`)."""
  ctypes, _ = _libc()
  data = text.encode()
  if len(data) >= FORK_SERVER_SLOT:
    raise ValueError(f"a spec path of {len(data)} bytes does not fit the command-line slot")
  arg_start = int(stat_fields("self")[47 - 2])   # field 48 of proc(5)
  with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read()
  slot = b"\0" + b"." * FORK_SERVER_SLOT + b"\0"
  offset = cmdline.rindex(slot) + 1
  ctypes.memmove(arg_start + offset, data + b"\0" * (FORK_SERVER_SLOT - len(data)),
                 FORK_SERVER_SLOT)


if __name__ == "__main__":
  if sys.argv[1] == FORK_SERVER_FLAG:
    os._exit(_fork_server_main())
  _exit_code = _runner_main(sys.argv[1])
  for _stream in (sys.stdout, sys.stderr):
    _stream.flush()
  os._exit(_exit_code)   # no interpreter teardown: its time is paid per sample
