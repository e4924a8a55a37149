"""Verifiers: tiny-task answer match, GSM8K, HumanEval (sandboxed)."""
from orl_jax.problem import Problem, Verifier
from orl_jax.verify.gsm8k import GSM8KVerifier
from orl_jax.verify.humaneval import HumanEvalVerifier
from orl_sandbox import SandboxLimits, SandboxResult, run_python
