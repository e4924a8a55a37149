"""Every command of README.md and of the pages in docs/ that runs the project — a `launch/` script
or a `make` target, in a shell block or inline — is either run by a test or marked in its page
as needing real weights or an accelerator.

* `EXERCISED` maps a documented command to the test that runs it (the `:debug` / smoke configs and
  tiny random directories standing in for real weights and full sizes) and to strings that
  test's source must contain (the launcher or library entry point, the config variant), so a
  row cannot point at a test that does something else. `Makefile::target` rows point at the
  suite itself (`make test`).
* A marked block is a shell block whose nearest non-blank line above starts with `*Needs `
  (e.g. "*Needs real weights (...); not run by the tests:*").

Adding a command that is neither fails `test_every_readme_command_is_exercised_or_marked`; a row
whose command left every page fails `test_every_table_row_is_a_readme_command`. Benchmarks
(`python benchmarks/...`, `make bench`) are measurements, outside this check. The pages are
README.md and docs/*.md (not docs/_incoming/, drafts waiting to be merged into a page)."""
from __future__ import annotations

import ast
import dataclasses
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHELL_FENCES = ("```bash", "```sh", "```shell")
MARKER = "*Needs "

_DEMO = ("tests/apps/test_demo_report.py::"
         "test_demo_over_seeds_merges_them_and_a_rerun_evaluates_nothing_again")
_ORL = "tests/train/test_train.py::test_orl_is_on_policy_and_resumes_exactly"
_COMPILE = ("tests/kernels/test_compile.py::"
            "test_the_tiny_orl_iteration_compiles_for_v5e_with_the_staircase_kernel")
_DEBUG_RUNS = "tests/config/test_real_configs.py::test_debug_config_runs_two_orl_iterations"
_LLADA2_SIZING = "tests/models/test_families.py::test_llada2_mini_dry_run_matches_hand_calculation"
_EVAL_LAUNCHER = ("tests/apps/test_real_task_eval.py::"
                  "test_eval_launcher_gsm8k_base_vs_orl_on_llada_debug")
# the export step of _DEBUG_RUNS (a helper it calls)
_EXPORT = "tests/config/test_real_configs.py::_check_export_and_round_trip"
_JSONL = ("tests/config/test_real_configs.py::"
          "test_debug_jsonl_trains_on_the_example_file_and_its_run_evaluates_and_decodes")
_JSONL_CFG = 'get_config("debug-jsonl")'
_DECODE_HF = ("tests/apps/test_decode_launcher.py::"
              "test_decode_prompt_from_hf_llada_directory_equals_library_decode")

