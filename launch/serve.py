"""Serve a model behind an OpenAI-compatible HTTP API (docs/serving.md).

  # the tiny model: POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, /metrics
  python launch/serve.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base
  # a trained run (its work directory or params/ folder: tokenizer, special tokens and chat
  # template come along), on another port, serving its newest weights as they land
  python launch/serve.py --config=configs/tiny.py:eval --config.model.path=DIR --port=8001 \
      --config.serve.watch=DIR
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
from absl import flags, logging
from ml_collections import config_flags

from orl_jax.storage import trained_run
from orl_jax.serve.keys import access_from
from orl_jax.serve.load import served_model, start_watcher
from orl_jax.serve.server import serve_forever

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "address to bind (0.0.0.0: every interface)")
_PORT = flags.DEFINE_integer("port", 8000, "port to bind (0: a free one, printed at start-up)")
_API_KEY = flags.DEFINE_multi_string("api-key", [], "a key every /v1/* request must send as "
                                     "`Authorization: Bearer KEY` (repeatable; also ORL_API_KEYS)")
_ADMIN_KEY = flags.DEFINE_multi_string("admin-key", [], "a key that turns /v1/admin/* on "
                                       "(repeatable; also ORL_ADMIN_KEYS)")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  served = served_model(_CONFIG.value, overridden=trained_run.overridden_fields(sys.argv))
  served.access = access_from(_CONFIG.value.serve, _API_KEY.value, _ADMIN_KEY.value)
  serve_forever(served, _HOST.value, _PORT.value, start_watcher(served, _CONFIG.value),
                _CONFIG.value.serve)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  _common.run(main)
