"""Run untrusted Python in a separate, limited process (DESIGN §5, "Sandboxed execution").

Model completions are untrusted code. `run_python(source, limits)` never executes them in the
calling (JAX) process and never forks it: it starts a *fresh interpreter* with `subprocess`
(fork+exec in C, no Python `preexec_fn`, so it is safe from a multi-threaded parent) running this
file as a small runner script. Only the standard library is imported at module level so the file
can run as that script (`python -I -S sandbox.py <spec.json>`).

Layers, outermost first. Each one that took effect is named in `SandboxResult.isolation`:

* launcher (the calling process): a fresh private directory (the runner's cwd is `work/` inside
  it; deleted afterwards), a new environment with nothing inherited (a fixed `PATH`, `LANG`,
  `LC_ALL`; `HOME` and `TMPDIR` point at `work/`), stdin `/dev/null`, stdout/stderr to files
  that are read back truncated, a new session (process group), and a wall-clock timeout after
  which the whole group is `SIGKILL`ed (without a PID namespace, also every process whose cwd
  is still inside `work/`).
* runner, outer process: `unshare` of new network, PID and IPC namespaces (`netns`, `pidns`;
  plus a user namespace when not root) — the code then has only a down loopback device and
  cannot see or signal any process outside; it runs as PID 1 of its namespace, so when it exits
  or is killed the kernel kills everything it spawned.
* runner, inner process (runs the code): parent-death signal (dies with the runner),
  `RLIMIT_AS`, `RLIMIT_CPU`, `RLIMIT_NPROC`, `RLIMIT_FSIZE`, `RLIMIT_NOFILE`, `RLIMIT_CORE`=0;
  when started as root it drops to an unprivileged uid (`nobody`, 65534) — root ignores
  `RLIMIT_NPROC` and file permissions. Landlock (Linux ≥ 5.13) confines file *reads* to the
  interpreter's own directories, system libraries (`/usr`, `/lib*`) and the sandbox directory,
  and file *writes* to the sandbox directory; it denies TCP bind/connect (ABI ≥ 4), signals and
  abstract unix sockets outside the sandbox (ABI ≥ 6), and ptrace-style access
  (`/proc/<pid>/environ`, `mem`) to processes outside it. With Landlock in force the dropped
  process keeps one capability, CAP_DAC_READ_SEARCH, so it can read an interpreter installed
  under a private directory such as `/root/.pyenv` (Landlock still bounds what it reads);
  without Landlock it keeps none. Finally `socket.socket` is replaced by a function that raises
  (a courtesy for honest code: bypassable, not a security boundary).

A run passes only if the inner process finished the whole program without an exception and
wrote its pass marker; `sys.exit(0)` / `os._exit(0)` before the tests therefore fail. The marker
is written by code in the same process as the sample, so a sample written to forge it on purpose
could; no in-process check can prevent that.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SANDBOX_UID = 65534   # `nobody`: the uid untrusted code runs as when the launcher is root
PASS_MARKER = "PASS"

_RUNNER_PATH = os.path.abspath(__file__)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Resource limits of one sandboxed run.

  Attributes:
    timeout_s: wall-clock seconds before the whole process tree is killed.
    memory_bytes: `RLIMIT_AS` (virtual address space) of each process.
    cpu_s: `RLIMIT_CPU` seconds; None → `ceil(timeout_s) + 1`.
    max_processes: `RLIMIT_NPROC`. The kernel counts it per uid: under a root launcher all
      concurrent sandboxes share uid 65534 (they need no forks of their own, so a fork bomb in
      one does not stop the others).
    max_file_bytes: `RLIMIT_FSIZE`: the largest file the code can write (stdout/stderr too).
    max_output_bytes: how much of stdout and of stderr is kept in the result.
    max_open_files: `RLIMIT_NOFILE`.
    site_packages: False runs the interpreter with `-S` (stdlib only, faster start-up).
  """
  timeout_s: float = 10.0
  memory_bytes: int = 1 << 30
  cpu_s: int | None = None
  max_processes: int = 16
  max_file_bytes: int = 16 << 20
  max_output_bytes: int = 16 << 10
  max_open_files: int = 256
  site_packages: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """What one sandboxed run did.

  Attributes:
    passed: the program ran to its end without an exception (exit 0 and pass marker seen).
    timed_out: the wall-clock timeout fired and the process tree was killed.
    returncode: exit status of the runner; negative = killed by that signal; None if unknown.
    stdout: the first `max_output_bytes` of stdout, decoded with replacement.
    stderr: the same for stderr (tracebacks land here).
    isolation: names of the isolation layers that took effect (see module docstring).
    wall_s: seconds from launch to reaping.
  """
  passed: bool
  timed_out: bool
  returncode: int | None
  stdout: str
  stderr: str
  isolation: tuple[str, ...]
  wall_s: float


