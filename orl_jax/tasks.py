"""Task registry: problems, tokenizer and verifier for `config.task.name`.

* ``tiny``      — the procedural arithmetic task (train and eval, its own word tokenizer).
* ``gsm8k``     — GSM8K test (1319, evaluation only: there is no offline train split);
                  prompts by `prompts.gsm8k_prompt(k_shot=task.k_shot, chat=task.chat)`.
* ``humaneval`` — HumanEval (164, evaluation only), unit tests in the sandbox.
* ``jsonl``     — a user file (`task.path`, schema in `data/jsonl.py`): train and eval; answer
                  problems are wrapped in `task.chat`, code problems are verified by their tests.

A code problem with a reference solution (HumanEval's canonical one, a JSONL `solution`) gets
its samples' time limits from the reference's time, measured here when the task loads
(`verify/time_limits.py`).

Real-text tasks take the model's tokenizer (`model.path` / `model.tokenizer`); without one they
use the 260-token byte-level debug tokenizer, which is what the `:debug` configs run.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

from orl_jax.errors import ConfigError
from orl_jax.problem import Problem

TASKS = ("tiny", "gsm8k", "humaneval", "jsonl")


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  tokenizer: Any
  verifier: Any
  train_problem: Callable[[int], Problem]   # index -> problem (unbounded stream)
  eval_problems: Callable[[], list[Problem]]


class CodePromptVerifier:
  """Verifies code problems whose model input was wrapped in a chat template: the unit tests
  must run on the bare code prompt, so problems are mapped back by id before verifying."""

  def __init__(self, inner, originals: dict[str, Problem]):
    self.inner = inner
    self.originals = originals

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    return self.inner.score_batch(self._bare(problems), responses)

  def submit(self, problems: Sequence[Problem], responses: Sequence[str]):
    """Future[list[float]] of `score_batch` started without waiting (the inner verifier's
    `submit`: the ORL loop verifies a rollout chunk while the device decodes the next)."""
    return self.inner.submit(self._bare(problems), responses)

  def _bare(self, problems: Sequence[Problem]) -> list[Problem]:
    return [self.originals.get(p.problem_id, p) for p in problems]


def verifier_metrics(verifier) -> dict[str, float]:
  """The counters of the sandboxed verifier inside `verifier` (timeouts, infrastructure
  failures, unsupported tests, judge cost: `HumanEvalVerifier.stats`), or {} when it has none."""
  found = getattr(verifier, "stats", None)
  if found is not None and hasattr(found, "metrics"):
    return found.metrics()
  for part in ("inner", "code"):
    if getattr(verifier, part, None) is not None:
      metrics = verifier_metrics(getattr(verifier, part))
      if metrics:
        return metrics
  return {}


class AnswerOrCodeVerifier:
  """GSM8K-style exact answers for answer problems, sandboxed unit tests for code problems."""

  def __init__(self, answer_verifier, code_verifier):
    self.answer, self.code = answer_verifier, code_verifier

  def score_batch(self, problems, responses):
    scores = [0.0] * len(problems)
    for kind, verifier in (("answer", self.answer), ("code", self.code)):
      idx = [i for i, p in enumerate(problems) if (p.tests is None) == (kind == "answer")]
      if idx:
        for i, s in zip(idx, verifier.score_batch([problems[i] for i in idx],
                                                  [responses[i] for i in idx])):
          scores[i] = s
    return scores


def _task_field(task_cfg, name, default):
  return task_cfg.get(name, default) if hasattr(task_cfg, "get") else getattr(task_cfg, name,
                                                                              default)


def _eval_only(name: str):
  def fail(_):
    raise ConfigError(f"task.name={name!r} has test problems only (no offline train split): "
                      "train on your own data with task.name='jsonl' and task.path=FILE")
  return fail


def _cycle(problems: list[Problem]):
  return lambda i: problems[i % len(problems)]


def _wrap_code(problems, chat: str):
  """(model-input problems, verifier mapping) for code problems under a chat template."""
  from orl_jax.data.prompts import humaneval_prompt
  wrapped = [dataclasses.replace(p, prompt=humaneval_prompt(p.prompt, chat)) for p in problems]
  return wrapped, {p.problem_id: p for p in problems}


class NoVerifier:
  """The verifier of user prompts: they have no answer to score against (NaN)."""

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    return [float("nan")] * len(problems)


def tiny_task_tokenizer(tokenizer=None):
  """The tiny task's word tokenizer, also for a Hugging Face tokenizer.json of exactly its
  vocabulary (what an export of a tiny-task run holds: the same ids, but `tokenizers` cannot
  write a number's digits back as one word); any other tokenizer as given."""
  from orl_jax.data import tiny_task
  from orl_jax.data.hf_tokenizer import same_vocabulary
  own = tiny_task.tiny_tokenizer()
  if tokenizer is None or (hasattr(tokenizer, "backend") and same_vocabulary(tokenizer,
                                                                            own.vocab)):
    return own
  return tokenizer


def _check_tiny_words(texts: Sequence[str], tokenizer) -> None:
  """ConfigError naming the words of `texts` the tiny task's word tokenizer has no id for."""
  if not hasattr(tokenizer, "vocab"):
    return
  from orl_jax.data import tiny_task
  from orl_jax.data.tokenizer import pretokenize
  known = set(tokenizer.vocab)
  unknown = sorted({w for t in texts for w in pretokenize(t) if w not in known})
  if unknown:
    shown = ", ".join(repr(w) for w in unknown[:6]) + (", ..." if len(unknown) > 6 else "")
    raise ConfigError(f"the prompt has words outside the tiny task's vocabulary ({shown}): "
                      "this model reads the tiny task's word tokenizer (task.name='tiny', as "
                      "the :debug configs train), so write the prompt in its words, e.g. "
                      f"{tiny_task.train_problem(0).prompt!r}")


def prompt_task(task_cfg, texts: Sequence[str], tokenizer=None) -> Task:
  """A task made of the user's own prompts (`launch/decode.py --prompt`): no data files. The
  tokenizer is the one `get_task` would use (the tiny task's own, the model's, or the byte-level
  debug tokenizer); real-text prompts are wrapped in `task.chat` as task problems are."""
  if task_cfg.name == "tiny":
    tokenizer, chat = tiny_task_tokenizer(tokenizer), "none"
    _check_tiny_words(texts, tokenizer)
  else:
    from orl_jax.data.hf_tokenizer import byte_level_tokenizer
    tokenizer, chat = tokenizer or byte_level_tokenizer(), _task_field(task_cfg, "chat", "none")
  blank = [i for i, t in enumerate(texts) if not t.strip()]
  if blank:
    raise ConfigError(f"prompt {blank[0]} to decode is empty or only whitespace: give the text "
                      "to decode")
  from orl_jax.data.prompts import apply_chat
  problems = [Problem(f"prompt-{i}", apply_chat(t, chat)) for i, t in enumerate(texts)]
  return Task("prompts", tokenizer, NoVerifier(), _cycle(problems), lambda: problems)


def _verify_workers(task_cfg) -> int | None:
  """`task.verify_workers` as the code verifier's parallelism (None: the host's usable cores)."""
  workers = int(_task_field(task_cfg, "verify_workers", 0))
  if workers < 0:
    raise ConfigError(f"task.verify_workers={workers} must be >= 0 (0: the host's usable "
                      "cores)")
  return workers or None


def _verify_isolation(task_cfg) -> str:
  """`task.verify_isolation`: how a prompt's code samples share the machine (docs/verifier.md)."""
  from orl_jax.verify.humaneval import ISOLATIONS
  isolation = _task_field(task_cfg, "verify_isolation", "sample")
  if isolation not in ISOLATIONS:
    raise ConfigError(f"task.verify_isolation={isolation!r} must be one of {ISOLATIONS} "
                      "(\"sample\": a prompt's samples side by side; \"prompt\": one at a time)")
  return isolation


def _verify_limits(task_cfg):
  """The code verifier's sandbox limits: the default ones with `task.verify_cpu_s` as the
  sample's CPU limit (a loop ends there, a timeout, instead of at the 10 s wall timeout)."""
  from orl_jax.config.sections import Task as TaskSection
  from orl_sandbox import SandboxLimits
  cpu_s = int(_task_field(task_cfg, "verify_cpu_s", TaskSection.verify_cpu_s))
  if cpu_s <= 0:
    raise ConfigError(f"task.verify_cpu_s={cpu_s} must be positive (a code sample's CPU "
                      "seconds)")
  return SandboxLimits(cpu_s=cpu_s)


def _time_rule(task_cfg):
  """`task.verify_time_factor` and `task.verify_time_floor_s` as the rule that makes a code
  problem's time limit from its reference solution (`verify.time_limits.TimeRule`)."""
  from orl_jax.config.sections import Task as TaskSection
  from orl_jax.verify.time_limits import TimeRule
  factor = float(_task_field(task_cfg, "verify_time_factor", TaskSection.verify_time_factor))
  floor_s = float(_task_field(task_cfg, "verify_time_floor_s", TaskSection.verify_time_floor_s))
  if not (math.isfinite(factor) and factor >= 0):
    raise ConfigError(f"task.verify_time_factor={factor} must be >= 0 (the multiple of a "
                      "reference solution's time a sample gets; 0: task.verify_cpu_s for all)")
  if not (math.isfinite(floor_s) and floor_s > 0):
    raise ConfigError(f"task.verify_time_floor_s={floor_s} must be positive (the fewest CPU "
                      "seconds a sample of a problem with a reference solution gets)")
  return TimeRule(factor, floor_s)


def get_task(task_cfg, tokenizer=None) -> Task:
  name = task_cfg.name
  if name == "tiny":
    from orl_jax.data import tiny_task
    from orl_jax.verify.tiny import TinyVerifier
    cfg = tiny_task.TinyTaskConfig(**dict(task_cfg.tiny))
    return Task("tiny", tiny_task_tokenizer(tokenizer), TinyVerifier(),
                lambda i: tiny_task.train_problem(i, cfg), lambda: tiny_task.eval_problems(cfg))
  if name not in TASKS:
    raise ConfigError(f"task.name={name!r} is not one of {TASKS}")
  from orl_jax.data import prompts
  from orl_jax.data.hf_tokenizer import byte_level_tokenizer
  from orl_jax.verify.gsm8k import GSM8KVerifier
  tokenizer = tokenizer or byte_level_tokenizer()
  chat = _task_field(task_cfg, "chat", "none")
  if name == "gsm8k":
    from orl_jax.data.gsm8k import load_gsm8k_test
    k_shot = _task_field(task_cfg, "k_shot", 0)
    path = _task_field(task_cfg, "path", "") or None
    load = lambda: load_gsm8k_test(path, prompt_fn=lambda q: prompts.gsm8k_prompt(q, k_shot, chat))
    return Task("gsm8k", tokenizer, GSM8KVerifier(), _eval_only("gsm8k"), load)
  from orl_jax.verify.humaneval import HumanEvalVerifier, host_workers
  from orl_jax.verify.time_limits import with_time_limits
  workers, isolation = _verify_workers(task_cfg), _verify_isolation(task_cfg)
  limits = _verify_limits(task_cfg)
  rule = _time_rule(task_cfg)
  code_verifier = lambda originals: CodePromptVerifier(
      HumanEvalVerifier(limits, parallelism=workers, isolation=isolation), originals)
  # code problems with a reference solution get their time limits now (its measured time)
  timed = lambda problems, source: with_time_limits(problems, rule, limits,
                                                    workers or host_workers(), source)
  if name == "humaneval":
    from orl_jax.data.humaneval import humaneval_path, load_humaneval
    path = _task_field(task_cfg, "path", "") or None
    problems, originals = _wrap_code(timed(load_humaneval(path), str(path or humaneval_path())),
                                     chat)
    return Task("humaneval", tokenizer, code_verifier(originals),
                _eval_only("humaneval"), lambda: problems)
  # jsonl
  from orl_jax.data.jsonl import load_jsonl_problems
  path = _task_field(task_cfg, "path", "")
  if not path:
    raise ConfigError("task.name='jsonl' needs task.path=FILE (one JSON object per line: "
                      "{prompt, answer} or {prompt, tests, entry_point}; an example: "
                      "examples/math_and_code.jsonl)")
  raw = timed(load_jsonl_problems(path), path)
  answers = [dataclasses.replace(p, prompt=prompts.apply_chat(p.prompt, chat))
             for p in raw if p.tests is None]
  code, originals = _wrap_code([p for p in raw if p.tests is not None], chat)
  by_id = {p.problem_id: p for p in answers + code}
  problems = [by_id[p.problem_id] for p in raw]
  verifier = AnswerOrCodeVerifier(GSM8KVerifier(), code_verifier(originals) if code else None)
  return Task("jsonl", tokenizer, verifier, _cycle(problems), lambda: problems)
