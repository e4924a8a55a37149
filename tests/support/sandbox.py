"""Looking for the sandbox's processes from a test."""
import pathlib

from orl_sandbox import launcher as sandbox


def sandbox_processes(root: pathlib.Path) -> list[int]:
  """Pids of live (non-zombie) processes running the sandbox runner on a spec under `root` (a
  test's private temp root: other processes' sandboxes are not counted)."""
  runner = pathlib.Path(sandbox.RUNNER_PATH).resolve().as_posix().encode()
  pids = []
  for entry in pathlib.Path("/proc").iterdir():
    if not entry.name.isdigit():
      continue
    try:
      cmdline = (entry / "cmdline").read_bytes()
      if runner in cmdline and str(root).encode() in cmdline and b"\nState:\tZ" not in (
          entry / "status").read_bytes():
        pids.append(int(entry.name))
    except OSError:
      continue
  return pids
