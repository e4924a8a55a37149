"""The shape of the code, read from its source with `ast` (nothing is imported or run):

* the import graph of `orl_jax/`, `pallas_kernels/` and `orl_sandbox/` — every import
  statement, the function-local ones included — has no cycle;
* neither has the graph of its folders: with every module of a package of `orl_jax/` (config,
  decode, models, replay, ...) taken as its package and every module at the root as itself, no
  package reaches back into itself through another (a loop between folders is a program whose
  first import decides whether it starts);
* the models (`orl_jax/models/`) sit below decoding, rollouts, replay, losses and training: no
  module under `models/` reaches one of those, directly or through the modules it imports;
* no module outside `orl_jax/models/` imports a family folder (`orl_jax.models.<family>`): the
  rest of the code reaches a family through the registry (`orl_jax.models.families`) and its
  sampler (`orl_jax.decode.build.sampler_of`), so a new family is its folder, a registry line
  and a config;
* the set-up of a run (`orl_jax/setup/`) sits below training: the dry run reaches no module of
  `orl_jax/train/`, and the compile path (`orl_jax/aot/`) imports from it only the loop's step
  builders (`STEP_BUILDERS`);
* the applications (`orl_jax/apps/`: the demo, the base model's pipeline, the dry run, the
  reports) sit on top of the library: no module outside `apps/` imports one;
* the command line's `ml_collections.ConfigDict` stops at the run config's entry
  (`CONFIG_DICT_ENTRY`: the conversion, the build, and the settings a trained run brings): no
  other library module imports ml_collections, unlocks a config or reads one with
  `.get(name, default)` — below the entry a run reads its typed `RunConfig`, whose sections
  hold every default;
* no function in `orl_jax/` or `pallas_kernels/` is longer than 80 lines.
* docs/code.md, the map of the code, names every library module's file and no file that is
  not there.

An import edge goes to the most specific module the statement names: `import a.b` and
`from a import b` (b a submodule) go to `a.b`; `from a.b import name` goes to `a.b`. Imports
under `if TYPE_CHECKING:` never run and are not edges.
"""
from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("orl_jax", "pallas_kernels", "orl_sandbox")
MAX_FUNCTION_LINES = 80

# What the models must never reach: decoding, sampling, rollouts, replay, losses, training and
# evaluation (modules by name, packages by prefix; any module named for a sampler or rollout),
# (the plain types every decoder returns, which a family's own sampler builds too, sit in
# models/: `orl_jax.models.decoded`).
ABOVE_MODELS = ("orl_jax.losses", "orl_jax.evaluate")
ABOVE_MODELS_PACKAGES = ("orl_jax.decode", "orl_jax.replay", "orl_jax.train")
ABOVE_MODELS_WORDS = ("sampler", "rollout")

# What the compile path (`orl_jax/aot/`) may import of the training package: the ORL loop's
# step builders and the train state they step.
STEP_BUILDERS = ("orl_jax.train.orl", "orl_jax.train.state")

# The applications: only they, the launchers, the benchmarks and the tests import them.
APPS = "orl_jax.apps"

# The library modules that may hold the command line's ConfigDict: its conversion to the typed
# run config, the build every run calls, and the settings a trained run's weights bring (applied
# to the command line's config before it is built). The applications (`apps/`) sit above it.
CONFIG_DICT_ENTRY = ("orl_jax.config.sections", "orl_jax.config.build",
                     "orl_jax.storage.trained_run")
CONFIG_NAMES = ("config", "cfg")        # what a run config is called where it is read


def module_files(packages=PACKAGES) -> dict[str, str]:
  """{dotted module name: file path} of every .py file under `packages`."""
  out = {}
  for package in packages:
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
      for name in files:
        if not name.endswith(".py"):
          continue
        rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
        if rel[-1] == "__init__":
          rel = rel[:-1]
        out[".".join(rel)] = os.path.join(folder, name)
  return out