# README command -> (test that runs it, strings its source contains). Stand-ins are named in
# the comment where the test runs the same code on smaller settings.
EXERCISED = {
    # the demo pipeline (base -> warm-up -> ORL -> evaluation) on smoke shapes, two seeds and an
    # ablation; the offline baseline stage alone: test_train.py::test_rcd_offline_...
    "make demo": (_DEMO, ("demo.run_demo", 'pipeline = "demo"')),
    "python launch/train.py --config=configs/tiny.py": (_DEMO, ("demo.run_demo",)),
    "python launch/train.py --config=configs/tiny.py --config.demo.compare_offline=True "
    "--config.demo.ablations=\"('no_aec','no_kl','no_residual')\" --config.demo.seeds=\"(0,1,2)\"":
        (_DEMO, ("c.demo.seeds", "c.demo.ablations")),
    "python launch/train.py --config=configs/tiny.py:ablations":
        (_DEMO, ("c.demo.seeds", "c.demo.ablations")),
    # on a hand-written study directory stopped part-way
    "python launch/report.py --workdir=work_dirs/tiny_ablations":
        ("tests/apps/test_demo_report.py::test_study_report_reads_a_study_stopped_part_way",
         ("launch/report.py", "--workdir=")),
    "make warmup": (_DEMO, ('"warmup"',)),
    "python launch/train.py --config=configs/tiny.py:warmup": (_DEMO, ('"warmup"',)),
    "make test": ("Makefile::test", ("pytest",)),
    "make lint": ("Makefile::lint", ("ruff check", "mypy")),
    "make test-other-cpu": ("Makefile::test-other-cpu", ("pytest", "--xla_cpu_max_isa=")),
    'make test-other-cpu OTHER_CPU_ISAS="SSE4_2 AVX AVX2" OTHER_CPU_PASSES=3':
        ("Makefile::test-other-cpu", ("$(OTHER_CPU_ISAS)", "$(OTHER_CPU_PASSES)",
                                      "tests/scripts/other_cpu_isas.py")),
    "make test-slow": ("Makefile::test-slow", ("pytest", "-m slow")),
    "make browser": ("Makefile::browser", ("pytest", "-m browser", "apt-get install")),
    "make compilers": ("Makefile::$(COMPILERS)", ("--target", "orl_jax.aot.targets tpu",
                                                  "orl_jax.aot.targets cuda")),
    # the compile command on the tiny ORL iteration for v5e (the paper models' own runs take
    # minutes each on a CPU host; their results are the table of docs/scaling.md)
    "python launch/compile.py --config=configs/sdar.py:8b --target=v5p:2x2x1":
        (_COMPILE, ("_compile(", "--target=v5e:2x2")),
    "python launch/compile.py --config=configs/llada.py:2.1-mini --target=h100x8 --tpf=4":
        (_COMPILE, ("_compile(", "--target=v5e:2x2")),
    "python launch/compile.py --config=configs/llada.py:2.1-mini --target=v5p:2x2x1 "
    "--programs=train_step": (_COMPILE, ("_compile(", "--target=v5e:2x2")),
    "python launch/compile.py --config=configs/sdar.py:8b --target=v5p:2x2x1 "
    "--programs=train_step": (_COMPILE, ("_compile(", "--target=v5e:2x2")),
    "python launch/compile.py --config=configs/llada.py:8b-instruct --target=v5p:2x2x1 "
    "--programs=train_step": (_COMPILE, ("_compile(", "--target=v5e:2x2")),
    "python launch/compile.py --config=configs/diffusion_gemma.py --target=h200x8 "
    "--programs=train_step": (_COMPILE, ("_compile(", "--target=v5e:2x2")),
    "make test-all": ("Makefile::test-all", ("pytest",)),
    "make base": ("tests/storage/test_base_checkpoint.py::"
                  "test_make_base_reproduces_the_committed_base",
                  ("base_model.make_base", 'get_config("sft")')),
    # SFT from scratch on the smoke shapes (4 steps, resumed past a damaged checkpoint)
    "python launch/train.py --config=configs/tiny.py:sft --config.train.steps=2000":
        ("tests/train/test_train.py::test_exact_resume_is_bit_identical", ("train(_smoke(",)),
    "python launch/train.py --config=configs/tiny.py:orl": (_ORL, ("train(orl_smoke_config",)),
    # the ORL loop; rollouts at entropy_budget: tests/models/test_model.py, the gate:
    # tests/train/test_orl.py
    "python launch/train.py --config=configs/tiny.py:orl --config.orl.rollout_rule=entropy_budget "
    "--config.orl.rollout_rule_value=0.5 --config.loss.gate_entropy=0.05":
        (_ORL, ("train(orl_smoke_config",)),
    "python launch/train.py --config=configs/tiny.py:rcd_offline":
        ("tests/train/test_train.py::test_rcd_offline_trains_from_a_frozen_reference",
         ("demo.stages.rcd_offline", "train(")),
    # evaluation of the committed base with the tiny eval config (one setting, 64 problems)
    "python launch/eval.py --config=configs/tiny.py:eval --config.model.init_from=assets/tiny_base "
    "--config.eval.settings=\"('threshold_0.7','threshold_0.9','entropy_budget_0.5')\"":
        ("tests/storage/test_base_checkpoint.py::test_committed_base_model_is_accurate",
         ('get_config("eval")', "init_from = BASE", "evaluate_setting")),
    # models side by side from launch/eval.py (the debug LLaDA standing in for the tiny models)
    "launch/eval.py --config=configs/tiny.py:eval "
    "--config.eval.compare=assets/tiny_base:base,assets/tiny_warmup:warmup,DIR:orl":
        (_EVAL_LAUNCHER, ("launch/eval.py", "--config.eval.compare=")),
    "python launch/decode.py --config=configs/tiny.py:eval "
    "--models=base=assets/tiny_base,orl=DIR":
        ("tests/apps/test_decode_launcher.py::test_models_flag_decodes_tiny_models_side_by_side",
         ('get_config("eval")', "models_to_decode", "tiny_base", "write_page")),
    # real-weight commands, run on tiny random directories / debug configs (also marked)
    "python launch/decode.py --config=configs/llada.py:8b-instruct "
    "--config.model.path=/path/LLaDA-8B-Instruct --prompt=\"What is 7 * 8?\"":
        (_DECODE_HF, ("launch/decode.py", "--config=configs/llada.py:8b-instruct",
                      "--config.model.path=", "--prompt=")),
    "python launch/eval.py --config=configs/sdar.py:4b --config.task.name=gsm8k "
    "--config.eval.compare=/path/SDAR-4B-Chat:base,work_dirs/sdar_4b_my_train:orl":
        (_EVAL_LAUNCHER, ("launch/eval.py", "--config.task.name=gsm8k")),
    # the exporter on a run's work directory, with a config written for another size
    "python launch/export.py --config=configs/sdar.py:4b --params=work_dirs/sdar_4b_my_train "
    "--out=work_dirs/sdar_4b_my_train/hf_sharded --max_shard_bytes=5000000000":
        (_EXPORT, ("launch/export.py", "--params={tmp_path}", "--out=")),
    # ORL on the shipped JSONL file, then the run evaluated, decoded and exported from its work
    # directory with no task flags (one ORL iteration, four problems)
    "python launch/train.py --config=configs/llada.py:debug-jsonl":
        (_JSONL, ("train(", _JSONL_CFG)),
    "python launch/eval.py --config=configs/llada.py:debug-jsonl "
    "--config.model.path=work_dirs/llada_debug_jsonl": (_JSONL, ("evaluate_models(", _JSONL_CFG)),
    "python launch/decode.py --config=configs/llada.py:debug-jsonl "
    "--config.model.path=work_dirs/llada_debug_jsonl --num=2": (_JSONL, ("decode_model(",)),
    "python launch/export.py --config=configs/llada.py:debug-jsonl "
    "--params=work_dirs/llada_debug_jsonl --out=work_dirs/llada_debug_jsonl/hf_export":
        (_EXPORT, ("launch/export.py", "--params={tmp_path}")),
    # sizing: 8 and 64 devices of LLaDA2.1-mini against a hand calculation
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 python launch/train.py "
    "--config=configs/llada.py:2.1-mini --config.dry_run=True":
        (_LLADA2_SIZING, ('get_config("2.1-mini")', "dry_run.sizing_rows")),
    "python launch/train.py --config=configs/llada.py:2.1-mini --config.dry_run=True "
    "--config.mesh.fsdp=8 --config.mesh.expert=8":
        (_LLADA2_SIZING, ('get_config("2.1-mini")', "c.mesh.expert", "dry_run.sizing_rows")),
    # the dry-run launcher on LLaDA-8B over fsdp=8 (SDAR-8B's table is the same code)
    "python launch/train.py --config=configs/sdar.py:8b --config.dry_run=True "
    "--config.mesh.fsdp=64":
        ("tests/apps/test_dry_run.py::test_launcher_prints_the_table",
         ("launch/train.py", "--config.dry_run=True", "--config.mesh.fsdp=")),
    "python launch/train.py --config=configs/llada.py:debug":
        (_DEBUG_RUNS, ("launch/train.py", '.py:debug"')),
    "python launch/train.py --config=configs/diffusion_gemma.py:debug --config.train.steps=2":
        ("tests/train/test_diffusion_gemma_train.py::"
         "test_debug_config_trains_two_orl_iterations_and_exports_for_transformers",
         ('get_config("debug")', "c.train.steps = 2", "train(")),
    # the launcher's compare path (evaluate_models) on the debug config
    # (_config: get_config("debug"), 16 problems)
    "python launch/eval.py --config=configs/diffusion_gemma.py:debug "
    "--config.eval.compare=random:base":
        ("tests/apps/test_diffusion_gemma_eval.py::"
         "test_evaluation_reports_tpf_in_both_conventions_as_counted_by_hand",
         ("_config(tmp_path)", "evaluate_models(", "RANDOM_INIT")),
    # the server as the README starts it (with --port=0 added), through the openai package,
    # raw HTTP and lm-evaluation-harness; drained with SIGTERM
    "python launch/serve.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base":
        ("tests/serve/test_serve_api.py::test_openai_completions_equal_the_offline_decode_with_forward_"
         "counts", ("client.completions.create(", "alone(parts")),
    # the server with API keys from the environment and the command line, through the openai
    # package (401 without a key, the offline decode's text with each); with an admin key and
    # a reload root (pytest's temporary folder in the test), reloads from under it only
    "ORL_API_KEYS=key-one,key-two python launch/serve.py --config=configs/tiny.py:eval "
    "--config.model.path=assets/tiny_base --api-key=key-three":
        ("tests/serve/test_serve_limits.py::"
         "test_the_openai_client_gets_401_without_a_key_and_the_answer_with_one",
         ("openai.AuthenticationError", "alone(offline()")),
    "ORL_ADMIN_KEYS=admin-key python launch/serve.py --config=configs/tiny.py:eval "
    "--config.model.path=assets/tiny_base --config.serve.reload_root=work_dirs":
        ("tests/serve/test_serve_api.py::"
         "test_reloads_need_the_admin_key_and_a_folder_under_the_reload_root",
         ("_reload(server", "reload_root", "{403}")),
    # two models and the playground, driven in headless Chromium (`make browser`)
    "python launch/serve.py --config=configs/tiny.py:eval "
    "--models=base=assets/tiny_base,warmup=assets/tiny_warmup --config.serve.iterations_per_call=1":
        ("tests/serve/test_playground_browser.py::"
         "test_the_page_streams_the_prompt_to_both_models_until_both_finish",
         ("sync_playwright", "launch_persistent_context", 'server.url + "/"')),
    "XLA_FLAGS=--xla_force_host_platform_device_count=8 python launch/train.py "
    "--config=configs/diffusion_gemma.py:26b-a4b --config.dry_run=True":
        ("tests/models/test_diffusion_gemma_registry.py::test_26b_a4b_dry_run_matches_hand_calculation",
         ('get_config("26b-a4b")', "dry_run.sizing_rows")),
}


