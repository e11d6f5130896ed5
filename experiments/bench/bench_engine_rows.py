"""The local engine's cost per row against its batch size: one prefill-and-decode call of the main job's toy model.

  python experiments/bench/bench_engine_rows.py [--rows=16,24,28,31,32,33,48,64] [--prompt=128] [--new_tokens=16]
      [--repeats=15] [--xla_cpu_threads=1]
  python experiments/bench/bench_engine_rows.py --later_turn --rows=24 [--suffix_tokens=8] [--prefix_tokens=60]
      [--smallest_suffix_buckets=64,32,16,8]

`sao.models.sampling.Sampler.generate` on `rows` random prompts of `prompt − 4` tokens (one batch bucket per size, so
nothing is padded), up to `new_tokens` sampled tokens each at temperature 1: the program the local engine runs per
batch. A warm-up call per size compiles; then `--repeats` rounds time every size interleaved (A B C … A B C …),
CPU time of this process per call. XLA thread pools one thread wide by default, as the embedded engine runs
(`xla_cpu_threads=1` in the toy configs). Prints, per size, the median CPU ms per call and per row, and the cost per
row against the cheapest size's: the measurement behind `launch.embedded.MAX_BATCH_ROWS`.

`--later_turn`: the call a later turn of a conversation makes instead (`Sampler.generate_continuing`): each of `rows`
rows extends a cached state of `prefix_tokens` tokens by `suffix_tokens` new ones, and the engine pads that suffix to
its smallest suffix bucket that fits; timed with each of `smallest_suffix_buckets` as that smallest bucket (the
larger ones doubling up to the 64-token prompt bucket), interleaved: the measurement behind
`launch.embedded.SHORT_SUFFIX_BUCKETS`.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app, flags

# the repository, two folders up: this checkout's `sao`
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sao.engines import xla_cpu_threads


def define_flags() -> None:
  """Defined when the command runs (tests import every command in one process)."""
  global _ROWS, _PROMPT, _NEW_TOKENS, _REPEATS, _THREADS  # pylint: disable=global-statement
  global _LATER, _SUFFIX, _PREFIX, _SMALLEST  # pylint: disable=global-statement
  _ROWS = flags.DEFINE_list("rows", ["16", "24", "28", "31", "32", "33", "48", "64"], "Batch sizes to time.")
  _PROMPT = flags.DEFINE_integer("prompt", 128, "Prompt bucket (tokens); prompts are 4 tokens shorter.")
  _NEW_TOKENS = flags.DEFINE_integer("new_tokens", 16, "Tokens sampled per row.")
  _REPEATS = flags.DEFINE_integer("repeats", 15, "Interleaved rounds.")
  _THREADS = flags.DEFINE_integer("xla_cpu_threads", 1, "XLA:CPU threads (0: JAX's default).")
  _LATER = flags.DEFINE_bool("later_turn", False, "Time a later turn's call (cached prefix + a short suffix).")
  _SUFFIX = flags.DEFINE_integer("suffix_tokens", 8, "later_turn: new tokens per row.")
  _PREFIX = flags.DEFINE_integer("prefix_tokens", 60, "later_turn: cached tokens per row.")
  _SMALLEST = flags.DEFINE_list("smallest_suffix_buckets", ["64", "32", "16", "8"], "later_turn: the engine's "
                                "smallest suffix bucket, one setting each.")


def _toy_model():
  """The main job's toy model (random weights: the cost does not depend on them)."""
  import jax  # pylint: disable=g-import-not-at-top  (after xla_cpu_threads.limit)
  from experiments.configs import sao_openswe  # pylint: disable=g-import-not-at-top
  from sao.models.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from sao.models.transformer import init_params  # pylint: disable=g-import-not-at-top
  toy = dict(sao_openswe.get_config("toy").model.toy)
  model_config = ModelConfig.tiny(toy.pop("model_type"), vocab_size=643, **toy)  # the toy tokenizer's vocabulary
  return model_config, init_params(model_config, jax.random.PRNGKey(0))


def measure_later_turn(rows: int, smallest: list[int], prefix: int, suffix: int, new_tokens: int,
                       repeats: int) -> dict[int, list[float]]:
  """CPU seconds per `generate_continuing` call, `repeats` per smallest suffix bucket, interleaved."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from sao.models.sampling import Sampler, SamplingParams  # pylint: disable=g-import-not-at-top
  model_config, params = _toy_model()
  rng = np.random.default_rng(0)
  sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
  first_prompt = max(1, prefix - new_tokens)  # the first turn: prompt + its completion make the cached prefix
  prompt_buckets = (64, 128, 192, 256, 512)
  calls = {}
  for b in smallest:
    suffix_buckets = sorted({*(b * 2**i for i in range(8) if b * 2**i < 64), *prompt_buckets})
    sampler = Sampler(model_config, params, batch_buckets=(rows,), prompt_buckets=prompt_buckets,
                      new_token_buckets=(new_tokens,), suffix_buckets=suffix_buckets)
    firsts = [rng.integers(0, model_config.vocab_size, first_prompt) for _ in range(rows)]
    completions, states = sampler.generate_continuing(firsts, sampling, [None] * rows)
    prompts = [np.concatenate([f, c.token_ids, rng.integers(0, model_config.vocab_size, suffix)])
               for f, c in zip(firsts, completions)]
    sampler.generate_continuing(prompts, sampling, states, seed=0)  # compiles
    calls[b] = (sampler, prompts, states)
  seconds = {b: [] for b in smallest}
  for i in range(repeats):
    for b, (sampler, prompts, states) in calls.items():
      start = time.process_time()
      sampler.generate_continuing(prompts, sampling, states, seed=i + 1)
      seconds[b].append(time.process_time() - start)
  return seconds


def measure(rows: list[int], prompt: int, new_tokens: int, repeats: int) -> dict[int, list[float]]:
  """CPU seconds per `generate` call, `repeats` per batch size, interleaved."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from sao.models.sampling import Sampler, SamplingParams  # pylint: disable=g-import-not-at-top
  model_config, params = _toy_model()
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
  if _LATER.value:
    smallest = [int(b) for b in _SMALLEST.value]
    seconds = measure_later_turn(rows[0], smallest, _PREFIX.value, _SUFFIX.value, _NEW_TOKENS.value, _REPEATS.value)
    best = min(float(np.median(s)) for s in seconds.values())
    print(f"toy model, later turn: {rows[0]} rows, {_PREFIX.value} cached + {_SUFFIX.value} new tokens each, "
          f"{_NEW_TOKENS.value} sampled, {_REPEATS.value} interleaved rounds, xla_cpu_threads={_THREADS.value}")
    print(f"{'smallest suffix bucket':>22} {'CPU ms/call':>12} {'vs best':>8}")
    for b, s in seconds.items():
      print(f"{b:22d} {1e3 * float(np.median(s)):12.1f} {float(np.median(s)) / best:7.2f}x")
    return
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
