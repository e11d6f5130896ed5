"""Every command under experiments/ and launch/ imports beside every other in one process: a command defines its absl
flags in `define_flags()` when it runs, not on import (several share names: --config, --out, --batch, --concurrency,
--workdir), so pytest can collect the tests of all of them and a module can import another's helpers."""
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
          if not p.endswith("__init__.py")]


def test_every_command_module_imports_in_one_process():
  modules = _command_modules()
  assert {"experiments.train", "experiments.evaluate", "experiments.bench_train", "experiments.profile_train",
          "experiments.paper.trim", "launch.local"} <= set(modules)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", _IMPORT_ALL, *modules], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"imported {len(modules)} modules" in result.stdout
