"""The local engine's cost per row against its batch size: one prefill-and-decode call of the main job's toy model.

  python experiments/bench_engine_rows.py [--rows=16,24,28,31,32,33,48,64] [--prompt=128] [--new_tokens=16]
      [--repeats=15] [--xla_cpu_threads=1]

`sao.models.sampling.Sampler.generate` on `rows` random prompts of `prompt − 4` tokens (one batch bucket per size, so
nothing is padded), up to `new_tokens` sampled tokens each at temperature 1: the program the local engine runs per
batch. A warm-up call per size compiles; then `--repeats` rounds time every size interleaved (A B C … A B C …),
CPU time of this process per call. XLA thread pools one thread wide by default, as the embedded engine runs
(`xla_cpu_threads=1` in the toy configs). Prints, per size, the median CPU ms per call and per row, and the cost per
row against the cheapest size's: the measurement behind `launch.embedded.MAX_BATCH_ROWS`.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's `sao`

from sao.engines import xla_cpu_threads


def define_flags() -> None:
  """Defined when the command runs (tests import every command in one process)."""
  global _ROWS, _PROMPT, _NEW_TOKENS, _REPEATS, _THREADS  # pylint: disable=global-statement
  _ROWS = flags.DEFINE_list("rows", ["16", "24", "28", "31", "32", "33", "48", "64"], "Batch sizes to time.")
  _PROMPT = flags.DEFINE_integer("prompt", 128, "Prompt bucket (tokens); prompts are 4 tokens shorter.")
  _NEW_TOKENS = flags.DEFINE_integer("new_tokens", 16, "Tokens sampled per row.")
  _REPEATS = flags.DEFINE_integer("repeats", 15, "Interleaved rounds.")
  _THREADS = flags.DEFINE_integer("xla_cpu_threads", 1, "XLA:CPU threads (0: JAX's default).")


def measure(rows: list[int], prompt: int, new_tokens: int, repeats: int) -> dict[int, list[float]]:
  """CPU seconds per `generate` call, `repeats` per batch size, interleaved."""
  import jax  # pylint: disable=g-import-not-at-top  (after xla_cpu_threads.limit)
  import numpy as np  # pylint: disable=g-import-not-at-top
  from experiments.configs import sao_openswe  # pylint: disable=g-import-not-at-top
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from sao.models.sampling import Sampler, SamplingParams  # pylint: disable=g-import-not-at-top
  from sao.models.transformer import init_params  # pylint: disable=g-import-not-at-top

  toy = dict(sao_openswe.get_config("toy").model.toy)
  model_config = ModelConfig.tiny(toy.pop("model_type"), vocab_size=643, **toy)  # the toy tokenizer's vocabulary
  params = init_params(model_config, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
  calls = {}
  for n in rows:
    sampler = Sampler(model_config, params, batch_buckets=(n,), prompt_buckets=(prompt,),
                      new_token_buckets=(new_tokens,))
    prompts = [rng.integers(0, model_config.vocab_size, prompt - 4) for _ in range(n)]
    sampler.generate(prompts, sampling, seed=0)  # compiles
    calls[n] = (sampler, prompts)
  seconds = {n: [] for n in rows}
  for i in range(repeats):
    for n, (sampler, prompts) in calls.items():
      start = time.process_time()
      sampler.generate(prompts, sampling, seed=i + 1)  # numpy out: the call has finished
      seconds[n].append(time.process_time() - start)
  return seconds


def main(argv: list[str]) -> None:
  del argv
  if _THREADS.value:
    xla_cpu_threads.limit(_THREADS.value)
  import numpy as np  # pylint: disable=g-import-not-at-top
  rows = [int(r) for r in _ROWS.value]
  seconds = measure(rows, _PROMPT.value, _NEW_TOKENS.value, _REPEATS.value)
  per_row = {n: 1e3 * float(np.median(s)) / n for n, s in seconds.items()}
  best = min(per_row.values())
  print(f"toy model, prompt bucket {_PROMPT.value}, {_NEW_TOKENS.value} new tokens, {_REPEATS.value} interleaved "
        f"rounds, xla_cpu_threads={_THREADS.value}")
  print(f"{'rows':>5} {'CPU ms/call':>12} {'CPU ms/row':>11} {'vs best row':>12}")
  for n in rows:
    print(f"{n:5d} {1e3 * float(np.median(seconds[n])):12.1f} {per_row[n]:11.2f} {per_row[n] / best:11.2f}x")


if __name__ == "__main__":
  define_flags()
  app.run(main)
