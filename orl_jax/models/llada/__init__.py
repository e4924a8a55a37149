"""LLaDA-8B (`model_type: llada`): the shared `Transformer`, fully bidirectional (`family.py`)."""
from orl_jax.models.llada.family import FAMILY  # noqa: F401
