"""sao.engines.xla_cpu_threads: XLA:CPU's pools sized to n threads, every thread free to run on any CPU afterwards."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sao.engines import xla_cpu_threads

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a fresh process (the pools are sized once, when JAX creates its CPU backend).
_PROBE = r"""
import collections, json, os, sys
from sao.engines import xla_cpu_threads
n = int(sys.argv[1])
limited = xla_cpu_threads.limit(n)
import jax, jax.numpy as jnp
x = jnp.arange(512.0).reshape(16, 32)
total = float(jax.jit(lambda a: (a @ a.T).sum())(x))
again = xla_cpu_threads.limit(n)  # too late now: the backends exist
tasks = os.listdir("/proc/self/task")
names = collections.Counter(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks)
masks = {len(os.sched_getaffinity(int(t))) for t in tasks}
print(json.dumps({"limited": limited, "again": again, "eigen": names["tf_XLAEigen"], "masks": sorted(masks),
                  "process_cpus": len(os.sched_getaffinity(0)), "total": total}))
"""

CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def _probe(n: int) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p),
             JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one CPU device, as the trainer and engine processes have
  out = subprocess.run([sys.executable, "-c", _PROBE, str(n)], env=env, capture_output=True, text=True,
                       timeout=120, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.isdir("/proc/self/task") or CPUS < 2, reason="needs Linux and at least 2 CPUs")
def test_one_thread_pools_and_every_thread_keeps_every_cpu():
  default, one = _probe(0), _probe(1)
  assert not default["limited"] and one["limited"]
  assert default["eigen"] > 1  # XLA's own choice: a thread per CPU the process may run on
  assert one["eigen"] == 1
  # Every thread (XLA's included) may run on every CPU again; the result is the same.
  assert one["masks"] == [CPUS] and one["process_cpus"] == CPUS
  assert one["total"] == default["total"]
  assert not one["again"]  # a second call, after the backends exist, changes nothing (and says so in the log)


def test_nothing_to_do_for_zero_or_every_cpu():
  assert not xla_cpu_threads.limit(0)
  assert not xla_cpu_threads.limit(-1)
  assert not xla_cpu_threads.limit(CPUS)


def test_after_the_backends_exist_it_warns_and_changes_nothing(caplog):
  import jax  # pylint: disable=import-outside-toplevel
  jax.devices()  # this test process computes already
  if CPUS < 2:
    pytest.skip("needs at least 2 CPUs")
  with caplog.at_level("WARNING", logger=xla_cpu_threads.__name__):
    assert not xla_cpu_threads.limit(1)
  assert "has no effect" in caplog.text
  assert len(os.sched_getaffinity(0)) == CPUS
