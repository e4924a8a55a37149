"""The math-answer grammar (`orl_jax.verify.math_answer`) beside math-verify, HuggingFace's
maintained answer verifier (`math_verify.parse` and `verify`), on the same responses, and the
rule's cost per response beside the previous rule's.

Responses, each scored against its gold by both:
* `gsm8k`: the 1,319 GSM8K test solutions (orl_jax/data/gsm8k_test.jsonl.gz), each against the
  number after its own `####`: every one is right;
* `gsm8k_boxed`: GSM8K's final sentences with the gold number boxed in place (1,276 of the
  1,319 final sentences hold the gold number; tests/verify/test_math_rule_vs_math_verify.py
  builds them), each scored with its question as the problem text: every one is right;
* `tiny`: `--tiny-problems` tiny-task targets (`tiny_task.train_problem`) against their gold:
  every one is right;
* `tables`: every response of tests/verify/test_math_answers.py's reference table and of
  tests/verify/test_math_attacks.py's attack and honest classes and attack/twin pairs, with the
  verdict the tests require.

Each disagreement gets a class: `ours right` (the response does not state the gold as its one
answer, or states it in a form math-verify does not read), `math-verify right` (our rule is
wrong: a regression), or `both defensible` (a reading a grader could take either way; the
choice is documented in docs/verifier.md), with a one-line reason and what math-verify read. A
refused boxed GSM8K sentence takes its class from tests/verify/test_math_rule_vs_math_verify.py:
a word the problem does not use is `math-verify right` (a right restatement refused), every
other class `both defensible`.

Cost: `final_answer` over the GSM8K solutions (with their questions as the problem text), over
the table responses and over both, timed for this rule, for the rule at `--baseline` (the
denylist) and for the grammar's first version at `--grammar-baseline` (each loaded from git into
this process), runs interleaved, median of `--repeats` runs, microseconds per response. The
machine may be shared: only the ratio within one run means much.

math-verify is a reference for this benchmark and the tests only; the library never imports it
(`make venv` installs it with the other test-only references).

With `--tiny-decodes N`, the committed tiny base model's greedy decodes of the first N
evaluation problems (under `fixed_steps_1` and `threshold_0.9`) are scored by every rule too.

  python benchmarks/math_rule_vs_math_verify.py [--tiny-problems 2000] [--repeats 7]
  python benchmarks/math_rule_vs_math_verify.py --tiny-decodes 512
"""
import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
import types

import _common

from math_verify import parse, verify  # test-only reference: pip install math-verify==0.9.0

from orl_jax.data import tiny_task
from orl_jax.verify import math_answer
from tests.verify import test_math_answers, test_math_attacks, test_math_rule_vs_math_verify

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "math_rule_vs_math_verify.json")
GSM8K = os.path.join(_common.ROOT, "orl_jax", "data", "gsm8k_test.jsonl.gz")
BASELINE = "40e6f35"   # the last commit with the previous rule (the denylist, before the grammar)
GRAMMAR_V1 = "77c619f"   # the grammar's first version (before the sentence rules of round four)

# Disagreements on the test tables where a grader could go either way: (response, gold) -> why.
# Every other table disagreement is `ours right`, with the test's own reason.
BOTH_DEFENSIBLE = {
    ("The answer is 30.", "30"): "no marker: a reader sees 30, but the rule never falls back to "
                                 "a last number (which also takes `It is 29, 31 or 30.`)",
    ("30", "30"): "no marker: the rule never falls back to a bare number",
    ("```\n#### 30\n```", "30"): "an answer only inside code: code is not an answer",
    ("```\n\\boxed{30}\n```", "30"): "an answer only inside code: code is not an answer",
    ("The answer is `#### 30`.", "30"): "an answer only inside inline code",
    ("#### 30\n```python\nprint('#### ' + str(31))\n```", "30"):
        "the code after the answer prints another marked answer: a second answer, refused",
    ("Question: Tom has 12 apples. How many?\n#### 31\nQuestion: again?\n#### 30", "30"):
        "the second `Question:` starts a new problem (few-shot format), so 31 is the answer",
    ("#### 30 (thirty)", "30"): "the same value spelled out: words are refused, not parsed",
    ("#### 30 XXX", "30"): "the same value in Roman numerals: refused, not parsed",
    ("#### 30 \u2169\u2169\u2169", "30"): "the same value in Roman numerals: refused, not parsed",
    ("#### 30 (\u2179\u2179\u2179)", "30"): "the same value in Roman numerals: refused, not parsed",
    ("#### 30 (\u4e09\u3007)", "30"): "the same value in CJK numerals: refused, not parsed",
    ("#### 30 (\u5345)", "30"): "the same value in CJK numerals: refused, not parsed",
    ("#### 30 (\u0663\u0660)", "30"): "the same value in a second digit script: refused",
    ("#### 30\u200e", "30"): "an invisible direction mark glued to the number: refused",
    ("#### 30\u00ad", "30"): "an invisible soft hyphen glued to the number: refused",
    ("#### 30\uffff", "30"): "a noncharacter after the number: refused",
    ("12 + 18 = 30.\n$\\boxed{30}$!", "30"):
        "`!` after the formula: an exclamation in prose, 30! in LaTeX; refused as ambiguous",
    ("#### 1 000,000", "1000000"): "mixed separators: 1,000,000 or 1000.000; refused",
    ("#### 1,000 000", "1000000"): "mixed separators: refused",
}
# Right answers outside the grammar (refused on purpose; math-verify reads them): the reason.
_SCIENTIFIC, _GROUPS, _LOCALE, _AFTER = ("scientific notation is no NUMBER",
                                         "only `,` groups thousands",
                                         "a locale form: digits of another script",
                                         "text after the answer line")