@dataclasses.dataclass(frozen=True)
class Command:
  text: str       # one command, continuation lines joined, comments dropped, spaces collapsed
  line: int       # 1-based line in its page where it starts
  marked: bool    # inside a block marked as needing weights or an accelerator
  page: str = "README.md"   # the page, relative to the repository root


def _runs_project(text: str) -> bool:
  """A command of this project: a launch/ script with arguments, or a make target that is not
  a benchmark (its recipe runs benchmarks/)."""
  if text.startswith("make "):
    return "benchmarks/" not in (_makefile_recipe(text.split()[1]) or "")
  return "launch/" in text and " --" in text


def _strip_comment(line: str) -> str:
  """Drops a shell comment (`# ...` outside quotes)."""
  quote = None
  for i, ch in enumerate(line):
    if ch in "'\"" and quote in (None, ch):
      quote = None if quote else ch
    elif ch == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
      return line[:i]
  return line


def _block_commands(lines: list[str], start: int, marked: bool) -> tuple[list[Command], int]:
  """Commands of the shell block opening at `start`; returns them and the closing line index."""
  out, parts, first = [], [], None
  i = start + 1
  while i < len(lines) and not lines[i].startswith("```"):
    piece = _strip_comment(lines[i]).strip()
    if piece:
      first = i if first is None else first
      parts.append(piece[:-1].strip() if piece.endswith("\\") else piece)
      if not piece.endswith("\\"):
        out.append(Command(" ".join(" ".join(parts).split()), first + 1, marked))
        parts, first = [], None
    i += 1
  return out, i


