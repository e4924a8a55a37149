"""The ablation table of a demo work directory run over seeds, finished or stopped part-way:
accuracy and pooled TPF (mean ± std over the seeds evaluated so far), each ablation's change
against full ORL beside the paper's and the seed spread, and each term's share of the objective.

  python launch/report.py --workdir=work_dirs/tiny_ablations
  python launch/report.py --workdir=work_dirs/tiny_ablations --setting=threshold_0.7

Writes WORKDIR/ablations.md (the study writes it too when it finishes) and prints it.
"""
import os

import _common  # repo on sys.path; run()
from absl import app, flags

from orl_jax.apps import demo

_WORKDIR = flags.DEFINE_string("workdir", None, "The demo's work directory (results.json).")
_SETTING = flags.DEFINE_string("setting", "threshold_0.9", "The decoder setting to tabulate.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("give the study's work directory: --workdir=DIR")
  try:
    table, results = demo.study_report(_WORKDIR.value, _SETTING.value)
  except (OSError, ValueError, KeyError) as e:     # no results, no ORL seed, unknown setting
    raise app.UsageError(str(e)) from None
  path = os.path.join(_WORKDIR.value, "ablations.md")
  with open(path, "w") as f:
    f.write(table + "\n")
  print(table)
  counts = ", ".join(f"{name} {len(r[_SETTING.value]['seeds'])}" for name, r in results.items()
                     if "seeds" in r.get(_SETTING.value, {}))
  print(f"seeds evaluated: {counts}")
  print(f"table: {path}")


if __name__ == "__main__":
  _common.run(main)