def _is_type_checking(node: ast.If) -> bool:
  test = node.test
  return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
      isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
  """Every Import/ImportFrom node of `tree` (function bodies included), less TYPE_CHECKING."""
  stack = [tree]
  while stack:
    node = stack.pop()
    if isinstance(node, ast.If) and _is_type_checking(node):
      stack.extend(node.orelse)
      continue
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      yield node
    stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
  """The absolute module a `from ... import` statement reads from."""
  if not node.level:
    return node.module or ""
  parts = module.split(".")
  base = parts if is_package else parts[:-1]
  base = base[:len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


def _known(name: str, modules) -> str | None:
  """`name` or its nearest enclosing module among `modules` (None: outside the packages)."""
  while name:
    if name in modules:
      return name
    name = name.rpartition(".")[0]
  return None


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
  """{module: the modules of `modules` it imports anywhere in its file}."""
  graph = {}
  for module, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), filename=path)
    is_package = path.endswith("__init__.py")
    edges = set()
    for node in _import_nodes(tree):
      if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      else:
        source = _resolve(module, is_package, node)
        targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source
                   for a in node.names]
      edges |= {t for t in (_known(t, modules) for t in targets) if t and t != module}
    graph[module] = edges
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None (iterative depth-first search)."""
  state = {}                              # module -> 1 on the current path, 2 done
  for start in sorted(graph):
    if state.get(start):
      continue
    path, iters = [start], [iter(sorted(graph[start]))]
    state[start] = 1
    while path:
      nxt = next(iters[-1], None)
      if nxt is None:
        state[path.pop()] = 2
        iters.pop()
      elif state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      elif not state.get(nxt):
        state[nxt] = 1
        path.append(nxt)
        iters.append(iter(sorted(graph.get(nxt, ()))))
  return None


def reach_path(graph, start: str, is_target) -> list[str] | None:
  """The shortest import chain from `start` to a module `is_target` accepts, or None."""
  parents, frontier = {start: None}, [start]
  while frontier:
    nxt = []
    for module in frontier:
      for dep in sorted(graph.get(module, ())):
        if dep in parents:
          continue
        parents[dep] = module
        if is_target(dep):
          chain = [dep]
          while parents[chain[-1]] is not None:
            chain.append(parents[chain[-1]])
          return chain[::-1]
        nxt.append(dep)
    frontier = nxt
  return None


def is_above_models(module: str) -> bool:
  last = module.rpartition(".")[2]
  return (module in ABOVE_MODELS
          or any(module == p or module.startswith(p + ".") for p in ABOVE_MODELS_PACKAGES)
          or (not module.startswith("orl_jax.models")
              and any(w in last for w in ABOVE_MODELS_WORDS)))


def folder_of(module: str) -> str:
  """The node of the folder graph `module` belongs to: its package under `orl_jax/`
  (`orl_jax.decode` for `orl_jax.decode.lockstep`), or itself for a module at the root."""
  parts = module.split(".")
  if parts[0] == "orl_jax" and len(parts) > 2:
    return ".".join(parts[:2])
  if parts[0] == "orl_jax" and len(parts) == 2 and os.path.isdir(os.path.join(ROOT, *parts)):
    return module
  return module if parts[0] == "orl_jax" else parts[0]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
  """The import graph of `orl_jax/`'s folders (`folder_of`), self-edges left out."""
  out: dict[str, set[str]] = {}
  for module, deps in graph.items():
    node = folder_of(module)
    out.setdefault(node, set()).update(folder_of(d) for d in deps if folder_of(d) != node)
  return out


def folder_cycle_edges(graph, cycle: list[str]) -> list[str]:
  """'module -> module' for the imports that make each step of a folder cycle."""
  return [f"{m} -> {d}" for a, b in zip(cycle, cycle[1:]) for m in sorted(graph)
          if folder_of(m) == a for d in sorted(graph[m]) if folder_of(d) == b]


def family_folders() -> list[str]:
  """The family packages: every folder `orl_jax/models/<name>/` with an `__init__.py`."""
  base = os.path.join(ROOT, "orl_jax", "models")
  return sorted(f"orl_jax.models.{name}" for name in os.listdir(base)
                if os.path.isfile(os.path.join(base, name, "__init__.py")))


def family_folder_imports(graph, folders) -> list[str]:
  """'module -> family module' for every import of a family folder from outside models/."""
  in_folder = lambda m: any(m == f or m.startswith(f + ".") for f in folders)
  return [f"{module} -> {dep}" for module in sorted(graph)
          if not module.startswith("orl_jax.models") for dep in sorted(graph[module])
          if in_folder(dep)]