def _is_marked(lines: list[str], fence: int) -> bool:
  """The paragraph right above the block starts with MARKER."""
  i = fence - 1
  while i >= 0 and not lines[i].strip():
    i -= 1
  while i > 0 and lines[i - 1].strip() and not lines[i - 1].startswith("```"):
    i -= 1
  return i >= 0 and lines[i].lstrip().startswith(MARKER)


def _fenced(lines: list[str]) -> list[bool]:
  """Whether each line belongs to a fenced block (fences included)."""
  out, inside = [], False
  for line in lines:
    fence = line.startswith("```")
    out.append(inside or fence)
    inside = inside != fence
  return out


def readme_commands(text: str) -> list[Command]:
  """Every project command of a README text: shell blocks, then inline code spans."""
  lines, out, i = text.splitlines(), [], 0
  while i < len(lines):
    if lines[i].strip() in SHELL_FENCES:
      block, i = _block_commands(lines, i, _is_marked(lines, i))
      out += [c for c in block if _runs_project(c.text)]
    elif lines[i].startswith("```"):                       # another language: skip the block
      i += 1
      while i < len(lines) and not lines[i].startswith("```"):
        i += 1
    i += 1
  prose = "\n".join("" if _in_fence else line for line, _in_fence in zip(lines, _fenced(lines)))
  for m in re.finditer(r"`([^`\n]*(?:\n[^`\n]*)?)`", prose):
    span = " ".join(m.group(1).split())
    if (span.startswith("make ") or " --" in span) and _runs_project(span):
      out.append(Command(span, prose[:m.start()].count("\n") + 1, False))
  return out


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    return f.read()


def doc_pages() -> list[str]:
  """README.md and the pages of docs/ (relative paths); docs/_incoming/ holds drafts, not pages."""
  return ["README.md"] + sorted(os.path.relpath(p, ROOT)
                                for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))


def documented_commands() -> list[Command]:
  """Every project command of every page, each tagged with its page."""
  out = []
  for page in doc_pages():
    with open(os.path.join(ROOT, page)) as f:
      out += [dataclasses.replace(c, page=page) for c in readme_commands(f.read())]
  return out


