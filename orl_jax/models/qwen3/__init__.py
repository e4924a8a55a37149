"""SDAR and QwenDLM (`model_type: qwen3`, `sdar`): the shared `Transformer`, block-causal
(`family.py`)."""
from orl_jax.models.qwen3.family import FAMILY  # noqa: F401
