"""tests/train: a persistent XLA compilation cache shared by one pytest run's learners and their subprocesses.

Every `Learner` jits fresh closures, so identical steps would otherwise recompile per test; the on-disk cache is
keyed by the compiled HLO and turns those into cache hits.
"""
import os
import tempfile

import jax

_CACHE_DIR = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="sao_train_xla_cache_"))
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
