"""Our own models (`model.hf_family = ""`, the default family): the shared `Transformer` built from
the run's `model.*` fields (`family.py`)."""
from orl_jax.models.ours.family import FAMILY  # noqa: F401
