"""orl_jax: On-Policy Residual Learning for diffusion language models, in JAX/Flax."""
__version__ = "0.1.0"