def _makefile_recipe(target: str) -> str | None:
  """The recipe lines of a Makefile target (None: no such target)."""
  with open(os.path.join(ROOT, "Makefile")) as f:
    text = f.read()
  m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n?)*)", text, re.M)
  return m.group(1) if m else None


def _test_source(node: str) -> str:
  """The source of `path::function` (or a Makefile target's recipe)."""
  path, name = node.split("::")
  if path == "Makefile":
    recipe = _makefile_recipe(name)
    assert recipe is not None, f"Makefile has no target {name!r}"
    return recipe
  with open(os.path.join(ROOT, path)) as f:
    source = f.read()
  for fn in ast.walk(ast.parse(source)):
    if isinstance(fn, ast.FunctionDef) and fn.name == name:
      return ast.get_source_segment(source, fn)
  raise AssertionError(f"{path} has no test {name}")


def test_every_readme_command_is_exercised_or_marked():
  commands = documented_commands()
  assert len(readme_commands(_readme())) > 10   # the extractor still finds the README's commands
  assert len(commands) > 30                     # ... and the pages' commands
  lost = [f"{c.page}:{c.line}: {c.text}" for c in commands
          if not c.marked and c.text not in EXERCISED]
  assert not lost, ("documented commands that no test runs and no '*Needs ...' line marks (add a "
                    "row to EXERCISED or mark the block):\n" + "\n".join(lost))


def test_every_table_row_is_a_readme_command():
  texts = {c.text for c in documented_commands()}
  stale = [k for k in EXERCISED if k not in texts]
  assert not stale, f"EXERCISED rows whose command is in no page (README.md, docs/*.md): {stale}"


def test_each_row_names_a_test_that_runs_its_command():
  for command, (node, evidence) in EXERCISED.items():
    source = _test_source(node)
    missing = [e for e in evidence if e not in source]
    assert not missing, f"{node} (for {command!r}) does not contain {missing}"


def test_make_targets_of_the_readme_exist():
  for c in documented_commands():
    if c.text.startswith("make "):
      assert _makefile_recipe(c.text.split()[1]) is not None, f"{c.page}:{c.line}: {c.text}"


def test_readme_is_a_short_user_guide():
  assert len(_readme().splitlines()) <= 350, "README.md: keep it ≤ 350 lines; move detail to docs/"


def test_relative_links_of_every_page_resolve():
  """Every relative Markdown link and image of a page names a file or folder that exists."""
  broken = []
  for page in doc_pages():
    with open(os.path.join(ROOT, page)) as f:
      text = f.read()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      path = target.split("#")[0]
      if not path or re.match(r"[a-z]+:", path):
        continue
      if not os.path.exists(os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path))):
        broken.append(f"{page}: {target}")
  assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_an_unmarked_unexercised_command_is_caught():
  """The extractor on a made-up README: a new command fails unless its block is marked."""
  text = ("Run it:\n\n```bash\n# a comment\npython launch/train.py --config=configs/new.py \\\n"
          "    --config.train.steps=3   # trailing comment\nls -l\n```\n\n"
          "*Needs real weights; not run by the tests:*\n\n```bash\n"
          "python launch/eval.py --config=configs/big.py --config.model.path=/w\n```\n\n"
          "```python\nimport launch  # python launch/train.py --config=x\n```\n"
          "Inline: `python launch/decode.py --config=configs/tiny.py:eval\n--num=2`, `make demo`,"
          " and a bare `launch/eval.py`.\n")
  got = [(c.text, c.marked) for c in readme_commands(text)]
  assert got == [("python launch/train.py --config=configs/new.py --config.train.steps=3", False),
                 ("python launch/eval.py --config=configs/big.py --config.model.path=/w", True),
                 ("python launch/decode.py --config=configs/tiny.py:eval --num=2", False),
                 ("make demo", False)]
  unexercised = [t for t, marked in got if not marked and t not in EXERCISED]
  assert unexercised == ["python launch/train.py --config=configs/new.py --config.train.steps=3",
                         "python launch/decode.py --config=configs/tiny.py:eval --num=2"]


# ------------------------------------------------------ documented commands run as printed