def is_app(module: str) -> bool:
  return module == APPS or module.startswith(APPS + ".")


def library_imports_of_apps(graph) -> list[str]:
  """'library module -> app module' for every import of an application from outside them."""
  return [f"{module} -> {dep}" for module in sorted(graph) if not is_app(module)
          for dep in sorted(graph[module]) if is_app(dep)]


def long_functions(packages, limit: int) -> list[str]:
  """'path:line name (n lines)' for every function longer than `limit` lines."""
  out = []
  for path in module_files(packages).values():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), filename=path)
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > limit:
          out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name} ({n} lines)")
  return out


# ----------------------------------------------------------------------------- the reader itself


def test_the_graph_reader_sees_function_local_relative_and_submodule_imports(tmp_path):
  """The reader must see what the checks below rely on: a function-local import, a relative
  one, `from package import submodule`, and it must find the cycle they make."""
  pkg = tmp_path / "pkg"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("def f():\n  from pkg.sub import b\n  return b\n")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "sub" / "b.py").write_text("from . import c\n")
  (pkg / "sub" / "c.py").write_text(
      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from pkg import d\n"
      "def g():\n  import pkg.a\n")
  (pkg / "d.py").write_text("from pkg.sub.c import g\n")
  global ROOT
  saved, ROOT = ROOT, str(tmp_path)
  try:
    modules = module_files(("pkg",))
  finally:
    ROOT = saved
  graph = import_graph(modules)
  assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.c"}
  assert graph["pkg.sub.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.sub.c"}
  assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
  assert reach_path(graph, "pkg.d", lambda m: m == "pkg.a") == ["pkg.d", "pkg.sub.c", "pkg.a"]
  del graph["pkg.sub.c"]
  assert find_cycle(graph) is None


# ----------------------------------------------------------------------------- the project


def test_the_import_graph_has_no_cycle_counting_function_local_imports():
  cycle = find_cycle(import_graph(module_files()))
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_folders_have_no_import_loop():
  graph = import_graph(module_files(("orl_jax",)))
  cycle = find_cycle(folder_graph(graph))
  assert cycle is None, ("import loop between folders: " + " -> ".join(cycle) + "\n"
                         + "\n".join(folder_cycle_edges(graph, cycle)))


def test_a_loop_between_folders_is_caught():
  """The decoders reading the run config's checks (`orl_jax.config.derive`, which imports the
  decoders' own config) make a loop no module-level cycle shows; it is reported with the
  imports that make it. `models/` stays below `decode/`: a model module importing a decoder
  is a loop too."""
  graph = import_graph(module_files(("orl_jax",)))
  assert find_cycle(folder_graph(graph)) is None
  assert "orl_jax.decode.config" in graph["orl_jax.config.sections"]
  looped = dict(graph, **{"orl_jax.decode.block_sampler":
                          graph["orl_jax.decode.block_sampler"] | {"orl_jax.config.derive"}})
  assert find_cycle(looped) is None          # no module-level cycle
  cycle = find_cycle(folder_graph(looped))
  assert cycle is not None and set(cycle) == {"orl_jax.config", "orl_jax.decode"}
  assert ("orl_jax.decode.block_sampler -> orl_jax.config.derive"
          in folder_cycle_edges(looped, cycle))
  below = dict(graph, **{"orl_jax.models.transformer":
                         graph["orl_jax.models.transformer"] | {"orl_jax.decode.placement"}})
  assert set(find_cycle(folder_graph(below)) or ()) >= {"orl_jax.models", "orl_jax.decode"}


def test_no_model_module_reaches_decoding_rollout_replay_losses_or_training():
  graph = import_graph(module_files())
  bad = [" -> ".join(chain) for module in sorted(graph) if module.startswith("orl_jax.models")
         for chain in [reach_path(graph, module, is_above_models)] if chain]
  assert not bad, "models/ reaches code above it:\n" + "\n".join(bad)


