"""The machine record a training leaves in its params folder's meta.json (`storage/machine.py`):
what it holds, and which of its fields decide whether two trainings can be bit-identical."""
import os

import jax
import pytest

from orl_jax.storage import machine as machine_lib


def test_the_record_names_this_process_cpu_cores_flags_and_versions(monkeypatch):
  import jaxlib
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
  record = machine_lib.machine()
  assert record["xla_flags"] == "--xla_cpu_max_isa=AVX2"    # read when called, not at import
  assert record["cores"] == len(os.sched_getaffinity(0))
  assert record["jax"] == jax.__version__ and record["jaxlib"] == jaxlib.__version__
  assert record["cpu"] and set(record["cpu_flags"]) <= set(machine_lib.CPU_FLAGS)
  assert record["cpu_flags"] == sorted(record["cpu_flags"])
  with open("/proc/cpuinfo") as f:
    flags_line = next((line for line in f if line.startswith(("flags", "Features"))), "")
  listed = set(flags_line.partition(":")[2].split())
  assert set(record["cpu_flags"]) == listed & set(machine_lib.CPU_FLAGS)


@pytest.mark.parametrize("field", machine_lib.DECIDING)
def test_each_deciding_field_breaks_the_promise(field):
  a = machine_lib.machine()
  b = dict(a, **{field: "other"})
  assert machine_lib.same_machine(a, dict(a)) and not machine_lib.same_machine(a, b)


def test_the_fields_for_people_do_not_decide():
  a = machine_lib.machine()
  assert machine_lib.same_machine(a, dict(a, python="2.7", os="other", device="other"))
  assert not machine_lib.same_machine(None, a) and not machine_lib.same_machine(a, None)
  assert not machine_lib.same_machine({}, {})          # an empty record promises nothing