# Commands of the pages that need neither weights nor an accelerator, run exactly as printed
# (`test_documented_commands_run_as_printed`, slow: minutes each) in a scratch directory laid
# out as the repository (its own work_dirs/), in order within a group: a later command reads
# what an earlier one wrote. Each comes with text its output must contain.
AS_PRINTED = {
    "jsonl_run": {
        "python launch/train.py --config=configs/llada.py:debug-jsonl":
            ("orl: 4/4 updates applied", "Hugging Face export: work_dirs/llada_debug_jsonl/hf",
             "training curves: work_dirs/llada_debug_jsonl/curves.png"),
        "python launch/eval.py --config=configs/llada.py:debug-jsonl "
        "--config.model.path=work_dirs/llada_debug_jsonl":
            ("llada_debug_jsonl: work_dirs/llada_debug_jsonl/params on 36 of the 36 jsonl "
             "(examples/math_and_code.jsonl) problems", "results: "),
        "python launch/decode.py --config=configs/llada.py:debug-jsonl "
        "--config.model.path=work_dirs/llada_debug_jsonl --num=2":
            ("== llada_debug_jsonl (work_dirs/llada_debug_jsonl/params)", "trajectories: "),
        "python launch/export.py --config=configs/llada.py:debug-jsonl "
        "--params=work_dirs/llada_debug_jsonl --out=work_dirs/llada_debug_jsonl/hf_export":
            ("exported: ",),
    },
    "llada_debug": {"python launch/train.py --config=configs/llada.py:debug":
                    ("orl: 2/2 updates applied", "parameters: work_dirs/llada_debug/params")},
    "dry_runs": {
        "python launch/train.py --config=configs/sdar.py:8b --config.dry_run=True "
        "--config.mesh.fsdp=64": ("per-device GiB",),
        "XLA_FLAGS=--xla_force_host_platform_device_count=8 python launch/train.py "
        "--config=configs/llada.py:2.1-mini --config.dry_run=True": ("per-device GiB",),
        "python launch/train.py --config=configs/llada.py:2.1-mini --config.dry_run=True "
        "--config.mesh.fsdp=8 --config.mesh.expert=8": ("per-device GiB",),
        "XLA_FLAGS=--xla_force_host_platform_device_count=8 python launch/train.py "
        "--config=configs/diffusion_gemma.py:26b-a4b --config.dry_run=True": ("per-device GiB",),
    },
    "diffusion_gemma_debug": {
        "python launch/train.py --config=configs/diffusion_gemma.py:debug --config.train.steps=2":
            ("parameters: ",),
        "python launch/eval.py --config=configs/diffusion_gemma.py:debug "
        "--config.eval.compare=random:base": ("results: ",),
    },
    "tiny_eval": {
        "python launch/eval.py --config=configs/tiny.py:eval "
        "--config.model.init_from=assets/tiny_base "
        "--config.eval.settings=\"('threshold_0.7','threshold_0.9','entropy_budget_0.5')\"":
            ("tiny_base: assets/tiny_base on 2048 of the 2048 tiny problems", "tiny_base "),
    },
}

# Commands that need real weights, run on tiny random Hugging Face directories of the family
# with only `/path/...` replaced (`TINY_DIRS`; `my_train.jsonl` is a copy of the shipped
# example). A training or evaluation command at its full size (300 ORL updates; 1319 GSM8K
# problems with 7 decoder settings) is no CPU test: it also gets the `SHRINK` flags appended.
SHRINK = {
    "train": ("--config.train.steps=2 --config.train.warmup_steps=1 --config.decode.gen_length=32 "
              "--config.orl.prompts_per_step=2 --config.orl.group_size=2 "
              "--config.replay.row_len=1024 --config.replay.n_rows=4 "
              "--config.replay.max_states=32 --config.replay.max_responses=4"),
    "eval": ("--config.eval.n_problems=2 --config.task.prompt_len=1024 "
             "--config.decode.gen_length=16 --config.eval.batch_size=2 "
             "--config.eval.settings=\"('threshold_0.9',)\""),
}
WITH_PATHS = {
    "llada_8b_decode": {
        "python launch/decode.py --config=configs/llada.py:8b-instruct "
        "--config.model.path=/path/LLaDA-8B-Instruct --prompt=\"What is 7 * 8?\"":
            ("", ("== LLaDA-8B-Instruct (", "NFE paper")),
    },
    "llada2_run": {
        "python launch/train.py --config=configs/llada.py --config.model.path=/path/LLaDA2.1-mini "
        "--config.task.path=my_train.jsonl":
            ("train", ("orl: 0/2 updates applied: no response verified",
                       "Hugging Face export: work_dirs/llada2.1_mini_my_train/hf")),
    },
    "sdar_run": {
        "python launch/train.py --config=configs/sdar.py:4b --config.model.path=/path/SDAR-4B-Chat "
        "--config.task.path=my_train.jsonl":
            ("train", ("orl: 0/2 updates applied: no response verified",
                       "Hugging Face export: work_dirs/sdar_4b_my_train/hf")),
        "python launch/export.py --config=configs/sdar.py:4b --params=work_dirs/sdar_4b_my_train "
        "--out=work_dirs/sdar_4b_my_train/hf_sharded --max_shard_bytes=5000000000":
            ("", ("exported: ",)),
        "python launch/eval.py --config=configs/sdar.py:4b --config.task.name=gsm8k "
        "--config.eval.compare=/path/SDAR-4B-Chat:base,work_dirs/sdar_4b_my_train:orl":
            ("eval", ("base: ", "orl: work_dirs/sdar_4b_my_train", "results: ")),
    },
}

