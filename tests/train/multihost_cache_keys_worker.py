"""Worker of tests/train/test_cpu_cache_keys.py (run by `tests.multihost.run_processes`, not collected by pytest).

Joins the job (which makes CPU cache keys the job's: `sao.engines.compilation_cache.share_cpu_keys_across_processes`),
compiles and runs one program with cross-process collectives under the persistent cache the harness set, and prints
one JSON line: the program devices' hash by JAX's own function and by the job's, whether the persistent cache
served the program, and the gathered result."""
from __future__ import annotations

import hashlib
import json

from tests import multihost


def main() -> None:
  process_id = multihost.initialize_from_env()
  import jax  # pylint: disable=import-outside-toplevel  (after the harness's environment)
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax._src import cache_key, monitoring  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel

  hits = []
  monitoring.register_event_listener(
      lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
  mesh = jax.make_mesh((jax.device_count(),), ("d",))
  hashes = {}
  for name, fn in (("jax", cache_key._hash_accelerator_config.jax_hash),  # pylint: disable=protected-access
                   ("job", cache_key._hash_accelerator_config)):  # pylint: disable=protected-access
    h = hashlib.sha256()
    fn(h, mesh.devices)
    hashes[name] = h.hexdigest()
  n = 4 * jax.device_count()
  x = jax.make_array_from_callback((n,), NamedSharding(mesh, PartitionSpec("d")),
                                   lambda index: np.arange(n, dtype=np.float32)[index])
  y = jax.jit(lambda a: a * a.sum() + a.max())(x)  # an all-reduce of each across the processes
  result = np.asarray(multihost_utils.process_allgather(y, tiled=True))
  print(json.dumps({"process": process_id, **hashes, "program_hits": len(hits), "result": result.tolist()}),
        flush=True)


if __name__ == "__main__":
  main()
