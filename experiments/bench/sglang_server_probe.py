r"""The project's SGLang client against a running SGLang server: each call the project makes, what came back, and
the `/generate` bodies recorded for the contract tests.

    python experiments/bench/sglang_server_probe.py --url=http://127.0.0.1:31555 --vocab_size=1024 \
        --record_dir=tests/engines/fixtures/sglang_jax

How the sglang-jax server behind `tests/engines/fixtures/sglang_jax/` was started: docs/fleet.md, "The SGLang
contract". Calls, in order: `/health`, `/get_model_info`, `/generate` (one prompt: `length`, then with every id from
3 up as a stop id: `stop`), the batch form, `/update_weights_from_disk` (with `--update_path`, default the model
path `/get_model_info` names), `/flush_cache`. Prints one line per call (`ok` with what the client parsed, or the
error) and, with `--record_dir`, writes `generate_length.json`, `generate_stop.json` and `generate_batch.json` (the
raw bodies). Exits non-zero if a `/generate` call fails (the other endpoints are reported, not required: sglang-jax
has no `/update_weights_from_disk`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.engines.sglang_client import EngineError, SGLangEngine, parse_generate_response

PROMPT = [5, 6, 7, 8]


async def probe(url: str, vocab_size: int, record_dir: str | None, update_path: str | None) -> bool:
  generate_ok = True
  async with SGLangEngine(url, timeout_s=300, max_retries=0) as client:

    async def call(name: str, fn: Callable[[], Awaitable[Any]]) -> Any:
      try:
        result = await fn()
      except Exception as e:  # noqa: BLE001 — reported, the probe goes on
        print(f"{name}: FAILED {type(e).__name__}: {e}")
        return None
      print(f"{name}: ok {result!r}"[:400])
      return result

    bodies = {
        "generate_length": {"input_ids": PROMPT, "return_logprob": True, "sampling_params": {
            "max_new_tokens": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "stop_token_ids": [2]}},
        "generate_stop": {"input_ids": PROMPT, "return_logprob": True, "sampling_params": {
            "max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "stop_token_ids": list(range(3, vocab_size))}},
        "generate_batch": {"input_ids": [[5, 6], [7, 8, 9]], "return_logprob": True, "sampling_params": [
            {"max_new_tokens": 2}, {"max_new_tokens": 1, "temperature": 0.0}]},
    }
    await call("health", client.health)
    info = await call("get_model_info", client.get_model_info)
    for name, body in bodies.items():
      raw = await call(f"{name} (raw body)", lambda body=body: client.request("POST", "/generate", body))
      try:
        print(f"{name} (as the client parses it): ok {parse_generate_response(raw)!r}"[:400])
      except EngineError as e:  # a None body (the request failed) lands here too
        print(f"{name} (as the client parses it): FAILED {e}")
        generate_ok = False
      if raw is not None and record_dir:
        os.makedirs(record_dir, exist_ok=True)
        with open(os.path.join(record_dir, f"{name}.json"), "w") as f:
          f.write(json.dumps(raw, indent=1) + "\n")
    path = update_path or (info or {}).get("model_path", "")
    await call("update_weights_from_disk", lambda: client.update_weights_from_disk(path, weight_version="1"))
    await call("flush_cache", client.flush_cache)
  return generate_ok


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:31555")
  parser.add_argument("--vocab_size", type=int, required=True, help="the served model's vocabulary (stop ids)")
  parser.add_argument("--record_dir", default=None, help="where to write the /generate bodies (none: not written)")
  parser.add_argument("--update_path", default=None, help="model_path for /update_weights_from_disk")
  args = parser.parse_args()
  sys.exit(0 if asyncio.run(probe(args.url, args.vocab_size, args.record_dir, args.update_path)) else 1)


if __name__ == "__main__":
  main()