def run_python(source: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
  """Runs `source` as `__main__` in a fresh, limited interpreter and reports the result.

  Safe to call from many threads at once (each call has its own process and directory).
  """
  base_dir = tempfile.mkdtemp(prefix="orl_sandbox_")
  try:
    return _run_in(base_dir, source, limits)
  finally:
    _remove_tree(base_dir)


def _run_in(base_dir: str, source: str, limits: SandboxLimits) -> SandboxResult:
  """Lays out `base_dir`, launches the runner, waits, kills on timeout, collects the result."""
  as_root = os.geteuid() == 0
  work_dir = os.path.join(base_dir, "work")
  os.mkdir(work_dir, 0o700)
  # `nobody` must traverse base_dir to reach work/ but may not list or change it.
  os.chmod(base_dir, 0o711 if as_root else 0o700)
  paths = {name: os.path.join(base_dir, name)
           for name in ("program.py", "spec.json", "stdout", "stderr", "status")}
  _write_private(paths["program.py"], source)
  spec = {
      "work_dir": work_dir,
      "program": paths["program.py"],
      "status": paths["status"],
      "uid": SANDBOX_UID if as_root else None,
      "memory_bytes": int(limits.memory_bytes),
      "cpu_s": int(limits.cpu_s or int(limits.timeout_s + 0.999) + 1),
      "max_processes": int(limits.max_processes),
      "max_file_bytes": int(limits.max_file_bytes),
      "max_open_files": int(limits.max_open_files),
  }
  _write_private(paths["spec.json"], json.dumps(spec))
  command = [sys.executable, "-I"] + ([] if limits.site_packages else ["-S"])
  command += [_RUNNER_PATH, paths["spec.json"]]
  start = time.monotonic()
  timed_out = False
  with open(paths["stdout"], "wb") as out, open(paths["stderr"], "wb") as err:
    proc = subprocess.Popen(command, cwd=work_dir, env=_scrubbed_env(work_dir),
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            close_fds=True, start_new_session=True)
    try:
      returncode = proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      _kill_group(proc.pid)
      returncode = proc.wait()
  wall_s = time.monotonic() - start
  status = _read_text(paths["status"], 4096).splitlines()
  isolation = tuple(line.split(":", 1)[1] for line in status if line.startswith("layer:"))
  if "pidns" not in isolation:
    _kill_stragglers(work_dir)   # without a PID namespace, forked children could outlive us
  passed = (not timed_out and returncode == 0 and PASS_MARKER in status)
  return SandboxResult(passed=passed, timed_out=timed_out, returncode=returncode,
                       stdout=_read_text(paths["stdout"], limits.max_output_bytes),
                       stderr=_read_text(paths["stderr"], limits.max_output_bytes),
                       isolation=isolation, wall_s=wall_s)


def probe_isolation(limits: SandboxLimits = SandboxLimits(timeout_s=30.0)) -> tuple[str, ...]:
  """Names the isolation layers this machine grants (runs one trivial program)."""
  return run_python("pass\n", limits).isolation


def _scrubbed_env(work_dir: str) -> dict[str, str]:
  """A minimal environment: nothing secret from the parent survives."""
  return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
          "HOME": work_dir, "TMPDIR": work_dir, "PYTHONDONTWRITEBYTECODE": "1"}


def _write_private(path: str, text: str) -> None:
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(text)


def _read_text(path: str, max_bytes: int) -> str:
  try:
    with open(path, "rb") as f:
      return f.read(max_bytes).decode("utf-8", errors="replace")
  except OSError:
    return ""


