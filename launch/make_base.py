"""Train the tiny base model and write it, with its provenance, to a folder (`make base`).

  python launch/make_base.py --config=configs/tiny.py:sft --config.workdir=work_dirs/tiny_base \
      --out=assets/tiny_base

Writes params.safetensors, meta.json (with the machine and the measured figures) and README.md
into --out, file by file; anything else there is left alone.
"""
import _common  # repo on sys.path; run()

_common.stop_on_signals()   # an interrupted training stops with a checkpoint (launch/train.py)

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from orl_jax.apps import base_model  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py[:variant]).",
                                          lock_config=True)
_OUT = flags.DEFINE_string("out", "assets/tiny_base", "folder to write the base model into")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  record = base_model.make_base(_CONFIG.value, _OUT.value)
  ev = record["eval"]
  print(f"base model: {_OUT.value} (training {record['train_minutes']} min, evaluation "
        f"{record['eval_minutes']} min)")
  for label, r in ev.items():
    print(f"  {label}: accuracy {r['accuracy']:.3f}, pooled TPF {r['tpf_pooled']:.2f}")


if __name__ == "__main__":
  _common.run(main)
