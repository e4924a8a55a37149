"""DiffusionGemma (docs/models.md#diffusiongemma): a uniform-noise family with its own model.

* `config.py`: `DiffusionGemmaConfig` and its config.json reading and writing;
* `model.py`: the model (`DiffusionGemma`: commit forward, canvas decoder, self-conditioning);
* `family.py`: its registry entry (`FAMILY`: name map, partition rules, run config -> model
  config, generation defaults);
* `sampler.py`: transformers' uniform-noise sampler, run config -> `SamplerConfig`;
* `trajectories.py`: the sampler's trace as the shared `Capture`, `Trajectories` and forward counts;
* `decoding.py`: `UniformNoiseSampler`, the family's `Sampler` (`FAMILY.sampler`): the decoder
  of each purpose, what replay reads of its capture, its prompt lead.
"""
from orl_jax.models.diffusion_gemma.family import FAMILY  # noqa: F401
