"""Runs the local JAX engine (SGLang's HTTP API over `sao.models.sampling.Sampler`, with dynamic batching).

  python -m sao.engines.serve --model_path=/path/to/hf_dir --port=30000 [--host=127.0.0.1]

Binds 127.0.0.1 unless told otherwise; a non-loopback `--host` needs a token (`--api_key`, or the environment
variable `SAO_ENGINE_API_KEY`, which keeps it off the command line), which every request but `/health` must then
send as `Authorization: Bearer <token>` (`SGLangEngine(url, api_key=...)` does; see `sao.engines.auth`).
`--port=0` takes a free port. When it is serving it prints one line,
`SAO_ENGINE_READY url=http://HOST:PORT`, which `local_server.start_local_engine` waits for.
"""
from __future__ import annotations

import asyncio
import logging
import signal

from sao.engines import host_platform

if __name__ == "__main__":
  host_platform.pin_cpu_without_accelerator()  # before JAX is imported (below): no libtpu probing on a CPU host

from absl import app, flags  # noqa: E402
from aiohttp import web

from sao.engines import auth, host_malloc, lifetime, local_server
from sao.engines.http_app import build_app
from sao.engines.local_engine import EngineConfig, LocalEngine

_MODEL_PATH = flags.DEFINE_string("model_path", None, "HF checkpoint directory (config.json + safetensors; a "
                                  "tokenizer there supplies the eos stop ids and response text).", required=True)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Interface to bind.")
_PORT = flags.DEFINE_integer("port", 30000, "Port to bind (0: any free port).")
_API_KEY = flags.DEFINE_string("api_key", None, "Shared-secret token clients must send as 'Authorization: Bearer "
                                f"<token>' (default: ${auth.API_KEY_ENV}); required for a non-loopback --host.")
_WEIGHT_VERSION = flags.DEFINE_string("weight_version", "0", "Initial weight version reported in responses.")
_BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", 5.0, "Dynamic batching: how long to gather rows.")
_MAX_BATCH_SIZE = flags.DEFINE_integer("max_batch_size", 128, "Rows per batch (1 disables batching).")
_PROMPT_BUCKETS = flags.DEFINE_list("prompt_buckets", None, "Prompt-length buckets (default: the Sampler's).")
_BATCH_BUCKETS = flags.DEFINE_list("batch_buckets", None, "Batch-size buckets (default: the Sampler's).")
_NEW_TOKEN_BUCKETS = flags.DEFINE_list("new_token_buckets", None, "max_new_tokens buckets (default: Sampler's).")
_SUFFIX_BUCKETS = flags.DEFINE_list("suffix_buckets", None, "Buckets of the prompt part the prefix cache does not "
                                    "cover (default: the prompt buckets).")
_PREFIX_CACHE_BYTES = flags.DEFINE_integer("prefix_cache_bytes", None, "Prefix cache across turns: its bound in "
                                           "bytes (0 turns it off; default: EngineConfig's).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed base.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Param and compute dtype.")
_COMPILATION_CACHE_DIR = flags.DEFINE_string("compilation_cache_dir", None,
                                             "JAX persistent compilation cache (speeds up restarts).")


def _buckets(values: list[str] | None, default: tuple[int, ...]) -> tuple[int, ...]:
  return default if not values else tuple(sorted(int(v) for v in values))


async def _serve(engine_config: EngineConfig, api_key: str | None) -> None:
  engine = LocalEngine(_MODEL_PATH.value, engine_config, weight_version=_WEIGHT_VERSION.value)
  runner = web.AppRunner(build_app(engine, api_key=api_key), access_log=None)
  await runner.setup()
  site = web.TCPSite(runner, _HOST.value, _PORT.value)
  await site.start()
  host, port = runner.addresses[0][:2]
  print(f"{local_server.READY_PREFIX}http://{host}:{port}", flush=True)
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGINT, signal.SIGTERM):
    loop.add_signal_handler(sig, stop.set)
  await stop.wait()
  await runner.cleanup()


def main(argv: list[str]) -> None:
  del argv
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  lifetime.exit_with_parent()  # started by a launcher: end with it
  host_malloc.keep_freed_memory()  # before JAX's thread pools start: the sampler's buffers are reused
  api_key = auth.token_from_env(_API_KEY.value)
  auth.require_token_for_bind(_HOST.value, api_key, "sao.engines.serve")  # before the slow model load
  if _COMPILATION_CACHE_DIR.value:
    import jax
    jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE_DIR.value)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  defaults = EngineConfig()
  config = EngineConfig(
      batch_window_ms=_BATCH_WINDOW_MS.value, max_batch_size=_MAX_BATCH_SIZE.value,
      prompt_buckets=_buckets(_PROMPT_BUCKETS.value, defaults.prompt_buckets),
      batch_buckets=_buckets(_BATCH_BUCKETS.value, defaults.batch_buckets),
      new_token_buckets=_buckets(_NEW_TOKEN_BUCKETS.value, defaults.new_token_buckets),
      suffix_buckets=_buckets(_SUFFIX_BUCKETS.value, defaults.suffix_buckets),
      prefix_cache_bytes=(defaults.prefix_cache_bytes if _PREFIX_CACHE_BYTES.value is None
                          else _PREFIX_CACHE_BYTES.value),
      seed=_SEED.value, dtype=_DTYPE.value)
  asyncio.run(_serve(config, api_key))


if __name__ == "__main__":
  app.run(main)
