"""Every configuration field the code reads is declared in a config file.

A missing field read as `config.x.y` raises at once (ConfigDict), but `config.x.get("y",
default)` would silently use a default nobody declared. This test finds every `.get("name", …)`
whose receiver is a configuration in orl_jax/ and launch/ and checks that the field is declared
by some config (at that path where the receiver spells it)."""
import ast
import importlib
import os
import re

import ml_collections

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Names under which the code holds a configuration (or one of its sections).
# Root configurations (the field's path is spelled out) and sections held under short names
# (the field may sit in any section).
CONFIG_NAMES = re.compile(r"^(config|cfg|s\.config|setup\.config|self\.config)((\.\w+)*)$"
                          r"|^(m|t|r|d|dist_cfg)$")


def _declared() -> tuple[set[str], set[str]]:
  """(dotted paths, leaf names) of every field of every config variant."""
  variants = {"tiny": ["demo", "sft", "eval", "smoke", "ablations"], "llada": [None, "debug"],
              "sdar": [None, "debug"], "qwendlm": [None, "debug"],
              "diffusion_gemma": [None, "debug"]}
  tiny = importlib.import_module("configs.tiny")
  variants["tiny"] += list(tiny.STAGES)
  paths = set()

  def walk(d, prefix):
    for k, v in d.items():
      paths.add(prefix + k)
      if isinstance(v, (dict, ml_collections.ConfigDict)):
        walk(v, prefix + k + ".")
  for name, args in variants.items():
    module = importlib.import_module(f"configs.{name}")
    for arg in args:
      walk(module.get_config(arg), "")
  return paths, {p.rpartition(".")[2] for p in paths}


def _config_gets():
  """(file, line, receiver path or None, key) of each `.get("key", …)` on a configuration."""
  for folder in ("orl_jax", "launch"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
      for fname in files:
        if not fname.endswith(".py"):
          continue
        path = os.path.join(dirpath, fname)
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
          if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and node.args
                  and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
            continue
          receiver = ast.unparse(node.func.value)
          match = CONFIG_NAMES.match(receiver)
          if not match:
            continue
          section = (match.group(2) or "").lstrip(".") if match.group(1) else None
          yield os.path.relpath(path, ROOT), node.lineno, section, node.args[0].value


def test_every_config_field_read_with_a_default_is_declared():
  paths, leaves = _declared()
  gets = list(_config_gets())
  # the scan finds the code's reads (the launcher's, at the entry, are known to be there)
  assert {("launch/train.py", "pipeline"), ("launch/eval.py", "compare")} <= {
      (path, key) for path, _, _, key in gets}
  missing = []
  for path, line, section, key in gets:
    if section is None:
      ok = key in leaves
    else:
      ok = (f"{section}.{key}" if section else key) in paths
    if not ok:
      missing.append(f"{path}:{line}: {section + '.' if section else ''}{key}")
  assert not missing, "read but declared in no config file: " + ", ".join(missing)


def _declarations(func) -> dict[str, tuple[int, int]]:
  """{dotted field path: (first line, last line)} of each statement in `func` that declares a
  field: `c.a.b = value`, or `c.a = ConfigDict(dict(k=v, ...))` (one path per keyword)."""
  import inspect
  import textwrap
  source = textwrap.dedent(inspect.getsource(func))
  out = {}

  def path(node):
    parts = []
    while isinstance(node, ast.Attribute):
      parts.append(node.attr)
      node = node.value
    return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == "c" else None

  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
      continue
    target = path(node.targets[0])
    if target is None:
      continue
    span = (node.lineno, node.end_lineno)
    value = node.value
    if (isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Call)
        and getattr(value.args[0].func, "id", "") == "dict"):
      for kw in value.args[0].keywords:
        out[f"{target}.{kw.arg}"] = span
    else:
      out[target] = span
  return out, source


def test_every_field_of_the_base_config_is_documented_where_declared():
  """configs/tiny.py's `base_config` declares every field; each declaration carries a comment
  on its lines or on the line just above it (a comment block over a group counts for the
  statement right under it only)."""
  import io
  import tokenize
  tiny = importlib.import_module("configs.tiny")
  decls, source = _declarations(tiny.base_config)
  tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
            if t.type == tokenize.COMMENT]
  trailing = {t.start[0] for t in tokens if t.line.strip()[:1] != "#"}
  alone = {t.start[0] for t in tokens} - trailing     # comment-only lines
  fields = []

  def walk(d, prefix):
    for k, v in d.items():
      if isinstance(v, ml_collections.ConfigDict):
        walk(v, prefix + k + ".")
      else:
        fields.append(prefix + k)
  walk(tiny.base_config(), "")
  fields = [f for f in fields
            if not f.startswith(("demo.stages.", "demo.stage_start."))]  # overrides
  assert len(fields) > 100
  undeclared = [f for f in fields if f not in decls]
  assert not undeclared, f"fields set outside a plain declaration: {undeclared}"
  undocumented = [f for f in fields
                  if not (trailing & set(range(decls[f][0], decls[f][1] + 1))
                          or decls[f][0] - 1 in alone)]
  assert not undocumented, f"declared without a comment: {undocumented}"