def test_no_module_outside_models_imports_a_family_folder():
  folders = family_folders()
  assert "orl_jax.models.diffusion_gemma" in folders and "orl_jax.models.ours" in folders
  bad = family_folder_imports(import_graph(module_files()), folders)
  assert not bad, "imports of a family folder from outside orl_jax/models/:\n" + "\n".join(bad)


def test_a_family_folder_import_from_outside_models_is_caught():
  """One function-local import of a family's module from the decoders is reported; the
  registry (`orl_jax.models.families`, inside models/) importing every folder is not."""
  graph = import_graph(module_files())
  folders = family_folders()
  assert "orl_jax.models.diffusion_gemma" in graph["orl_jax.models.families"]
  assert not family_folder_imports(graph, folders)
  graph["orl_jax.decode.build"] |= {"orl_jax.models.diffusion_gemma.trajectories"}
  assert family_folder_imports(graph, folders) == [
      "orl_jax.decode.build -> orl_jax.models.diffusion_gemma.trajectories"]


def test_no_function_is_longer_than_80_lines():
  long = long_functions(("orl_jax", "pallas_kernels"), MAX_FUNCTION_LINES)
  assert not long, "functions over 80 lines:\n" + "\n".join(long)


def test_a_family_folder_importing_a_decoder_is_caught():
  """The rule above covers the family folders (`orl_jax/models/<family>/`, their samplers and
  rollout glue included): one import of the decoders from a family module is reported, while
  the shared output types (`orl_jax.models.decoded`) they build stay allowed."""
  graph = import_graph(module_files())
  sampler = "orl_jax.models.diffusion_gemma.sampler"
  types = "orl_jax.models.decoded"
  assert types in graph[sampler] and not is_above_models(types)
  graph[sampler] = graph[sampler] | {"orl_jax.decode.lockstep"}
  rollout = "orl_jax.models.diffusion_gemma.trajectories"
  assert reach_path(graph, sampler, is_above_models) == [sampler, "orl_jax.decode.lockstep"]
  assert reach_path(graph, rollout, is_above_models) == [rollout, sampler,
                                                         "orl_jax.decode.lockstep"]


def training_imports(graph, module_prefix: str) -> set[str]:
  """The modules of `orl_jax/train/` that modules under `module_prefix` import directly."""
  return {d for m in graph if m.startswith(module_prefix) for d in graph[m]
          if d.startswith("orl_jax.train")}


def test_the_dry_run_and_the_compile_path_stay_off_the_training_package():
  graph = import_graph(module_files())
  chain = reach_path(graph, "orl_jax.apps.dry_run", lambda m: m.startswith("orl_jax.train"))
  assert chain is None, "the dry run reaches training: " + " -> ".join(chain or [])
  extra = training_imports(graph, "orl_jax.aot") - set(STEP_BUILDERS)
  assert not extra, f"orl_jax/aot/ imports more of orl_jax/train/ than its step builders: {extra}"


def test_a_dry_run_reaching_training_is_caught():
  graph = import_graph(module_files())
  graph["orl_jax.setup.resolve"] = graph["orl_jax.setup.resolve"] | {"orl_jax.train.run"}
  assert reach_path(graph, "orl_jax.apps.dry_run",
                    lambda m: m.startswith("orl_jax.train"))[-1] == "orl_jax.train.run"
  graph["orl_jax.aot.programs"] = graph["orl_jax.aot.programs"] | {"orl_jax.train.run"}
  assert training_imports(graph, "orl_jax.aot") - set(STEP_BUILDERS) == {"orl_jax.train.run"}


def test_nothing_in_the_library_imports_the_applications():
  bad = library_imports_of_apps(import_graph(module_files()))
  assert not bad, "the library imports orl_jax/apps/:\n" + "\n".join(bad)


def test_a_library_module_importing_an_application_is_caught():
  """The rule above sees a library module importing an app (here the compile command's programs
  importing the dry run, as they once did), while the apps may import each other."""
  graph = import_graph(module_files())
  assert "orl_jax.apps.summary" in graph["orl_jax.apps.demo"]
  graph["orl_jax.aot.programs"] = graph["orl_jax.aot.programs"] | {"orl_jax.apps.dry_run"}
  assert library_imports_of_apps(graph) == ["orl_jax.aot.programs -> orl_jax.apps.dry_run"]


