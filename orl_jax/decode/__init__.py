"""Decoding our block-diffusion models (DESIGN §2.2, §2.3), one module per job.

The package imports nothing, so that a family's own sampler (under `orl_jax.models`) can build
the shared output types of `types` without loading the decoders.
"""