# Documented commands too long to run as printed on 2 CPU cores (their EXERCISED test runs the
# same code on smoke sizes), and why; `Makefile::` rows of EXERCISED are the suite itself.
TOO_LONG = {
    "make demo": "the demo: about 22 minutes",
    "python launch/train.py --config=configs/tiny.py": "the demo: about 22 minutes",
    "python launch/train.py --config=configs/tiny.py --config.demo.compare_offline=True "
    "--config.demo.ablations=\"('no_aec','no_kl','no_residual')\" --config.demo.seeds=\"(0,1,2)\"":
        "the demo with three ablations over three seeds: hours",
    "python launch/train.py --config=configs/tiny.py:ablations": "21 ORL runs: a working day",
    "python launch/report.py --workdir=work_dirs/tiny_ablations": "reads the ablation study's",
    "make base": "SFT of the tiny base: 18-33 minutes",
    "python launch/compile.py --config=configs/sdar.py:8b --target=v5p:2x2x1":
        "libtpu compiles SDAR-8B's programs: 20-60 minutes on 2 cores "
        "(tests/kernels/test_compile.py runs the same command on the tiny ORL iteration)",
    "python launch/compile.py --config=configs/llada.py:2.1-mini --target=h100x8 --tpf=4":
        "XLA's GPU compiler on LLaDA2.1-mini's programs: tens of minutes on 2 cores",
    "python launch/compile.py --config=configs/llada.py:2.1-mini --target=v5p:2x2x1 "
    "--programs=train_step": "libtpu compiles LLaDA2.1-mini's train step: about 30 minutes",
    "python launch/compile.py --config=configs/sdar.py:8b --target=v5p:2x2x1 "
    "--programs=train_step": "libtpu compiles SDAR-8B's train step: about 8 minutes",
    "python launch/compile.py --config=configs/llada.py:8b-instruct --target=v5p:2x2x1 "
    "--programs=train_step": "libtpu compiles LLaDA-8B's train step: about 4 minutes",
    "python launch/compile.py --config=configs/diffusion_gemma.py --target=h200x8 "
    "--programs=train_step": "XLA's GPU compiler on DiffusionGemma-26B's train step: about 15 "
                             "minutes",
    "python launch/serve.py --config=configs/tiny.py:eval --config.model.path=assets/tiny_base":
        "a server runs until it is stopped: tests/serve/test_serve_api.py starts this command "
        "(with --port=0, README_SERVE), talks to it and drains it with SIGTERM",
    "ORL_API_KEYS=key-one,key-two python launch/serve.py --config=configs/tiny.py:eval "
    "--config.model.path=assets/tiny_base --api-key=key-three":
        "a server runs until it is stopped: tests/serve/test_serve_limits.py starts this command "
        "(with --port=0 and short timeouts) and talks to it with and without each key",
    "ORL_ADMIN_KEYS=admin-key python launch/serve.py --config=configs/tiny.py:eval "
    "--config.model.path=assets/tiny_base --config.serve.reload_root=work_dirs":
        "a server runs until it is stopped: tests/serve/test_serve_api.py starts this command "
        "(its reload root pytest's temporary folder) and reloads with and without the key",
    "python launch/serve.py --config=configs/tiny.py:eval "
    "--models=base=assets/tiny_base,warmup=assets/tiny_warmup --config.serve.iterations_per_call=1":
        "a server runs until it is stopped: tests/serve/test_playground_browser.py starts this "
        "command (with --port=0, PLAYGROUND_SERVE) and drives its page in headless Chromium",
    "make warmup": "400 warm-up steps and their evaluation",
    "python launch/train.py --config=configs/tiny.py:sft --config.train.steps=2000": "2000 steps",
    "python launch/train.py --config=configs/tiny.py:warmup": "400 warm-up steps",
    "python launch/train.py --config=configs/tiny.py:orl": "300 ORL updates",
    "python launch/train.py --config=configs/tiny.py:orl --config.orl.rollout_rule=entropy_budget "
    "--config.orl.rollout_rule_value=0.5 --config.loss.gate_entropy=0.05": "300 ORL updates",
    "python launch/train.py --config=configs/tiny.py:rcd_offline": "300 offline RCD steps",
    "launch/eval.py --config=configs/tiny.py:eval "
    "--config.eval.compare=assets/tiny_base:base,assets/tiny_warmup:warmup,DIR:orl":
        "DIR is the ORL stage's 300 updates; then 3 models x 2048 problems",
    "python launch/decode.py --config=configs/tiny.py:eval --models=base=assets/tiny_base,orl=DIR":
        "DIR is the ORL stage's 300 updates",
}