OUTSIDE_THE_GRAMMAR = {
    "#### 3e1": _SCIENTIFIC, "#### 1e3": _SCIENTIFIC, "#### 3.0e1": _SCIENTIFIC,
    "#### 1 230": _GROUPS, "#### 1 000": _GROUPS, "#### 1\u2009000": _GROUPS,
    "#### 1\u202f000": _GROUPS, "#### 1'000": _GROUPS, "#### 1\u2019000": _GROUPS,
    "\\boxed{1\\,000}": _GROUPS, "#### \uff13\uff10": _LOCALE, "#### \u0663\u0660": _LOCALE,
    "#### minus 30": "a sign word is no SIGN", "#### +30": "a plus sign is no SIGN",
    "#### 30kg": "a letter glued to the number", "#### 30 hmm.": "a word that is no unit",
    "#### 31\nWait, 12 + 18 = 30.\n#### 30": "a second candidate answer",
    "#### 30 (the `####` line)": "code on the answer line", "#### 30\n\\boxed{}": _AFTER,
    "\\boxed{30}\n####": _AFTER, "#### 30\nSo Tom has 30 apples.": _AFTER,
    "#### 30\nSo the answer is 30.": _AFTER, "\\boxed{30}\n#### Check\n12 + 18 = 30": _AFTER,
    "#### 30 \u2014 the total": "words after the number that are no unit"}


