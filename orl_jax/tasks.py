"""Task registry: problems, tokenizer and verifier for `config.task.name`."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from orl_jax.verify.base import Problem

TASKS = ("tiny",)


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  tokenizer: Any
  verifier: Any
  train_problem: Callable[[int], Problem]   # index -> problem (unbounded stream)
  eval_problems: Callable[[], list[Problem]]


def get_task(task_cfg, tokenizer=None) -> Task:
  if task_cfg.name == "tiny":
    from orl_jax.data import tiny_task
    from orl_jax.data.tokenizer import tiny_tokenizer
    from orl_jax.verify.tiny import TinyVerifier
    cfg = tiny_task.TinyTaskConfig(**dict(task_cfg.tiny))
    return Task("tiny", tokenizer or tiny_tokenizer(), TinyVerifier(),
                lambda i: tiny_task.train_problem(i, cfg), lambda: tiny_task.eval_problems(cfg))
  raise ValueError(f"task.name={task_cfg.name!r} is not one of {TASKS}")
