"""What a task is made of (docs/method.md#verification, docs/models.md#real-tasks): problems and the
verifier interface. A leaf module:
`data/` loads problems, `verify/` scores them, `tasks.py` pairs the two."""
from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence


@dataclasses.dataclass(frozen=True)
class Problem:
  """One task instance. Text only; tokenization happens in the data pipeline."""
  problem_id: str
  prompt: str                      # what the model is conditioned on
  target: str = ""                 # a reference response (SFT target); "" when none exists
  answer: str | None = None        # gold final answer (arithmetic, GSM8K)
  tests: str | None = None         # unit tests (HumanEval-style code tasks)
  entry_point: str | None = None   # function under test (code tasks)
  solution: str | None = None      # a reference completion of `prompt` that passes `tests`
  # a sample's CPU seconds, from the reference's measured time (verify/time_limits.py); None:
  # the task's configured limits
  time_limit_s: float | None = None


class Verifier(Protocol):
  """Scores finished responses: 1.0 correct, 0.0 otherwise."""

  def score_batch(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[float]:
    ...


def truncate_completion(completion: str, stop_sequences: Sequence[str]) -> str:
  """Cuts a response at the first of `stop_sequences` (a code block's closing fence, the next
  few-shot `Question:`): what follows was never part of the answer."""
  cut = len(completion)
  for stop in stop_sequences:
    index = completion.find(stop)
    if index >= 0:
      cut = min(cut, index)
  return completion[:cut]
