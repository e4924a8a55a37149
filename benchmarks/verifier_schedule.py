"""What the HumanEval verifier's isolation modes and scheduling slots cost and what they leave
(docs/verifier.md, "Threat model").

`throughput`: `HumanEvalVerifier.score_batch` on HumanEval/0 to /7 × 16 canonical samples (a
fresh verifier per run, 10 s timeout), at each `--parallelism`, with `isolation="sample"` (a
prompt's samples side by side, the default), `isolation="prompt"` with `slot_s` 0 (each sample
starts when the previous one of its prompt ended) and with `--slot-s`, the settings alternating
in one process, median of `--repeats` runs. The machine may be shared: only the ratio within
one run means much. JSON: benchmarks/results/verifier_schedule.json; last line
`verifier_schedule_prompt_over_sample: X` (the slotted "prompt" schedule's time over the
"sample" schedule's, at the largest parallelism).

`steering`: the channel slots leave. A sender knows the answer (a secret of four values) and
when it started; it picks the slot length its run falls in (at a 4 s timeout: 0.25, 0.5, 1, 2,
4 or 6 s) that makes the next sample of its prompt start nearest the secret's 2 s bin of an 8 s
cycle of the wall clock, and runs that long; the receiver answers the bin it starts in. Prints
how many of `--trials` receivers were right (chance: a quarter).

  python benchmarks/verifier_schedule.py throughput [--parallelism 2,4,8] [--slot-s 0.25]
  python benchmarks/verifier_schedule.py steering [--trials 12]
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orl_sandbox as sandbox  # noqa: E402
from orl_jax.data.humaneval import load_humaneval  # noqa: E402
from orl_jax.problem import Problem  # noqa: E402
from orl_jax.verify.humaneval import HumanEvalVerifier  # noqa: E402

_SENDER = """\
    return -1


import time
_t0 = time.time()
def _miss(level):   # how far the next start (set-up times about 0.05 and 0.1 s) is from the bin
    phase = (_t0 - 0.05 + level + 0.1) % 8.0
    return min(abs(phase - ({secret} * 2 + 1.0 + k * 8.0)) for k in (-1, 0, 1))
_level = min([0.25, 0.5, 1.0, 2.0, 4.0, 6.0], key=_miss)
time.sleep(0.75 * _level - 0.15 if _level < 6 else 5.0)   # 6 s: the timed-out run's slot
# {nonce}
"""
_RECEIVER = ("    return DECODED\n\n\nimport time\n"
             "DECODED = int((time.time() % 8.0) // 2.0)  # {nonce}\n")


def throughput(parallelisms: list[int], slot_s: float, repeats: int) -> None:
  problems = load_humaneval()[:8]
  settings = (("sample", None), ("prompt", 0.0), ("prompt", slot_s))
  times: dict[tuple[int, str], list[float]] = {}
  for repeat in range(repeats):
    for parallelism in parallelisms:
      for isolation, slot in settings:
        batch = [p for _ in range(16) for p in problems]
        responses = [p.target + f"\n# {repeat} {i}\n" for i, p in enumerate(batch)]
        with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=10.0), parallelism=parallelism,
                               isolation=isolation, slot_s=slot) as verifier:
          verifier.score_batch(problems[:1], [problems[0].target])   # the smoke run, untimed
          start = time.perf_counter()
          scores = verifier.score_batch(batch, responses)
          name = isolation if slot is None else f"{isolation} slot_s {slot}"
          times.setdefault((parallelism, name), []).append(time.perf_counter() - start)
        assert scores == [1.0] * len(batch), scores
  medians = {}
  for (parallelism, name), runs in sorted(times.items()):
    medians[f"{parallelism} {name}"] = statistics.median(runs)
    print(f"parallelism {parallelism} {name}: median {statistics.median(runs):.2f} s "
          f"(runs {', '.join(f'{r:.2f}' for r in runs)})")
  top = max(parallelisms)
  ratio = medians[f"{top} prompt slot_s {slot_s}"] / medians[f"{top} sample"]
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                     "verifier_schedule.json")
  with open(out, "w") as f:
    json.dump({"median_s": medians, "runs_s": {f"{p} {n}": r for (p, n), r in times.items()},
               "samples": 128, "repeats": repeats, "host_cpus": os.cpu_count(),
               "load_average": os.getloadavg()}, f, indent=1)
  print(f"wrote {out}")
  print(f"verifier_schedule_prompt_over_sample: {ratio:.2f}")


def steering(trials: int) -> None:
  right = 0
  with HumanEvalVerifier(sandbox.SandboxLimits(timeout_s=4.0), parallelism=3,
                         isolation="prompt") as verifier:
    for trial in range(trials):
      secret, nonce = random.randrange(4), f"steering {trial} {random.random()}"
      problem = Problem(f"secret {nonce}", "def secret() -> int:\n", entry_point="secret",
                        tests=f"def check(candidate):\n    assert candidate() == {secret}\n")
      scores = verifier.score_batch([problem] * 3, [
          _SENDER.format(secret=secret, nonce=nonce), _RECEIVER.format(nonce=nonce),
          f"    return {secret}  # {nonce}\n"])
      assert scores[0] == 0.0 and scores[2] == 1.0, scores
      right += int(scores[1])
  print(f"steering: {right} of {trials} receivers right (chance: a quarter)")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("what", choices=("throughput", "steering"))
  parser.add_argument("--parallelism", default="2,4,8")
  parser.add_argument("--slot-s", type=float, default=0.25)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--trials", type=int, default=12)
  args = parser.parse_args()
  if args.what == "throughput":
    throughput([int(p) for p in args.parallelism.split(",")], args.slot_s, args.repeats)
  else:
    steering(args.trials)


if __name__ == "__main__":
  main()
