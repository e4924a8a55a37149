"""Decoding our block-diffusion models (docs/decoding.md#one-denoising-step,
docs/method.md#rollout-with-exact-state-capture), one module per job.

The package imports nothing, so that a family's own sampler (under `orl_jax.models`) can build
the shared output types of `types` without loading the decoders.
"""
