"""A server's view of a training run's weights as they land (orl_jax/serve/weights_watch.py).

One real tiny ORL run (3 updates, a checkpoint after each, the last two kept, then the export
to params/) is read back; landing is replayed by copying its folders into another work
directory the way Orbax and `params_io.save_params` write them.
"""
import dataclasses
import os
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from safetensors.numpy import load_file

from orl_jax.config import derive as config_lib
from orl_jax import sharding as sharding_lib
from orl_jax.storage.checkpoint import Checkpointer
from orl_jax.models import families
from orl_jax.models.params_io import flatten
from orl_jax.serve import weights_watch as ww
from orl_jax.train.entry import train
from orl_jax.setup.build import build_setup
from orl_jax.setup.resolve import needs_reference
from orl_jax.train.state import abstract_train_state
from orl_jax.models.build import init_model_params
from orl_jax.optimizer import optimizer_of
from tests.support.helpers import orl_smoke_config, tiny_model

STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """(work directory of a finished 3-update run with checkpoints 2 and 3, its setup)."""
  workdir = tmp_path_factory.mktemp("weights_watch") / "run"
  config = orl_smoke_config(workdir, steps=STEPS)
  config.checkpoint.every, config.checkpoint.keep = 1, 2
  train(config, progress=False)
  return str(workdir), build_setup(config)


def _params_like(setup, model_cfg=None):
  """Fresh parameters of the run's model, sharded by its family's rules on its mesh."""
  model_cfg = model_cfg or setup.model_cfg
  _, params = init_model_params(model_cfg, seed=123)
  rules = families.of_model(model_cfg).partition_rules
  return jax.device_put(params, sharding_lib.tree_shardings(params, setup.mesh, rules))


def _flat(params):
  return flatten(nnx.to_pure_dict(jax.device_get(params)))


def _assert_bit_equal(a: dict, b: dict):
  assert sorted(a) == sorted(b)
  for k in a:
    assert a[k].dtype == b[k].dtype, k
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_the_last_checkpoint_gives_the_exported_params_and_reads_nothing_else(run, monkeypatch):
  workdir, setup = run
  assert ww.newest_checkpoint(workdir) == STEPS
  like = _params_like(setup)
  read = []
  deserialize = ocp.type_handlers.ArrayHandler.deserialize

  async def spy(self, infos, args=None):
    read.extend(info.name for info in infos)
    return await deserialize(self, infos, args)

  monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "deserialize", spy)
  got = ww.checkpoint_params(workdir, STEPS, like)
  assert read and all(name.startswith("params.") for name in read)   # no opt_state, step, ...
  assert isinstance(got, nnx.State)
  assert jax.tree.structure(got) == jax.tree.structure(like)
  for g, x in zip(jax.tree.leaves(got), jax.tree.leaves(like)):
    assert g.sharding == x.sharding and g.dtype == x.dtype
  exported = load_file(os.path.join(workdir, "params", "params.safetensors"))
  _assert_bit_equal(_flat(got), exported)


def test_an_earlier_checkpoint_equals_a_full_train_state_restore(run):
  workdir, setup = run
  config = setup.config
  optimizer = optimizer_of(config_lib.optimizer_config(config), setup.model_cfg)
  _, abstract, _ = abstract_train_state(setup.model_cfg, optimizer, setup.mesh, config.seed,
                                        with_reference=needs_reference(config))
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), every=1)
  try:
    full, _ = ckpt.restore(STEPS - 1, abstract)
  finally:
    ckpt.close()
  got = ww.checkpoint_params(workdir, STEPS - 1, _params_like(setup))
  _assert_bit_equal(_flat(got), _flat(full.params))
  # the served dtype may differ from the trained one: the values are cast
  half = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _params_like(setup))
  got16 = ww.checkpoint_params(workdir, STEPS - 1, half)
  _assert_bit_equal(_flat(got16), {k: v.astype(jnp.bfloat16)
                                   for k, v in _flat(full.params).items()})


def test_a_finished_runs_export_is_newer_than_its_last_checkpoint(run):
  workdir, setup = run
  like = _params_like(setup)
  exported = load_file(os.path.join(workdir, "params", "params.safetensors"))
  for path in (workdir, os.path.join(workdir, "params")):
    weights, params = ww.load_newest(path, like)
    assert weights.kind == "params"
    assert weights.version == os.stat(os.path.join(workdir, "params", "meta.json")).st_mtime_ns
    _assert_bit_equal(_flat(params), exported)
    assert all(p.sharding == x.sharding for p, x in zip(jax.tree.leaves(params),
                                                         jax.tree.leaves(like)))


def test_a_relative_work_directory_as_the_docs_print_it_is_read(run, monkeypatch):
  """`--config.serve.watch=work_dirs/RUN` (relative to where the server starts; Orbax itself
  refuses relative paths): the watcher reports the run's checkpoints and they are read."""
  workdir, setup = run
  base = os.path.dirname(os.path.dirname(workdir))
  monkeypatch.chdir(base)
  relative = os.path.relpath(workdir, base)           # <folder>/run, as work_dirs/RUN
  assert not os.path.isabs(relative) and not relative.startswith("..")
  like = _params_like(setup)
  got = ww.checkpoint_params(relative, STEPS, like)
  _assert_bit_equal(_flat(got), _flat(ww.checkpoint_params(workdir, STEPS, like)))
  seen = []
  ww.WeightsWatcher(relative, seen.append).poll()
  assert seen == [ww.load_newest(workdir, like)[0]]


