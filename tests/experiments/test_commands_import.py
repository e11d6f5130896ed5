"""Every command under experiments/ and launch/ (and the engine server, `sao.engines.serve`) imports beside every other
in one process: a command defines its absl flags in `define_flags()` when it runs, not on import (several share names:
--config, --out, --batch, --concurrency, --workdir, --port, --seed), so pytest can collect the tests of all of them and
a module can import another's helpers. Every experiments/ script (entry points at the top, benchmarks and profilers in
experiments/bench/) puts the repository first on `sys.path`, so `python experiments/<script>.py` and
`python experiments/bench/<script>.py` run this checkout's code without `pip install -e .`."""
import ast
import glob
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Imports every module in one process, then says which of those that have define_flags() defined flags anyway.
_IMPORT_ALL = """
import importlib, sys
from absl import flags
names = sys.argv[1:]
modules = [importlib.import_module(name) for name in names]
by_module = flags.FLAGS.flags_by_module_dict()
eager = [m.__name__ for m in modules if m.__name__ in by_module]
assert not eager, f"modules that define flags on import (define them in define_flags()): {eager}"
print(f"imported {len(modules)} modules")
"""


def _command_modules() -> list[str]:
  paths = [p for pattern in ("experiments/*.py", "experiments/bench/*.py", "experiments/paper/*.py", "launch/*.py")
           for p in sorted(glob.glob(os.path.join(REPO, pattern)))]
  return [os.path.relpath(p, REPO)[:-len(".py")].replace(os.sep, ".") for p in paths
          if not p.endswith("__init__.py")] + ["sao.engines.serve"]  # a command too (`python -m`), run by launchers


def test_every_command_module_imports_in_one_process():
  modules = _command_modules()
  assert {"experiments.train", "experiments.evaluate", "experiments.compile_tpu", "experiments.bench.bench_train",
          "experiments.bench.profile_train", "experiments.paper.trim", "launch.local",
          "sao.engines.serve"} <= set(modules)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _IMPORT_ALL, *modules], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"imported {len(modules)} modules" in result.stdout


def _repo_root_of_file(depth: int) -> str:
  """The expression for the repository of a script `depth` folders below it (experiments/x.py: 1,
  experiments/bench/x.py: 2): `os.path.dirname` once per folder, and once more for the file."""
  return "os.path.dirname(" * (depth + 1) + "os.path.abspath(__file__)" + ")" * (depth + 1)


def _puts_repo_first_on_sys_path(node: ast.stmt, depth: int) -> bool:
  """Whether `node` is `sys.path.insert(0, <the repository of a script `depth` folders below it>)`."""
  return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
          and ast.unparse(node.value.func) == "sys.path.insert" and len(node.value.args) == 2
          and ast.unparse(node.value.args[0]) == "0" and ast.unparse(node.value.args[1]) == _repo_root_of_file(depth))


def _imports_the_repo(node: ast.stmt) -> bool:
  names = ([a.name for a in node.names] if isinstance(node, ast.Import)
           else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
  return any(n.split(".")[0] in ("sao", "experiments", "launch") for n in names)


def test_every_experiments_script_puts_the_repository_on_sys_path():
  """`python experiments/<x>.py` puts the script's folder (not the repository) on sys.path: without the line, `sao`
  comes from wherever it is installed (another checkout) or not at all. The line must come before the first module-level
  import of the repository's packages (later ones, inside functions, see it too)."""
  scripts = [p for pattern in ("*.py", os.path.join("bench", "*.py"))
             for p in sorted(glob.glob(os.path.join(REPO, "experiments", pattern))) if not p.endswith("__init__.py")]
  assert len([p for p in scripts if os.sep + "bench" + os.sep in p]) >= 15 and len(scripts) >= 20
  missing = []
  for path in scripts:
    with open(path) as f:
      body = ast.parse(f.read()).body
    depth = len(os.path.relpath(path, REPO).split(os.sep)) - 1
    line = next((i for i, node in enumerate(body) if _puts_repo_first_on_sys_path(node, depth)), None)
    first_import = next((i for i, node in enumerate(body) if _imports_the_repo(node)), len(body))
    if line is None or line > first_import:
      missing.append(os.path.relpath(path, REPO))
  assert not missing, f"scripts without sys.path.insert(0, <repo root>) before importing the repository: {missing}"
