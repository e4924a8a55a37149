"""The files a sample can read, copied once into memory (a directory on the `/dev/shm` tmpfs).

Every sample reads the same system files: the interpreter's standard library and the shared
libraries it loads. Read from the host's disk they are a channel that outlives its sender: a
file one sample read is in the page cache, and a later sample can tell from the time its own
read takes (a cold read takes milliseconds, a cached one a tenth of that). A copy on tmpfs has
no cold state: every page is in memory, so a read takes the same time whoever read before.

The copy holds the standard-library directories of `python -I -S` (without `site-packages`,
the test suites, IDLE, Tk, turtle demos, `ensurepip`, `lib2to3` and the static-library
`config-*` directory), the shared libraries that importing every
standard-library extension module maps (read from `/proc/self/maps` of a helper interpreter),
the interpreter itself, `/etc/ld.so.cache`, `/etc/localtime` and `/usr/share/zoneinfo`. About
80-100 MiB for CPython 3.11; built once per machine and interpreter (keyed by what it copies)
and reused by every later run and process; it stays as a cache (delete the directory to reclaim
the memory). The sample's root binds it read-only at the original
paths (`runner._build_root`), and the sandbox's own few modules from the host (every run reads
them, so they are always cached). Not used when the launcher is not root (a user namespace cannot
bind a directory of `/dev/shm` executable where it is mounted `noexec`), when installed packages
are visible (`site_packages=True`), or when `/dev/shm` is not a tmpfs: the host files are bound
then, and the layer `memory-image` is missing from `SandboxResult.isolation`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading

SKIPPED_DIRS = frozenset(("site-packages", "dist-packages", "test", "tests", "idlelib", "tkinter",
                          "turtledemo", "ensurepip", "lib2to3"))
EXTRA_FILES = ("/etc/ld.so.cache", "/etc/localtime")
EXTRA_DIRS = ("/usr/share/zoneinfo",)
PARENT = "/dev/shm/orl_sandbox_image"

# Imports every standard-library extension module (Tk aside), then names the files mapped.
_DISCOVER = r"""
import importlib, json, os, sys
for directory in [p for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)]:
    for name in sorted(os.listdir(directory)):
        module = name.split(".")[0]
        if not module.startswith(("_tkinter", "_test", "xx")):
            try:
                importlib.import_module(module)
            except Exception:
                pass
mapped = set()
with open("/proc/self/maps") as f:
    for line in f:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and os.path.isfile(fields[5].strip()):
            mapped.add(fields[5].strip())
print(json.dumps({"mapped": sorted(mapped), "path": [p for p in sys.path if p]}))
"""

_lock = threading.Lock()
_built: list = []   # [the image's directory or None], once built


def _is_tmpfs(path: str) -> bool:
  try:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
      for line in f:
        left, _, right = line.partition(" - ")
        if left.split()[4] == path:
          return right.split()[0] == "tmpfs"
  except (OSError, IndexError):
    pass
  return False


def _sources() -> tuple[list[str], list[str]]:
  """(directories, files) to copy, as real paths."""
  found = json.loads(subprocess.run(
      [sys.executable, "-I", "-S", "-c", _DISCOVER], capture_output=True, text=True, check=True,
      timeout=120, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}).stdout)
  directories = [p for p in found["path"] if os.path.isdir(p)]
  directories += [p for p in EXTRA_DIRS if os.path.isdir(p)]
  files = found["mapped"] + [os.path.realpath(sys.executable)]
  files += [p for p in EXTRA_FILES if os.path.exists(p)]
  real_dirs = sorted({os.path.realpath(d) for d in directories})
  real_files = sorted({os.path.realpath(f) for f in files}
                      - {f for f in files for d in real_dirs if f.startswith(d + "/")})
  return real_dirs, real_files


def _walk(directory: str):
  for parent, dirs, names in os.walk(directory):
    dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("config-"))
    for name in sorted(names):
      path = os.path.join(parent, name)
      if os.path.isfile(path) and not os.path.islink(path):
        yield path


def _key(directories: list[str], files: list[str]) -> str:
  digest = hashlib.sha256(sys.version.encode())
  for path in [f for d in directories for f in _walk(d)] + files:
    info = os.stat(path)
    digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
  return digest.hexdigest()[:24]


def _copy(source: str, image: str) -> None:
  target = image + source
  os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
  shutil.copyfile(source, target)
  os.chmod(target, 0o755 if os.stat(source).st_mode & 0o111 else 0o644)


def _link_sonames(files: list[str], image: str) -> None:
  """The symbolic links next to each copied library that lead to it (`libz.so.1` ->
  `libz.so.1.2.13`): the dynamic loader opens a library by such a name."""
  wanted = set(files)
  for directory in sorted({os.path.dirname(f) for f in files}):
    for name in sorted(os.listdir(directory)):
      path = os.path.join(directory, name)
      if os.path.islink(path) and os.path.realpath(path) in wanted and not os.path.lexists(
          image + path):
        os.symlink(os.readlink(path), image + path)


def _trusted_dir(path: str) -> bool:
  """A directory of ours that nobody else can write to (a reused image must be the one we built)."""
  try:
    info = os.lstat(path)
  except OSError:
    return False
  return (os.path.isdir(path) and not os.path.islink(path) and info.st_uid == os.geteuid()
          and not info.st_mode & 0o022)


def _build() -> str | None:
  if os.geteuid() != 0 or not _is_tmpfs("/dev/shm"):
    return None
  directories, files = _sources()
  image = os.path.join(PARENT, _key(directories, files))
  os.makedirs(PARENT, 0o755, exist_ok=True)
  if not _trusted_dir(PARENT):   # made by someone else: nothing is written into it
    return None
  os.chmod(PARENT, 0o755)          # (a umask may have narrowed it: every sample's uid reads)
  if _trusted_dir(image):
    return image
  staging = f"{image}.{os.getpid()}.{threading.get_ident()}"
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging, 0o755)
  for source in [f for d in directories for f in _walk(d)] + files:
    _copy(source, staging)
  _link_sonames(files, staging)
  os.chmod(staging, 0o755)
  for parent, dirs, _ in os.walk(staging):
    for name in dirs:
      os.chmod(os.path.join(parent, name), 0o755)
  try:
    os.rename(staging, image)
  except OSError:   # another process finished the same image first
    shutil.rmtree(staging, ignore_errors=True)
  return image if _trusted_dir(image) else None


def image() -> str | None:
  """The memory-resident copy's directory (built on first use), or None where there is none."""
  with _lock:
    if not _built:
      try:
        _built.append(_build())
      except (OSError, ValueError, subprocess.SubprocessError) as error:
        print(f"orl_sandbox: no memory-resident system image ({error!r}); the sample reads the "
              "host's files", file=sys.stderr)
        _built.append(None)
    return _built[0]
