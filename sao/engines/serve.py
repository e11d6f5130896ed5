"""Runs the local JAX engine (SGLang's HTTP API over `sao.models.sampling.Sampler`, with dynamic batching).

  python -m sao.engines.serve --model_path=/path/to/hf_dir --port=30000 [--host=127.0.0.1]

Binds 127.0.0.1 unless told otherwise; a non-loopback `--host` needs a token (`--api_key`, or the environment
variable `SAO_ENGINE_API_KEY`, which keeps it off the command line), which every request but `/health` must then
send as `Authorization: Bearer <token>` (`SGLangEngine(url, api_key=...)` does; see `sao.engines.auth`).
`--port=0` takes a free port. When it is serving it prints one line,
`SAO_ENGINE_READY url=http://HOST:PORT`, which `local_server.start_local_engine` waits for. `--max_queued_rows`
bounds the rows waiting for a batch; beyond it `/generate` answers 503 (see `sao.engines.local_engine`).
`--enable-return-routed-experts` (SGLang's spelling; `--enable_return_routed_experts` too; an MoE model) lets a
request ask for `return_routed_experts`: `meta_info["routed_experts"]`, base64 of int32 [tokens − 1, layers, top_k].
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys

from sao.engines import host_platform

if __name__ == "__main__":
  host_platform.pin_cpu_without_accelerator()  # before JAX is imported (below): no libtpu probing on a CPU host

from absl import app, flags  # noqa: E402
from aiohttp import web

from sao.engines import auth, compilation_cache, host_malloc, lifetime, local_server, xla_cpu_threads
from sao.engines.http_app import build_app
from sao.engines.local_engine import EngineConfig, LocalEngine


def define_flags() -> None:
  """The server's flags, defined when it runs (not on import: a process that imports this module beside the
  experiments/ commands must not get a second --config/--port/--seed; tests/experiments/test_commands_import.py)."""
  flags.DEFINE_string("model_path", None, "HF checkpoint directory (config.json + safetensors; a tokenizer there "
                      "supplies the eos stop ids and response text).", required=True)
  flags.DEFINE_string("host", "127.0.0.1", "Interface to bind.")
  flags.DEFINE_integer("port", 30000, "Port to bind (0: any free port).")
  flags.DEFINE_string("api_key", None, "Shared-secret token clients must send as 'Authorization: Bearer <token>' "
                      f"(default: ${auth.API_KEY_ENV}); required for a non-loopback --host.")
  flags.DEFINE_string("weight_version", "0", "Initial weight version reported in responses.")
  flags.DEFINE_float("batch_window_ms", 5.0, "Dynamic batching: how long to gather rows.")
  flags.DEFINE_integer("max_batch_size", 128, "Rows per batch (1 disables batching).")
  flags.DEFINE_integer("max_queued_rows", EngineConfig.max_queued_rows, "Rows that may wait for a batch; a request "
                       "beyond it gets HTTP 503 (clients back off and retry).")
  flags.DEFINE_list("prompt_buckets", None, "Prompt-length buckets (default: the Sampler's).")
  flags.DEFINE_list("batch_buckets", None, "Batch-size buckets (default: the Sampler's).")
  flags.DEFINE_list("new_token_buckets", None, "max_new_tokens buckets (default: Sampler's).")
  flags.DEFINE_list("suffix_buckets", None, "Buckets of the prompt part the prefix cache does not cover (default: "
                    "the prompt buckets).")
  flags.DEFINE_integer("prefix_cache_bytes", None, "Prefix cache across turns: its bound in bytes (0 turns it off; "
                       "default: EngineConfig's).")
  flags.DEFINE_integer("seed", 0, "Sampling seed base.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Param and compute dtype.")
  flags.DEFINE_string("compilation_cache_dir", None, "JAX persistent compilation cache (speeds up restarts and "
                      "later runs; sao.engines.compilation_cache).")
  flags.DEFINE_float("compilation_cache_max_gb", 4.0, "Bound of the compilation cache directory in GiB (least "
                     "recently used entries evicted).")
  flags.DEFINE_bool("enable_return_routed_experts", False, "SGLang's --enable-return-routed-experts (that spelling "
                    "works too): requests may ask for return_routed_experts (an MoE model only).")
  flags.DEFINE_integer("xla_cpu_threads", 0, "Threads of XLA:CPU's pools in this process (0: one per CPU it may "
                       "run on); fewer when other busy processes share its cores (sao.engines.xla_cpu_threads).")


def _buckets(values: list[str] | None, default: tuple[int, ...]) -> tuple[int, ...]:
  return default if not values else tuple(sorted(int(v) for v in values))


async def _serve(model_path: str, engine_config: EngineConfig, weight_version: str, host: str, port: int,
                 api_key: str | None) -> None:
  engine = LocalEngine(model_path, engine_config, weight_version=weight_version)
  runner = web.AppRunner(build_app(engine, api_key=api_key), access_log=None)
  await runner.setup()
  site = web.TCPSite(runner, host, port)
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
  f = flags.FLAGS
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  lifetime.exit_with_parent()  # started by a launcher: end with it
  host_malloc.keep_freed_memory()  # before JAX's thread pools start: the sampler's buffers are reused
  api_key = auth.token_from_env(f.api_key)
  auth.require_token_for_bind(f.host, api_key, "sao.engines.serve")  # before the slow model load
  xla_cpu_threads.limit(f.xla_cpu_threads)  # before the first JAX computation
  if f.compilation_cache_dir:
    compilation_cache.enable(f.compilation_cache_dir, f.compilation_cache_max_gb, min_compile_time_s=0.5)
  defaults = EngineConfig()
  config = EngineConfig(
      batch_window_ms=f.batch_window_ms, max_batch_size=f.max_batch_size, max_queued_rows=f.max_queued_rows,
      prompt_buckets=_buckets(f.prompt_buckets, defaults.prompt_buckets),
      batch_buckets=_buckets(f.batch_buckets, defaults.batch_buckets),
      new_token_buckets=_buckets(f.new_token_buckets, defaults.new_token_buckets),
      suffix_buckets=_buckets(f.suffix_buckets, defaults.suffix_buckets),
      prefix_cache_bytes=defaults.prefix_cache_bytes if f.prefix_cache_bytes is None else f.prefix_cache_bytes,
      seed=f.seed, dtype=f.dtype, enable_return_routed_experts=f.enable_return_routed_experts)
  asyncio.run(_serve(f.model_path, config, f.weight_version, f.host, f.port, api_key))

def sglang_spelling(argv: list[str]) -> list[str]:
  """argv with SGLang's dashed `--enable-return-routed-experts` as this server's flag name (absl flags use `_`)."""
  return [a.replace("--enable-return-routed-experts", "--enable_return_routed_experts", 1)
          if a.startswith("--enable-return-routed-experts") else a for a in argv]


if __name__ == "__main__":
  define_flags()
  app.run(main, argv=sglang_spelling(sys.argv))