def _config_root(node: ast.AST) -> str | None:
  """The name an attribute chain such as `config.model.moe` starts from."""
  while isinstance(node, ast.Attribute):
    node = node.value
  return node.id if isinstance(node, ast.Name) else None


def config_dict_reads(modules: dict[str, str]) -> list[str]:
  """'module:line what' for each ConfigDict use outside the entry and the applications: an
  import of ml_collections, `<config>.unlocked()`, or `<config>[.section].get(name, default)`
  (a run config read with a default of its own)."""
  out = []
  for module, path in sorted(modules.items()):
    if module in CONFIG_DICT_ENTRY or module.startswith(APPS + ".") or not module.startswith(
        "orl_jax"):
      continue
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), filename=path)
    for node in _import_nodes(tree):
      names = ([a.name for a in node.names] if isinstance(node, ast.Import)
               else [node.module or ""])
      if any(n.split(".")[0] == "ml_collections" for n in names):
        out.append(f"{module}:{node.lineno} imports ml_collections")
    for node in ast.walk(tree):
      if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and _config_root(node.func.value) in CONFIG_NAMES):
        continue
      if node.func.attr == "unlocked":
        out.append(f"{module}:{node.lineno} unlocks a config")
      elif node.func.attr == "get" and len(node.args) + len(node.keywords) >= 2:
        out.append(f"{module}:{node.lineno} reads a config with a default of its own")
  return out


def test_no_config_dict_below_the_run_config_entry():
  bad = config_dict_reads(module_files())
  assert not bad, ("ConfigDict uses below the run config's entry (read the built RunConfig, "
                   "orl_jax/config/build.py):\n" + "\n".join(bad))


def test_a_config_dict_read_below_the_entry_is_caught(tmp_path):
  """The rule above sees each of the three uses, in a module of the library, and not in the
  entry or an application."""
  src = ("import ml_collections\n"
         "def f(config):\n"
         "  with config.unlocked():\n"
         "    config.decode.rule = 'x'\n"
         "  return config.loss.get('vocab_chunk', 0), config.task.tiny.get('n_eval')\n")
  path = tmp_path / "m.py"
  path.write_text(src)
  files = {"orl_jax.somewhere": str(path), "orl_jax.config.build": str(path),
           "orl_jax.apps.demo": str(path)}
  assert config_dict_reads(files) == [
      "orl_jax.somewhere:1 imports ml_collections", "orl_jax.somewhere:3 unlocks a config",
      "orl_jax.somewhere:5 reads a config with a default of its own"]


def _code_map_problems(doc: str, files: list[str], repo_names: set[str]) -> list[str]:
  """What docs/code.md gets wrong about the tree: a library module (`files`, paths) whose file
  name it never mentions, or a `*.py` name it mentions that no file of the repository has
  (`repo_names`: every file name)."""
  missing = [f for f in files if os.path.basename(f) not in doc]
  stale = sorted({name for name in re.findall(r"\b(\w+\.py)\b", doc)} - repo_names)
  return ([f"{f} is not in docs/code.md" for f in missing]
          + [f"docs/code.md names {n}, which no file is" for n in stale])


def _library_files() -> list[str]:
  return sorted(os.path.relpath(p, ROOT) for p in module_files().values()
                if not p.endswith("__init__.py"))


def _repo_file_names() -> set[str]:
  names: set[str] = set()
  for _, dirs, files in os.walk(ROOT):
    dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("work_dirs", "build")]
    names.update(files)
  return names


def test_the_code_map_lists_every_module_and_no_missing_one():
  with open(os.path.join(ROOT, "docs", "code.md")) as f:
    doc = f.read()
  assert _code_map_problems(doc, _library_files(), _repo_file_names()) == []


def test_a_module_missing_from_the_code_map_is_caught():
  doc = "  models/transformer.py   the model\n  gone.py   removed\n"
  problems = _code_map_problems(doc, ["orl_jax/models/transformer.py", "orl_jax/new.py"],
                                {"transformer.py"})
  assert problems == ["orl_jax/new.py is not in docs/code.md",
                      "docs/code.md names gone.py, which no file is"]
