"""Where runs' compilation caches go (`sao.engines.compilation_cache`); tests/launch/test_run.py shows a second run
loading the first one's executables."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sao.engines import compilation_cache


def test_default_dir_follows_sao_cache_dir_then_xdg_then_home(monkeypatch):
  monkeypatch.setenv("SAO_CACHE_DIR", "/s")
  monkeypatch.setenv("XDG_CACHE_HOME", "/x")
  assert compilation_cache.default_dir() == "/s/xla"
  monkeypatch.delenv("SAO_CACHE_DIR")
  assert compilation_cache.default_dir() == "/x/sao/xla"
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", "/home/u")
  assert compilation_cache.default_dir() == "/home/u/.cache/sao/xla"


def test_run_dir_expands_the_configured_directory_or_stays_in_the_workdir(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", "/home/u")
  monkeypatch.setenv("SCRATCH", "/scratch/u")
  assert compilation_cache.run_dir("~/c", "/w") == "/home/u/c"
  assert compilation_cache.run_dir("$SCRATCH/c", "/w") == "/scratch/u/c"
  assert compilation_cache.run_dir("", "/w") == "/w/jax_cache"
  monkeypatch.chdir(tmp_path)
  assert compilation_cache.run_dir("", "w") == str(tmp_path / "w" / "jax_cache")
  assert compilation_cache.trainer_dir("/c") == "/c/trainer"
  assert compilation_cache.engines_dir("/c") == "/c/engines"


@pytest.mark.parametrize("max_gb", [0, -1, float("nan")])
def test_the_bound_must_be_positive(max_gb):
  # JAX reads 0 as "cache nothing" and -1 as "unbounded, without the file lock".
  with pytest.raises(ValueError, match="compilation_cache_max_gb"):
    compilation_cache.max_bytes(max_gb)


_ENABLE = """
import sys
import jax, jax.numpy as jnp
from sao.engines import compilation_cache
compilation_cache.enable(sys.argv[1], 1e-3, min_compile_time_s=0.0)
jax.jit(lambda x: jnp.cos(x) * 2.0)(jnp.arange(5.0)).block_until_ready()
print(jax.config.jax_compilation_cache_max_size)
"""


def test_enable_bounds_the_directory_and_locks_it(tmp_path):
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  path = tmp_path / "c"
  out = subprocess.run([sys.executable, "-c", _ENABLE, str(path)], env=dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=repo),
                       cwd=repo, capture_output=True, text=True, timeout=120, check=True).stdout.split()
  assert int(out[-1]) == int(1e-3 * (1 << 30))
  names = os.listdir(path)
  assert any(n.endswith("-cache") for n in names) and ".lockfile" in names  # JAX's LRU cache, locked



_XLA_CACHES = """
import sys
import jax
from sao.engines import compilation_cache
compilation_cache.enable(sys.argv[1], 1e-3, min_compile_time_s=0.0, gpu_kernel_cache=sys.argv[2] == "True")
print(jax.config.jax_persistent_cache_enable_xla_caches)
"""


@pytest.mark.parametrize("kernels", [True, False])
def test_gpu_kernel_cache_only_when_asked(tmp_path, kernels):
  """XLA:GPU's autotuning cache always goes beside the executables; its kernel cache (one file every writer appends
  to) only for a process that has the directory to itself."""
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
  out = subprocess.run([sys.executable, "-c", _XLA_CACHES, str(tmp_path / "c"), str(kernels)],
                       env=dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=repo), cwd=repo, capture_output=True, text=True,
                       timeout=120, check=True).stdout.split()
  assert out[-1] == ("all" if kernels else "xla_gpu_per_fusion_autotune_cache_dir")