def load_rule(revision: str):
  """`final_answer(response, problem_text)` of the rule at `revision`, loaded from git into this
  process (with its `math_number` module where it has one); None when the revision is not in
  this clone."""
  sources = {}
  for name in ("math_number", "math_answer"):
    try:
      sources[name] = subprocess.run(
          ["git", "show", f"{revision}:orl_jax/verify/{name}.py"], cwd=_common.ROOT,
          check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
      continue
  if "math_answer" not in sources:
    return None
  prefix = f"baseline_{revision}_"
  source = sources["math_answer"]
  if "math_number" in sources:
    number = types.ModuleType(prefix + "math_number")
    sys.modules[number.__name__] = number
    exec(compile(sources["math_number"], f"{revision}:math_number.py", "exec"), number.__dict__)
    source = source.replace("from orl_jax.verify.math_number import",
                            f"from {number.__name__} import")
  answer = types.ModuleType(prefix + "math_answer")
  exec(compile(source, f"{revision}:math_answer.py", "exec"), answer.__dict__)
  if "problem_text" in answer.final_answer.__code__.co_varnames:
    return answer.final_answer
  return lambda response, _problem_text: answer.final_answer(response)


def gsm8k_cases() -> list[tuple[str, str, int, str, str]]:
  with gzip.open(GSM8K, "rt") as f:
    docs = [json.loads(line) for line in f]
  return [(d["answer"], d["answer"].rsplit("####", 1)[1].strip(), 1, "a GSM8K solution",
           d["question"]) for d in docs]


def gsm8k_boxed_cases() -> list[tuple[str, str, int, str, str]]:
  return [(response, gold, 1, "a GSM8K final sentence boxed in place", question)
          for response, gold, question in test_math_rule_vs_math_verify.gsm8k_boxed_sentences()]


def tiny_cases(n: int) -> list[tuple[str, str, int, str, str]]:
  cfg = tiny_task.TinyTaskConfig()
  problems = [tiny_task.train_problem(i, cfg) for i in range(n)]
  return [(p.target, str(p.answer), 1, "a tiny-task target", p.prompt) for p in problems]


def table_cases() -> list[tuple[str, str, int, str, str]]:
  """(response, gold, the verdict the tests require, why, problem text) of every table row (no
  problem text) and attack (test_math_attacks.PROMPT)."""
  cases = [(r, g, ours, why, "q") for r, g, ours, _s, _f, _m, why in test_math_answers.TABLE]
  for verdict, classes in ((0, test_math_attacks.WRONG), (1, test_math_attacks.HONEST)):
    for name, responses in classes.items():
      for case in responses:
        response, gold = (case, "30") if isinstance(case, str) else case
        cases.append((response, gold, verdict, f"{name} (tests/verify/test_math_attacks.py)",
                      test_math_attacks.PROMPT))
  for name, twins in test_math_attacks.TWINS.items():
    for twin in twins:
      attack, honest, gold, prompt = twin if len(twin) == 4 else (*twin, "30",
                                                                   test_math_attacks.PROMPT)
      why = f"{name} (tests/verify/test_math_attacks.py)"
      cases += [(attack, gold, 0, why, prompt),
                (honest, gold, 1, f"{why}, the honest twin", prompt)]
  return cases


def tiny_decodes(n: int, rules: dict) -> dict:
  """The committed tiny base model's (assets/tiny_base) greedy decodes of the first `n`
  evaluation problems under `fixed_steps_1` and `threshold_0.9`, scored by each rule: {setting:
  {rule: right answers}, and how many responses the rules score differently}."""
  from configs import tiny
  from orl_jax import evaluate
  from orl_jax.setup.build import build_setup, initial_params
  from orl_jax.storage import trained_run
  from orl_jax.unmasking import UnmaskRule
  config = tiny.get_config("eval")
  base = os.path.join(_common.ROOT, "assets", "tiny_base")
  setup = build_setup(trained_run.model_config_for(config, base, frozenset(), "model.path"))
  problems = setup.task.eval_problems()[:n]
  graphdef, params = initial_params(setup)
  scored = {}
  for label in ("fixed_steps_1", "threshold_0.9"):
    decoded = evaluate.decode_problems(graphdef, params, problems, setup.task, setup.config,
                                       UnmaskRule.parse(label), batch_size=64)
    texts = [setup.task.tokenizer.decode(t, stop_at_eos=True) for t in decoded.tokens]
    golds = [math_answer.gold_number(p.answer) for p in problems]
    verdicts = {rule: [final_answer(t, p.prompt) == gold
                       for p, t, gold in zip(problems, texts, golds)]
                for rule, final_answer in rules.items()}
    scored[label] = {rule: sum(v) for rule, v in verdicts.items()}
    scored[label]["responses_scored_differently"] = sum(
        len(set(row)) > 1 for row in zip(*verdicts.values()))
    print(f"tiny decodes, {label}: {scored[label]}")
  return scored


def ours(response: str, gold: str, problem_text: str) -> int:
  return int(math_answer.answers_match(response, gold, problem_text))


def theirs(response: str, gold: str) -> tuple[int, str]:
  """math-verify's verdict and what it read from the response."""
  try:
    read = parse(response)
    return int(bool(verify(parse(gold), read))), str(read[-1]) if read else "nothing"
  except Exception as error:   # a reference that fails is a verdict of 0, recorded
    return 0, f"error: {type(error).__name__}"


def boxed_refusal_class(response: str) -> str:
  """The class tests/verify/test_math_rule_vs_math_verify.py gives a refused boxed sentence."""
  return next(name for name, pieces in
              test_math_rule_vs_math_verify.REFUSED_BOXED_SENTENCES.items()
              if any(piece in response for piece in pieces))


def classify(corpus: str, case, our: int, their: int, read: str) -> tuple[str, str]:
  response, gold, required, why, _ = case
  if corpus == "gsm8k_boxed" and our != required:
    name = boxed_refusal_class(response)
    if name == test_math_rule_vs_math_verify.NOT_THE_PROBLEMS_WORD:
      return "math-verify right", f"a right restatement refused: {name}"
    return "both defensible", f"a boxed GSM8K sentence refused: {name}"
  if our != required:
    return "math-verify right", f"our rule fails {why}"
  if corpus != "tables":
    return "ours right", f"math-verify read {read} from the working, not the `####` answer"
  key = (response, gold)
  if key in BOTH_DEFENSIBLE:
    return "both defensible", BOTH_DEFENSIBLE[key]
  if our == 0 and response in OUTSIDE_THE_GRAMMAR:
    return "both defensible", f"a right answer outside the grammar: {OUTSIDE_THE_GRAMMAR[response]}"
  side = "refuses it" if our == 0 else "reads the gold"
  return "ours right", f"{why}: our rule {side}, math-verify read {read}"


def cost(final_answer, responses: list[tuple[str, str]], repeats: int) -> list[float]:
  """µs per (response, problem text) of `final_answer`, `repeats` times."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for response, problem_text in responses:
      final_answer(response, problem_text)
    times.append((time.perf_counter() - t0) / len(responses) * 1e6)
  return times


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tiny-problems", type=int, default=2000)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--tiny-decodes", type=int, default=0,
                      help="also decode this many tiny evaluation problems with assets/tiny_base "
                           "and score them with every rule (minutes on a CPU; 0: skip)")
  parser.add_argument("--baseline", default=BASELINE,
                      help="git revision of the rule to time beside this one")
  parser.add_argument("--grammar-baseline", default=GRAMMAR_V1,
                      help="git revision of the grammar's first version, timed beside both")
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()

  corpora = {"gsm8k": gsm8k_cases(), "gsm8k_boxed": gsm8k_boxed_cases(),
             "tiny": tiny_cases(args.tiny_problems), "tables": table_cases()}
  summary, disagreements = {}, []
  for corpus, cases in corpora.items():
    counts = {"responses": len(cases), "agree": 0, "both_1": 0, "both_0": 0, "ours_only": 0,
              "math_verify_only": 0}
    for case in cases:
      our = ours(case[0], case[1], case[4])
      their, read = theirs(case[0], case[1])
      if our == their:
        counts["agree"] += 1
        counts["both_1" if our else "both_0"] += 1
        continue
      counts["ours_only" if our else "math_verify_only"] += 1
      verdict_class, reason = classify(corpus, case, our, their, read)
      disagreements.append({"corpus": corpus, "response": case[0], "gold": case[1],
                            "ours": our, "math_verify": their, "math_verify_read": read,
                            "class": verdict_class, "reason": reason})
    summary[corpus] = counts
    print(f"{corpus}: {counts}")
  by_class: dict[str, int] = {}
  for d in disagreements:
    by_class[d["class"]] = by_class.get(d["class"], 0) + 1
  print(f"disagreements by class: {by_class}")

  timed = {corpus: [(c[0], c[4]) for c in corpora[corpus]] for corpus in ("gsm8k", "tables")}
  timed["both"] = timed["gsm8k"] + timed["tables"]
  rules = {"after": math_answer.final_answer}
  for rule, revision in (("before", args.baseline), ("grammar_v1", args.grammar_baseline)):
    loaded = load_rule(revision)
    if loaded is None:
      print(f"({rule}, {revision}, is not in this clone)")
    else:
      rules[rule] = loaded
  load_before = os.getloadavg()[0]   # the cost is only as quiet as the machine
  runs = {f"{rule}_{corpus}": [] for rule in rules for corpus in timed}
  for _ in range(args.repeats):   # interleaved: a change of load hits both rules alike
    for corpus, responses in timed.items():
      for rule, final_answer in rules.items():
        runs[f"{rule}_{corpus}"] += cost(final_answer, responses, 1)
  cost_us = {name: statistics.median(times) for name, times in runs.items()}
  for corpus, responses in timed.items():
    figures = ", ".join(f"{rule} {cost_us[f'{rule}_{corpus}']:.1f}" for rule in rules)
    print(f"final_answer µs per response, {corpus} ({len(responses)}): {figures}")

  decodes = tiny_decodes(args.tiny_decodes, rules) if args.tiny_decodes else None
  wrong = by_class.get("math-verify right", 0)
  _common.write_json(args.out, {
      "tiny_decodes": decodes, "tiny_decodes_problems": args.tiny_decodes,
      "math_verify": "0.9.0", "tiny_problems": args.tiny_problems, "summary": summary,
      "disagreements_by_class": by_class, "disagreements": disagreements,
      "cost_us_per_response": cost_us, "cost_runs_us": runs, "cost_baseline": args.baseline,
      "cost_grammar_baseline": args.grammar_baseline,
      "cost_responses": {k: len(v) for k, v in timed.items()},
      "cost_load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
      "math_verify_right_ours_wrong": wrong})
  print(f"wrote {args.out}")
  print(f"math_verify_right_ours_wrong: {wrong}")


if __name__ == "__main__":
  main()
