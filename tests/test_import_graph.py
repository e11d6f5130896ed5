"""The import graph of `sao` (every import statement, also those inside functions): no cycles between modules, and
packages import only downward (`sao.train` and `sao.rollout` never import each other; they meet through
`sao.transport` and `sao.engines`; the compile analysis `sao.aot` sits above the learner it compiles, and nothing in
`sao` imports it)."""
from __future__ import annotations

import ast
import collections
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# package → the packages it may import besides itself (the layering of docs/ and the README's layout).
ALLOWED = {
    "sao.run_config": set(),  # reading experiment configs (dotted keys, overrides): below everything that runs one
    "sao.env_choice": set(),  # a setting chosen by an environment variable: below everything that reads one
    "sao.kernels": {"sao.env_choice"},  # native kernels and their build: below the array math that calls them
    "sao.core": {"sao.kernels"},
    "sao.models": {"sao.core"},
    "sao.transport": {"sao.core", "sao.models"},
    "sao.engines": {"sao.core", "sao.models", "sao.transport", "sao.env_choice"},
    "sao.analysis": {"sao.core", "sao.models", "sao.transport"},
    "sao.simulation": {"sao.transport"},  # the fleet simulator drives the transport's own dispenser and buffer
    "sao.train": {"sao.core", "sao.models", "sao.transport", "sao.engines", "sao.analysis",
                  "sao.run_config"},
    "sao.rollout": {"sao.core", "sao.models", "sao.transport", "sao.engines", "sao.analysis", "sao.run_config"},
    # ahead-of-time compile analysis: compiles the learner's own programs (`sao.train`) and prices their HLO
    "sao.aot": {"sao.core", "sao.models", "sao.train", "sao.run_config"},
}


def _modules() -> dict[str, str]:
  modules = {}
  for directory, _, files in os.walk(os.path.join(ROOT, "sao")):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(directory, f)
        name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        modules[name.removesuffix(".__init__")] = path
  return modules


def _edges(modules: dict[str, str]) -> dict[str, set[str]]:
  """module → the `sao` modules it imports."""
  edges = collections.defaultdict(set)
  for module, path in modules.items():
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative import: resolve against this module's package
          parts = package.split(".")
          base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
        # `from pkg import mod` depends on the module `pkg.mod`; `from pkg import name` on `pkg`.
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
      else:
        continue
      edges[module].update(t for t in targets if t in modules and t != module)
  return edges


def _package(module: str) -> str:
  return ".".join(module.split(".")[:2])


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(edges.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return out


def test_the_graph_is_read():
  edges = _edges(_modules())
  assert "sao.train.targets" in edges["sao.train.learner"]
  assert "sao.core.advantages" in edges["sao.train.targets"]
  assert sum(len(v) for v in edges.values()) > 100


def test_no_import_cycles():
  assert _cycles(_edges(_modules())) == []


def test_cycle_detection_finds_a_cycle():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_only_downward():
  wrong = sorted(f"{a} imports {b}" for a, targets in _edges(_modules()).items() for b in targets
                 if _package(a) in ALLOWED and _package(b) != _package(a) and _package(b) not in ALLOWED[_package(a)])
  assert wrong == []


def test_nothing_in_sao_imports_the_compile_analysis():
  """The learner runs without the HLO reader, the cost model and the chip table: only the compile commands
  (experiments/compile_tpu.py and the bench scripts) and the tests import `sao.aot`."""
  edges = _edges(_modules())
  assert "sao.aot.driver" in edges["sao.aot.report"]  # the package's own modules are read
  assert sorted(a for a, targets in edges.items() for b in targets
                if _package(b) == "sao.aot" and _package(a) != "sao.aot") == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_every_package_is_known(package):
  path = os.path.join(ROOT, *package.split("."))
  assert os.path.isdir(path) or os.path.isfile(path + ".py")


def test_loading_an_experiment_config_does_not_import_jax():
  """Sweeps, launchers and the worker's flags load configs; JAX (and its device setup) comes only with training."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("import sys, experiments.configs.sao_openswe as m, experiments.configs.gspo_openswe as g; "
          "m.get_config('toy'); m.get_config('full'); g.get_config('toy'); "
          "print(sorted(k for k in ('jax', 'flax', 'optax') if k in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONPATH": ROOT})
  assert out.stdout.strip() == "[]", out.stdout + out.stderr
