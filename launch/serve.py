"""Serve a model behind an OpenAI-compatible HTTP API (docs/serving.md).

  # the tiny model: POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, /metrics
  python launch/serve.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base
  # a trained run (its work directory or params/ folder: tokenizer, special tokens and chat
  # template come along), on another port, serving its newest weights as they land
  python launch/serve.py --config=configs/tiny.py:eval --config.model.path=DIR --port=8001 \
      --config.serve.watch=DIR
  # two models side by side (the API's `model` field picks one; the playground at / shows
  # both filling in)
  python launch/serve.py --config=configs/tiny.py:eval \
      --models=base=assets/tiny_base,orl=work_dirs/tiny_demo/orl
  # a Hugging Face directory: its config.json gives the family and every shape
  python launch/serve.py --config=configs/llada.py:8b-instruct \
      --config.model.path=/path/LLaDA-8B-Instruct

The config's decoder settings (decode.rule, decode.rule_value, decode.temperature,
decode.gen_length, task.prompt_len) are the defaults; a request may choose its own rule
(`decoder`), temperature, max_tokens, n, seed and stop strings. Binds 127.0.0.1 unless --host
says otherwise. SIGTERM or Ctrl-C drains: new requests get 503, the ones in flight finish, the
process exits 0.
"""
import sys

import _common  # repo on sys.path; run()
from absl import app, flags, logging
from ml_collections import config_flags

from orl_jax.storage import trained_run
from orl_jax.serve.keys import access_from
from orl_jax.serve.load import parse_models, served_model, start_watcher
from orl_jax.serve.server import serve_forever

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "address to bind (0.0.0.0: every interface)")
_PORT = flags.DEFINE_integer("port", 8000, "port to bind (0: a free one, printed at start-up)")
_MODELS = flags.DEFINE_string("models", "", "NAME=DIR,...: serve several models on one port, "
                              "each named NAME (weights as --config.model.path takes; the "
                              "first is the default); default: --config.model.path alone")
_API_KEY = flags.DEFINE_multi_string("api-key", [], "a key every /v1/* request must send as "
                                     "`Authorization: Bearer KEY` (repeatable; also ORL_API_KEYS)")
_ADMIN_KEY = flags.DEFINE_multi_string("admin-key", [], "a key that turns /v1/admin/* on "
                                       "(repeatable; also ORL_ADMIN_KEYS)")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config, overridden = _CONFIG.value, trained_run.overridden_fields(sys.argv)
  access = access_from(config.serve, _API_KEY.value, _ADMIN_KEY.value)
  if not _MODELS.value:
    served = served_model(config, overridden=overridden)
    served.access = access
    serve_forever(served, _HOST.value, _PORT.value, start_watcher(served, config),
                  config.serve)
    return
  if config.serve.watch:
    raise app.UsageError("--config.serve.watch follows the weights of one model: leave it out "
                         "with --models")
  models = []
  for name, path in parse_models(_MODELS.value):
    served = served_model(config, path, overridden)
    served.name, served.access = name, access
    models.append(served)
  serve_forever(models[0], _HOST.value, _PORT.value, None, config.serve, also=models[1:])


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _common.run(main)
