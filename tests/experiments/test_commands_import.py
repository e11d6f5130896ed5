"""Every command under experiments/ and launch/ (and the engine server, `sao.engines.serve`) imports beside every other
in one process: a command defines its absl flags in `define_flags()` when it runs, not on import (several share names:
--config, --out, --batch, --concurrency, --workdir, --port, --seed), so pytest can collect the tests of all of them and
a module can import another's helpers. Every experiments/ script puts the repository first on `sys.path`, so
`python experiments/<script>.py` runs this checkout's code without `pip install -e .`."""
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
  paths = [p for pattern in ("experiments/*.py", "experiments/paper/*.py", "launch/*.py")
           for p in sorted(glob.glob(os.path.join(REPO, pattern)))]
  return [os.path.relpath(p, REPO)[:-len(".py")].replace(os.sep, ".") for p in paths
          if not p.endswith("__init__.py")] + ["sao.engines.serve"]  # a command too (`python -m`), run by launchers


def test_every_command_module_imports_in_one_process():
  modules = _command_modules()
  assert {"experiments.train", "experiments.evaluate", "experiments.bench_train", "experiments.profile_train",
          "experiments.paper.trim", "launch.local", "sao.engines.serve"} <= set(modules)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _IMPORT_ALL, *modules], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"imported {len(modules)} modules" in result.stdout


_REPO_ROOT_OF_FILE = "os.path.dirname(os.path.dirname(os.path.abspath(__file__)))"  # experiments/x.py -> the repo


def _puts_repo_first_on_sys_path(node: ast.stmt) -> bool:
  """Whether `node` is `sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))`."""
  return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
          and ast.unparse(node.value.func) == "sys.path.insert" and len(node.value.args) == 2
          and ast.unparse(node.value.args[0]) == "0" and ast.unparse(node.value.args[1]) == _REPO_ROOT_OF_FILE)


def _imports_the_repo(node: ast.stmt) -> bool:
  names = ([a.name for a in node.names] if isinstance(node, ast.Import)
           else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
  return any(n.split(".")[0] in ("sao", "experiments", "launch") for n in names)


def test_every_experiments_script_puts_the_repository_on_sys_path():
  """`python experiments/<x>.py` puts experiments/ (not the repository) on sys.path: without the line, `sao` comes
  from wherever it is installed (another checkout) or not at all. The line must come before the first module-level
  import of the repository's packages (later ones, inside functions, see it too)."""
  scripts = [p for p in sorted(glob.glob(os.path.join(REPO, "experiments", "*.py"))) if not p.endswith("__init__.py")]
  assert len(scripts) >= 15
  missing = []
  for path in scripts:
    with open(path) as f:
      body = ast.parse(f.read()).body
    line = next((i for i, node in enumerate(body) if _puts_repo_first_on_sys_path(node)), None)
    first_import = next((i for i, node in enumerate(body) if _imports_the_repo(node)), len(body))
    if line is None or line > first_import:
      missing.append(os.path.basename(path))
  assert not missing, f"scripts without sys.path.insert(0, <repo root>) before importing the repository: {missing}"
