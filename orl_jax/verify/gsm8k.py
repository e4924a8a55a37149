"""GSM8K-style answer verification: the strict final-answer rule of `math_answer`
(docs/verifier.md).

A response scores 1 only when the number in its final-answer span (after the last `####`, or in
the last `\\boxed{}`) is the gold number; hedges, several numbers and missing markers score 0.
A base model prompted with few-shot examples goes on to invent the next problem after its
answer: the rule itself cuts a response at a `Question:` line after a marker, for every math
task alike (lm-evaluation-harness stops GSM8K generation there too).
"""
from __future__ import annotations

from orl_jax.verify.math_answer import MathAnswerVerifier


class GSM8KVerifier(MathAnswerVerifier):
  """Exact match of the strict final answer against `Problem.answer` (1.0 / 0.0)."""
