"""One folder per run and per evaluation (orl_jax/apps/outputs.py,
docs/training.md#work-directories): a run on another task file gets its own work directory; an
evaluation or a decode of one run scores that run's task and writes beside it, never into the
config variant's run folder; an evaluation with another set-up goes to a new folder and the old
table stays."""
import json
import os
import subprocess
import sys

import pytest

from configs import llada
from orl_jax.apps import outputs
from orl_jax.evaluate import SETUP_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MINE = ('{"id": "m1", "prompt": "What is 2 + 2? Answer with the number after ####.", '
        '"answer": 4}\n'
        '{"id": "m2", "prompt": "What is 3 + 4? Answer with the number after ####.", '
        '"answer": 7}\n'
        '{"id": "m3", "prompt": "What is 5 + 1? Answer with the number after ####.", '
        '"answer": 6}\n')


@pytest.fixture(scope="module")
def my_run(tmp_path_factory, finished_run):
  """A finished configs/llada.py:debug-jsonl run trained on a task file of its own, and that
  file."""
  data = tmp_path_factory.mktemp("data") / "my_train.jsonl"
  data.write_text(MINE)
  workdir = tmp_path_factory.mktemp("runs") / "mine"
  config = llada.get_config("debug-jsonl")
  config.task.path, config.workdir = str(data), str(workdir)
  finished_run(workdir, config)
  os.makedirs(workdir / "hf")
  return workdir, data


def test_a_run_on_another_task_file_gets_its_own_work_directory():
  config = llada.get_config("debug-jsonl")
  assert outputs.train_workdir(config, set()) == "work_dirs/llada_debug_jsonl"
  config.task.path = "data/my train.jsonl"
  assert outputs.train_workdir(config, {"task.path"}) == "work_dirs/llada_debug_jsonl_my_train"
  assert outputs.train_workdir(config, {"task.path", "workdir"}) == config.workdir
  assert outputs.train_workdir(config, {"task"}) == "work_dirs/llada_debug_jsonl_my_train"
  assert outputs.train_workdir(config, {"train.steps"}) == config.workdir   # the variant's


def test_weights_of_one_run_belong_to_it(my_run, tmp_path):
  run, _ = my_run
  for path in (run, run / "params", run / "hf"):
    assert outputs.owning_run(str(path)) == str(run)
  assert outputs.owning_run(str(tmp_path)) is None
  assert outputs.owning_run("random") is None
  config = llada.get_config("debug-jsonl")
  models = [(str(run / "hf"), "hf")]
  assert outputs.eval_base(config, models, set()) == str(run / "eval")
  assert outputs.page_path(config, models, set()) == str(run / "trajectories.html")
  assert outputs.eval_base(config, models, {"workdir"}) == config.workdir
  pair = [(str(run), "mine"), ("/x/Base Model", "base")]
  assert outputs.eval_base(config, pair, set()) == os.path.join("work_dirs", "mine_vs_base",
                                                                "eval")
  assert outputs.page_path(config, [("/x/LLaDA-8B", "LLaDA-8B")], set()) == os.path.join(
      "work_dirs", "LLaDA-8B", "trajectories.html")


def test_another_set_up_goes_to_a_new_folder_and_the_old_table_stays(tmp_path):
  base = str(tmp_path / "eval")
  assert outputs.evaluation_folder(base, "A") == (base, "")
  os.makedirs(base)
  (tmp_path / "eval" / SETUP_FILE).write_text(json.dumps({"setup": "A"}))
  assert outputs.evaluation_folder(base, "A") == (base, "")
  folder, note = outputs.evaluation_folder(base, "B")
  assert folder == base + "_2" and note == (
      f"{base} holds an evaluation with another set-up (task, eval.n_problems or decode.*), "
      f"which stays there; this one goes to {base}_2")
  os.makedirs(base + "_2")
  (tmp_path / "eval_2" / SETUP_FILE).write_text(json.dumps({"setup": "B"}))
  assert outputs.evaluation_folder(base, "B")[0] == base + "_2"
  assert outputs.evaluation_folder(base, "C")[0] == base + "_3"


def test_one_run_is_evaluated_on_its_own_task_unless_told(my_run):
  run, data = my_run
  config = llada.get_config("debug-jsonl")
  assert outputs.trained_task(str(run)) == {"task.name": "jsonl", "task.path": str(data)}
  note = outputs.use_trained_task(config, [(str(run), "mine")], set())
  assert config.task.path == str(data)
  assert note == (f"task: {data}, the one mine was trained on (--config.task.path or "
                  "--config.task.name to evaluate another)")
  config = llada.get_config("debug-jsonl")
  example = config.task.path
  assert outputs.use_trained_task(config, [(str(run), "mine")], {"task.path"}) == ""
  assert outputs.use_trained_task(config, [(str(run), "a"), ("random", "b")], set()) == ""
  assert config.task.path == example


def test_eval_of_my_run_scores_my_file_and_writes_beside_it(my_run, tmp_path):
  """The launcher, as a user runs it right after the example: the run's own three problems,
  results in <run>/eval; fewer problems (another set-up) -> <run>/eval_2, the first table kept."""
  run, data = my_run
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  base = [sys.executable, "launch/eval.py", "--config=configs/llada.py:debug-jsonl",
          f"--config.model.path={run}", "--config.eval.settings=('threshold_0.9',)"]
  first = subprocess.run(base + ["--config.eval.n_problems=0"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]
  assert f"task: {data}, the one mine was trained on" in first.stdout
  assert "on 3 of the 3" in first.stdout, first.stdout
  assert f"results: {run}/eval/results.json" in first.stdout
  table = (run / "eval" / "results_table.txt").read_text()
  second = subprocess.run(base + ["--config.eval.n_problems=2"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
  assert second.returncode == 0, second.stderr[-3000:]
  assert f"{run}/eval holds an evaluation with another set-up" in second.stdout
  assert f"results: {run}/eval_2/results.json" in second.stdout
  assert (run / "eval" / "results_table.txt").read_text() == table
  assert not os.path.exists(os.path.join(ROOT, "work_dirs", "llada_debug_jsonl", "eval"))
