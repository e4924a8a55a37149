"""Verifiers: tiny-task answer match, GSM8K, HumanEval (sandboxed)."""
from orl_jax.verify.base import Problem, Verifier
