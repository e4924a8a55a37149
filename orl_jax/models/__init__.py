"""Model families built on one NNX transformer."""
from orl_jax.models.transformer import (ForwardOutput, KVCache, ModelConfig, Transformer,
                                        count_params, init_cache)