def test_another_models_checkpoint_is_a_one_sentence_error(run):
  workdir, setup = run
  state_dir = os.path.join(workdir, "checkpoints", str(STEPS), "state")
  wider = dataclasses.replace(setup.model_cfg, mlp_dim=2 * setup.model_cfg.mlp_dim)
  with pytest.raises(ValueError) as e:
    ww.checkpoint_params(workdir, STEPS, _params_like(setup, wider))
  msg = str(e.value)
  assert state_dir in msg and "another model" in msg and "\n" not in msg
  assert "layers.0.mlp.up_proj.kernel is (32, 64) there but (32, 128) here" in msg
  _, other = nnx.split(tiny_model(), nnx.Param)     # other tensors altogether (no adapter)
  with pytest.raises(ValueError, match="tensor\\(s\\) only there: adapter") as e:
    ww.checkpoint_params(workdir, STEPS, other)
  assert state_dir in str(e.value) and "\n" not in str(e.value)
  with pytest.raises(FileNotFoundError, match="no checkpoint of step 99"):
    ww.checkpoint_params(workdir, 99, other)


class _Landing:
  """Copies the run's folders into `target` as Orbax and `save_params` write them. Each landing
  stamps its marker (commit file, meta.json) one second after the previous one, so that a file
  system with a coarse clock cannot tie them."""

  def __init__(self, source: str, target: str):
    self.source, self.target = source, target
    self.clock = time.time_ns()
    os.makedirs(os.path.join(target, "checkpoints"))

  def stamp(self, path: str):
    self.clock += 1_000_000_000
    os.utime(path, ns=(self.clock, self.clock))

  def copy(self, name: str, to: str) -> str:
    dst = os.path.join(self.target, to)
    shutil.copytree(os.path.join(self.source, name), dst, copy_function=shutil.copy)
    return dst

  def begin_checkpoint(self, step: int, as_step: int) -> str:
    """Step `step` being written as `as_step` the Orbax way: into a temporary folder."""
    tmp = self.copy(f"checkpoints/{step}", f"checkpoints/{as_step}.orbax-checkpoint-tmp-1234")
    self.stamp(os.path.join(tmp, ww.COMMIT_FILE))
    return tmp

  def commit_checkpoint(self, tmp: str):
    """... renamed when complete."""
    os.rename(tmp, tmp.split(".orbax-checkpoint-tmp")[0])

  def params(self):
    self.copy("params", "params")
    self.stamp(os.path.join(self.target, "params", "meta.json"))


def test_the_watcher_reports_each_landing_once_and_never_a_half_written_one(run, tmp_path):
  workdir, setup = run
  land = _Landing(workdir, str(tmp_path / "serving"))
  target = land.target
  reported = []
  watcher = ww.WeightsWatcher(target, reported.append)
  assert watcher.poll() is None and ww.newest_checkpoint(target) is None

  tmp = land.begin_checkpoint(2, as_step=2)
  assert watcher.poll() is None and ww.newest_checkpoint(target) is None
  land.commit_checkpoint(tmp)
  assert watcher.poll() == ("checkpoint", 2)
  assert watcher.poll() is None and watcher.poll() is None
  assert reported == [("checkpoint", 2)] and watcher.last == ("checkpoint", 2)

  # a step folder without Orbax's commit marker (a commit-file save still in progress)
  unfinished = land.copy("checkpoints/3", "checkpoints/3")
  os.remove(os.path.join(unfinished, ww.COMMIT_FILE))
  assert ww.newest_checkpoint(target) == 2 and watcher.poll() is None
  with pytest.raises(ValueError, match="is not a complete checkpoint"):
    ww.checkpoint_params(target, 3, _params_like(setup))
  shutil.copy(os.path.join(workdir, "checkpoints", "3", ww.COMMIT_FILE), unfinished)
  land.stamp(os.path.join(unfinished, ww.COMMIT_FILE))
  assert watcher.poll() == ("checkpoint", 3) and watcher.poll() is None

  land.params()                      # the run finished: its export is the newest
  meta_mtime = os.stat(os.path.join(target, "params", "meta.json")).st_mtime_ns
  assert watcher.poll() == ("params", meta_mtime) and watcher.poll() is None
  land.commit_checkpoint(land.begin_checkpoint(3, as_step=4))   # ... until it is resumed
  assert watcher.poll() == ("checkpoint", 4) and watcher.poll() is None
  assert reported == [("checkpoint", 2), ("checkpoint", 3), ("params", meta_mtime),
                      ("checkpoint", 4)]
  weights, params = ww.load_newest(target, _params_like(setup))
  assert weights == ("checkpoint", 4)
  _assert_bit_equal(_flat(params), load_file(os.path.join(workdir, "params",
                                                          "params.safetensors")))

  # what the server already serves is not reported again; a failed load is reported again
  assert ww.WeightsWatcher(target, reported.append, seen=weights).poll() is None
  fails = [True]

  def load(weights):
    if fails.pop() if fails else False:
      raise OSError("disk full")

  retrying = ww.WeightsWatcher(target, load)
  with pytest.raises(OSError):
    retrying.poll()
  assert retrying.poll() == ("checkpoint", 4) and retrying.poll() is None