def _kill_group(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _kill_stragglers(work_dir: str) -> None:
  """Kills processes whose cwd is still inside `work_dir` (fallback when there is no pidns)."""
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
      continue
    if cwd == work_dir or cwd.startswith(work_dir + "/") or cwd.startswith(work_dir + " "):
      try:
        os.kill(int(pid), signal.SIGKILL)
      except OSError:
        pass


def _remove_tree(path: str) -> None:
  """Deletes a sandbox directory even if the code made parts of it read-only."""
  def make_writable_and_retry(function, failed_path, _):
    try:
      os.chmod(os.path.dirname(failed_path), 0o700)
      if os.path.isdir(failed_path) and not os.path.islink(failed_path):
        os.chmod(failed_path, 0o700)
      function(failed_path)
    except OSError:
      pass
  shutil.rmtree(path, onerror=make_writable_and_retry)


# --------------------------------------------------------------------------------------------
# Runner: everything below executes in the fresh interpreter, never in the launcher.
# --------------------------------------------------------------------------------------------

_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_KEEPCAPS = 8
_PR_SET_NO_NEW_PRIVS = 38
_CAP_DAC_READ_SEARCH = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

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
  return ctypes, ctypes.CDLL(None, use_errno=True)


def _try_unshare(as_root: bool) -> list[str]:
  """Enters new namespaces (outer runner, still single-threaded). Returns the layers gained."""
  ctypes, libc = _libc()
  user = 0 if as_root else _CLONE_NEWUSER
  candidates = [
      (user | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC, ["netns", "pidns"]),
      (user | _CLONE_NEWNET, ["netns"]),
      (user | _CLONE_NEWPID, ["pidns"]),
  ]
  uid, gid = os.getuid(), os.getgid()
  for flags, layers in candidates:
    if libc.unshare(ctypes.c_int(flags)) != 0:
      continue
    if not as_root:
      _map_own_ids(uid, gid)   # files created by the code must have a mapped owner
      layers = ["userns"] + layers
    return layers
  return []


def _map_own_ids(uid: int, gid: int) -> None:
  for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                     ("gid_map", f"{gid} {gid} 1")):
    try:
      with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
        f.write(text)
    except OSError:
      pass


def _set_limits(spec: dict) -> None:
  import resource  # pylint: disable=import-outside-toplevel
  cpu = spec["cpu_s"]
  for limit, value in ((resource.RLIMIT_AS, spec["memory_bytes"]),
                       (resource.RLIMIT_CPU, cpu),      # soft == hard: SIGKILL, even for PID 1
                       (resource.RLIMIT_NPROC, spec["max_processes"]),
                       (resource.RLIMIT_FSIZE, spec["max_file_bytes"]),
                       (resource.RLIMIT_NOFILE, spec["max_open_files"]),
                       (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))


def _landlock_abi() -> int:
  """The kernel's Landlock ABI version; 0 when Landlock is unavailable."""
  ctypes, libc = _libc()
  libc.syscall.restype = ctypes.c_long
  abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
  return max(int(abi), 0)


def _drop_privileges(uid: int, keep_read_search: bool) -> None:
  """Becomes `uid`; optionally keeps only CAP_DAC_READ_SEARCH (see `_inner_main`)."""
  ctypes, libc = _libc()
  if keep_read_search:
    libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0)
  os.setgroups([])
  os.setgid(uid)
  os.setuid(uid)
  if os.getuid() != uid or os.geteuid() != uid:
    raise RuntimeError("sandbox: could not drop root privileges")
  if keep_read_search:

    class CapHeader(ctypes.Structure):
      _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class CapData(ctypes.Structure):
      _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                  ("inheritable", ctypes.c_uint32)]

    keep = 1 << _CAP_DAC_READ_SEARCH
    data = (CapData * 2)(CapData(keep, keep, 0), CapData(0, 0, 0))
    if libc.capset(ctypes.byref(CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
      raise RuntimeError("sandbox: capset failed")


def _readable_roots(work_dir: str) -> list[str]:
  """Paths the code may read beneath: the interpreter, system libraries, its own directory."""
  roots = [sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix]
  roots += [path for path in sys.path if path]
  roots += ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/etc/ld.so.cache", "/etc/localtime",
            "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", work_dir]
  return [path for path in dict.fromkeys(os.path.realpath(p) for p in roots)
          if os.path.exists(path)]


def _landlock_layers(work_dir: str, abi: int) -> list[str]:
  """Confines file reads to `_readable_roots`, writes to `work_dir`; no TCP, no outside signals."""
  if abi < 1:
    return []
  ctypes, libc = _libc()
  libc.syscall.restype = ctypes.c_long

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
  rules = [(path, read_access) for path in _readable_roots(work_dir)]
  rules += [(work_dir, read_access | write_access), ("/dev/null", _FS_WRITE_FILE | truncate)]
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
          raise RuntimeError(f"sandbox: landlock_add_rule failed for {path}")
      finally:
        os.close(path_fd)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
      raise RuntimeError("sandbox: PR_SET_NO_NEW_PRIVS failed")
    if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset_fd),
                    ctypes.c_uint32(0)) != 0:
      raise RuntimeError("sandbox: landlock_restrict_self failed")
  finally:
    os.close(ruleset_fd)
  return layers


