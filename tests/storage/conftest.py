"""Fixtures the storage tests share."""
import os

import pytest

from orl_jax.models import params_io
from orl_jax.models.build import init_model_params
from orl_jax.setup.build import build_setup, params_meta
from orl_jax.storage import trained_run
from orl_jax.storage.hf_export import export_model_type


def write_finished_run(workdir, config):
  """A finished run's work directory as `finish_run` writes it (untrained parameters): params/
  with the run's record and tokenizer, an empty metrics.jsonl. Returns the run's Setup."""
  s = build_setup(config)
  _, params = init_model_params(s.model_cfg, 0)
  record = trained_run.run_record(s.config, s.tokenizer, "", export_model_type(s.config))
  params_io.save_params(os.path.join(workdir, "params"), params,
                        params_meta(s, {trained_run.RUN_KEY: record}),
                        lambda folder: trained_run.save_tokenizer(s.tokenizer, folder))
  (workdir / "metrics.jsonl").write_text("")
  return s


@pytest.fixture(scope="session")
def finished_run():
  """`write_finished_run(workdir, config) -> Setup`, for fixtures of any scope."""
  return write_finished_run
