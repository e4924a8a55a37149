"""LLaDA2.x (`model_type: llada2_moe`): the shared `Transformer` with MoE layers, block-causal
(`family.py`)."""
from orl_jax.models.llada2_moe.family import FAMILY  # noqa: F401
