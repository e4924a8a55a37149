"""The code cites its design through the repository's own documentation, and every citation
resolves.

* No file of the repository (code, tests, docs, configs, benchmarks, launchers, the Makefile,
  notebooks, assets) cites the design record in the old form (the section sign after the word
  for it) or names its former file: the design lives in docs/.
* Every reference `docs/<page>.md#<anchor>` in any file, and every Markdown link to a page's
  heading (`[text](page.md#anchor)`, `[text](#anchor)`), names an existing page and one of its
  headings. Anchors are GitHub's: the heading in lower case, punctuation dropped, spaces turned
  into '-', a repeated heading numbered (`-1`, `-2`, ...).
"""
from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP_DIRS = {".git", ".venv", "__pycache__", "work_dirs", "runs", "build", "dist",
             ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
TEXT_SUFFIXES = (".py", ".md", ".ipynb", ".toml", ".cfg", ".txt", ".txtpb", ".json", ".jsonl",
                 ".yaml", ".yml", ".sh", ".run")
TEXT_NAMES = ("Makefile",)
# Matched in any case, so that this file does not itself hold the upper-case form it looks for.
OLD_CITATION = re.compile(r"\bdesign\s*§", re.IGNORECASE)
OLD_FILE = re.compile(r"\bdesign\.md\b", re.IGNORECASE)
DOCS = "docs" + "/"    # the planted broken references of the last test, spelled in parts too

# Files the first check skips (none left); any docs reference they hold must still resolve.
NOT_YET_CONVERTED: tuple[str, ...] = ()

DOC_REFERENCE = re.compile(r"docs/([\w.-]+?)\.md#([\w-]+)")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]*?\.md)?#([\w-]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def github_anchor(heading: str) -> str:
  """GitHub's anchor of a heading's text: links keep their text, then lower case, every
  character but letters, digits, '_', '-' and spaces dropped, spaces turned into '-'."""
  text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
  text = re.sub(r"[^\w\- ]", "", text.lower())
  return text.replace(" ", "-")


def page_anchors(markdown: str) -> set[str]:
  """Every heading anchor of a Markdown page (headings inside fenced code are not headings;
  a repeated anchor gets GitHub's -1, -2, ... suffixes)."""
  anchors: set[str] = set()
  seen: dict[str, int] = {}
  in_fence = False
  for line in markdown.splitlines():
    if FENCE.match(line):
      in_fence = not in_fence
      continue
    match = None if in_fence else HEADING.match(line)
    if match is None:
      continue
    anchor = github_anchor(match.group(2))
    n = seen.get(anchor, 0)
    seen[anchor] = n + 1
    anchors.add(anchor if n == 0 else f"{anchor}-{n}")
  return anchors


def repository_files(root: str = ROOT) -> list[str]:
  """Paths (relative to `root`) of every text file of the repository."""
  out = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
    for name in sorted(files):
      if name.endswith(TEXT_SUFFIXES) or name in TEXT_NAMES:
        out.append(os.path.relpath(os.path.join(folder, name), root))
  return out


def read(root: str, rel: str) -> str:
  with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
    return f.read()


def old_citations(root: str = ROOT, skip=NOT_YET_CONVERTED) -> list[str]:
  """'path:line: text' of every line that cites the design record the old way."""
  found = []
  for rel in repository_files(root):
    if rel.replace(os.sep, "/") in skip:
      continue
    for i, line in enumerate(read(root, rel).splitlines(), 1):
      if OLD_CITATION.search(line) or OLD_FILE.search(line):
        found.append(f"{rel}:{i}: {line.strip()}")
  return found


def references(rel: str, text: str):
  """(line, page path relative to the root, anchor) of every doc reference in one file."""
  folder = os.path.dirname(rel)
  for i, line in enumerate(text.splitlines(), 1):
    for match in DOC_REFERENCE.finditer(line):
      yield i, f"docs/{match.group(1)}.md", match.group(2)
    if not rel.endswith(".md"):
      continue
    for match in MARKDOWN_LINK.finditer(line):
      page = rel if match.group(1) is None else os.path.join(folder, match.group(1))
      yield i, os.path.normpath(page).replace(os.sep, "/"), match.group(2)


def broken_references(root: str = ROOT) -> list[str]:
  """'path:line: page#anchor (why)' of every doc reference that does not resolve."""
  anchors: dict[str, set[str] | None] = {}
  broken = []
  for rel in repository_files(root):
    for line, page, anchor in references(rel, read(root, rel)):
      if page not in anchors:
        path = os.path.join(root, page)
        anchors[page] = page_anchors(read(root, page)) if os.path.isfile(path) else None
      known = anchors[page]
      if known is None or anchor not in known:
        why = "no such page" if known is None else "no such heading"
        broken.append(f"{rel}:{line}: {page}#{anchor} ({why})")
  return broken


def test_no_file_cites_the_design_record_the_old_way():
  assert old_citations() == []


def test_every_doc_reference_resolves_to_a_page_and_heading():
  assert broken_references() == []


def test_the_code_cites_the_docs():
  # the references this test resolves exist: the code's design citations point into docs/
  cited = [rel for rel in repository_files() if rel.startswith("orl_jax")
           and DOC_REFERENCE.search(read(ROOT, rel))]
  assert len(cited) > 50


def test_github_anchors_of_headings_as_written_in_the_docs():
  assert github_anchor("The residual pathway") == "the-residual-pathway"
  assert github_anchor("LLaDA2.x-mini, LLaDA-8B, SDAR, QwenDLM") == (
      "llada2x-mini-llada-8b-sdar-qwendlm")
  assert github_anchor("Where blocks sit: `decode.block_placement`") == (
      "where-blocks-sit-decodeblock_placement")
  assert github_anchor("Decoding as each model's authors do") == (
      "decoding-as-each-models-authors-do")
  assert github_anchor("Replay: states, packing, staircase attention") == (
      "replay-states-packing-staircase-attention")
  assert github_anchor("See [the guide](../README.md) first") == "see-the-guide-first"
  page = "# A\n\n## Setup\n\n```\n# not a heading\n```\n\n### Setup\n"
  assert page_anchors(page) == {"a", "setup", "setup-1"}


def _write(root, rel, text):
  path = root / rel
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def test_an_old_citation_and_a_broken_reference_are_caught(tmp_path):
  _write(tmp_path, "docs/method.md", "# Method\n\n## The losses\n\nSee [below](#the-losses).\n")
  _write(tmp_path, "orl_jax/ok.py", '"""Losses (docs/method.md#the-losses)."""\n')
  assert old_citations(tmp_path, skip=()) == []
  assert broken_references(tmp_path) == []
  # the planted citations are spelled in parts, so that this file does not hold them
  _write(tmp_path, "orl_jax/old.py", '"""Losses (Des' + 'ign §2.6)."""\n')
  _write(tmp_path, "Makefile", "# see design" + ".md\n")
  _write(tmp_path, "orl_jax/bad.py", f"# {DOCS}method.md#the-loss and {DOCS}nothing.md#x\n")
  _write(tmp_path, "docs/other.md", "# Other\n\n[gone](method.md#gone)\n")
  assert len(old_citations(tmp_path, skip=())) == 2
  assert old_citations(tmp_path, skip=("orl_jax/old.py", "Makefile")) == []
  assert sorted(broken_references(tmp_path)) == [
      f"docs/other.md:3: {DOCS}method.md#gone (no such heading)",
      f"orl_jax/bad.py:1: {DOCS}method.md#the-loss (no such heading)",
      f"orl_jax/bad.py:1: {DOCS}nothing.md#x (no such page)",
  ]