def _scratch_checkout(path) -> str:
  """A directory laid out as the repository (links to its code, configs, assets, examples)."""
  for name in ("launch", "configs", "orl_jax", "orl_sandbox", "pallas_kernels", "assets",
               "examples"):
    os.symlink(os.path.join(ROOT, name), os.path.join(path, name))
  return str(path)


def _run_as_printed(command: str, cwd: str, expected) -> str:
  """`command` through bash in `cwd` (`python` is this interpreter's), which must succeed and
  print each of `expected`."""
  import subprocess
  import sys
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONIOENCODING="utf-8",
             PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
  out = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=1800)
  assert out.returncode == 0, f"{command}\n{out.stderr[-3000:]}"
  for text in expected:
    assert text in out.stdout, f"{command}: no {text!r} in\n{out.stdout[-3000:]}"
  return out.stdout


def test_every_unmarked_command_runs_as_printed_or_is_said_too_long():
  ran = {c for group in AS_PRINTED.values() for c in group}
  suite = {c for c, (node, _) in EXERCISED.items() if node.startswith("Makefile::")}
  left = [f"{c.page}:{c.line}: {c.text}" for c in documented_commands()
          if not c.marked and c.text not in ran | suite | set(TOO_LONG)]
  assert not left, ("unmarked documented commands neither run as printed (AS_PRINTED) nor "
                    "listed as too long to (TOO_LONG):\n" + "\n".join(left))
  texts = {c.text for c in documented_commands()}
  stale = [c for c in ran | set(TOO_LONG) | {c for g in WITH_PATHS.values() for c in g}
           if c not in texts]
  assert not stale, f"rows whose command is in no page: {stale}"


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(AS_PRINTED))
def test_documented_commands_run_as_printed(group, tmp_path):
  cwd = _scratch_checkout(tmp_path)
  for command, expected in AS_PRINTED[group].items():
    _run_as_printed(command, cwd, expected)


def _tiny_dirs(root) -> dict:
  """{'/path/NAME': a tiny random Hugging Face directory of that checkpoint's family}."""
  from flax import nnx
  from orl_jax.models import hf_write
  from orl_jax.models.build import build_model
  from orl_jax.models.transformer import ModelConfig
  from tests.support.hf import (OTHER_FAMILIES, QWEN3, QWEN3_SPECIALS, byte_tokenizer,
                                write_llada_hf_dir)
  out = {name: os.path.join(root, name)
         for name in ("LLaDA-8B-Instruct", "SDAR-4B-Chat", "LLaDA2.1-mini")}
  write_llada_hf_dir(out["LLaDA-8B-Instruct"], d_model=16, n_layers=2, seed=0)
  _, llada2, llada2_specials = OTHER_FAMILIES["llada"]
  for name, cfg, specials, model_type in (
      ("SDAR-4B-Chat", ModelConfig(**QWEN3), QWEN3_SPECIALS, "sdar"),
      ("LLaDA2.1-mini", llada2, llada2_specials, "llada2_moe")):
    tokenizer = os.path.join(root, f"{name}.tokenizer.json")
    byte_tokenizer(tokenizer, cfg.vocab_size, specials)
    hf_write.export_hf(out[name], nnx.state(build_model(cfg, 0), nnx.Param), cfg, cfg.hf_family,
                       tokenizer_file=tokenizer, model_type=model_type)
  return {f"/path/{name}": path for name, path in out.items()}


@pytest.mark.slow
@pytest.mark.parametrize("group", sorted(WITH_PATHS))
def test_real_weight_commands_run_on_tiny_directories_with_only_the_paths_changed(group,
                                                                                  tmp_path):
  import shutil
  cwd = _scratch_checkout(tmp_path)
  shutil.copyfile(os.path.join(ROOT, "examples", "math_and_code.jsonl"),
                  os.path.join(cwd, "my_train.jsonl"))
  dirs = _tiny_dirs(str(tmp_path / "models"))
  for command, (shrink, expected) in WITH_PATHS[group].items():
    for placeholder, path in dirs.items():
      command = command.replace(placeholder, path)
    assert "/path/" not in command
    _run_as_printed(f"{command} {SHRINK.get(shrink, '')}".strip(), cwd, expected)