def _block_socket_module() -> None:
  """Makes `socket.socket(...)` raise: a courtesy layer, bypassable, not a boundary."""
  import _socket  # pylint: disable=import-outside-toplevel
  import socket  # pylint: disable=import-outside-toplevel

  def refuse(*args, **kwargs):
    del args, kwargs
    raise PermissionError("network access is disabled in the sandbox")

  for module in (socket, _socket):
    for name in ("socket", "SocketType", "socketpair", "create_connection", "create_server",
                 "fromfd", "getaddrinfo"):
      if hasattr(module, name):
        setattr(module, name, refuse)


def _inner_main(spec: dict, source: str, status_fd: int, outer_pid: int) -> None:
  """Applies the per-process limits, runs the program, writes the pass marker. Never returns."""
  import traceback  # pylint: disable=import-outside-toplevel
  exit_code = 1
  try:
    ctypes, libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    # The runner died before prctl took effect (a parent outside our PID namespace reads as 0).
    if os.getppid() not in (outer_pid, 0):
      os._exit(1)
    layers = ["rlimits"]
    _set_limits(spec)
    abi = _landlock_abi()
    if spec["uid"] is not None:
      # The interpreter may live where `nobody` cannot read (e.g. /root/.pyenv). With Landlock
      # confining reads to the interpreter and system directories, the code keeps the one
      # capability that bypasses read permission checks; without Landlock it gets none.
      _drop_privileges(spec["uid"], keep_read_search=abi >= 1)
      layers.append(f"uid:{spec['uid']}")
    layers += _landlock_layers(spec["work_dir"], abi)
    _block_socket_module()
    layers.append("socket-patch")
    os.write(status_fd, "".join(f"layer:{name}\n" for name in layers).encode())
    os.chdir(spec["work_dir"])
    sys.argv = ["program.py"]
    code = compile(source, "program.py", "exec")
    my_pid = os.getpid()
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})  # pylint: disable=exec-used
    if os.getpid() == my_pid:   # a forked child finishing the program does not count
      os.write(status_fd, f"{PASS_MARKER}\n".encode())
      exit_code = 0
  except BaseException:  # pylint: disable=broad-except
    try:
      traceback.print_exc()
    except BaseException:  # pylint: disable=broad-except
      pass
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:  # pylint: disable=broad-except
      pass
  os._exit(exit_code)


def _runner_main(spec_path: str) -> int:
  """Outer runner: namespaces, then fork the process that runs the code, relay its status."""
  with open(spec_path, encoding="utf-8") as f:
    spec = json.load(f)
  with open(spec["program"], encoding="utf-8") as f:
    source = f.read()
  status_fd = os.open(spec["status"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
  as_root = os.geteuid() == 0
  layers = _try_unshare(as_root)
  os.write(status_fd, "".join(f"layer:{name}\n" for name in layers).encode())
  if spec["uid"] is not None:
    os.chown(spec["work_dir"], spec["uid"], spec["uid"])
  outer_pid = os.getpid()
  sys.stdout.flush()
  sys.stderr.flush()
  child = os.fork()   # safe: this fresh interpreter has a single thread
  if child == 0:
    _inner_main(spec, source, status_fd, outer_pid)
  os.close(status_fd)
  _, wait_status = os.waitpid(child, 0)
  if os.WIFSIGNALED(wait_status):
    return 128 + os.WTERMSIG(wait_status)
  return os.WEXITSTATUS(wait_status)


if __name__ == "__main__":
  sys.exit(_runner_main(sys.argv[1]))
