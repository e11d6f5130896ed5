r"""Evaluates one exported policy on every task of an experiment's splits, the way the rollout worker plays them.

    python experiments/evaluate.py --config=experiments/configs/sao_openswe.py:toy \
        --policy=/tmp/sao_toy/policy/v140 --samples=12            # or --policy=/tmp/sao_toy/base_model

Starts a local JAX engine on the policy, plays each task of `--splits` `--samples` times at the config's
validation temperature (`--temperature` overrides) with the worker's sampling parameters, harness
(`rollout.eval_harness`) and episode limits, and prints each split's success rate with its standard error. The
in-run validation is a sample of this; use it to compare final policies precisely (docs/results.md).

Where the results land: with `--workdir=<run dir>` (and no `--policy`) the run's final policy (its highest exported
`policy/vN`) is evaluated; a policy inside a run directory (`<run dir>/policy/vN`, `<run dir>/base_model`) writes its
results as JSON to `<run dir>/evaluation/<vN | base_model>.json` (`sao.analysis.runs.evaluation_path`), where
`experiments/paper/trim.py` and `experiments/reproduce.py --sweep` find them. `--output` writes them elsewhere.

    python experiments/evaluate.py --config=experiments/configs/sao_openswe.py:toy --workdir=/tmp/sao_toy
"""
from __future__ import annotations

import asyncio
import json
import os
import sys

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # `experiments.configs` imports


def define_flags() -> None:
  """The command's flags, defined when it runs (not on import: tests import every command in one process, and
  commands share flag names, e.g. `--config`, `--out`, `--batch`)."""
  global _CONFIG, _POLICY, _WORKDIR, _SAMPLES, _SPLITS, _TEMPERATURE  # pylint: disable=global-statement
  global _CONCURRENCY, _OUTPUT  # pylint: disable=global-statement
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config(arg)).",
                                            lock_config=True)
  _POLICY = flags.DEFINE_string("policy", None, "An exported policy directory (HF layout: `<workdir>/policy/vN`, "
                                "`<workdir>/base_model`).")
  _WORKDIR = flags.DEFINE_string("workdir", None, "A run directory: evaluate its final policy (the highest policy/vN) "
                                 "unless --policy is given.")
  _SAMPLES = flags.DEFINE_integer("samples", 12, "Episodes per task.")
  _SPLITS = flags.DEFINE_list("splits", ["train", "validation", "test"], "Splits to evaluate.")
  _TEMPERATURE = flags.DEFINE_float("temperature", None, "Sampling temperature (default: rollout.eval_temperature).")
  _CONCURRENCY = flags.DEFINE_integer("concurrency", 64, "Concurrent episodes.")
  _OUTPUT = flags.DEFINE_string("output", "", "Write the results as JSON here (default: <run dir>/evaluation/<policy "
                                "name>.json when the policy lies in a run directory).")
  flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  from sao.engines.local_server import start_local_engine  # pylint: disable=g-import-not-at-top
  from sao.engines.sglang_client import SGLangEngine  # pylint: disable=g-import-not-at-top
  from sao.models.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  from sao.rollout import agent, evaluation  # pylint: disable=g-import-not-at-top
  from launch import run as run_lib  # pylint: disable=g-import-not-at-top
  from sao.analysis import runs as runs_lib  # pylint: disable=g-import-not-at-top

  if not _POLICY.value and not _WORKDIR.value:
    raise app.UsageError("give --policy (an exported policy directory) or --workdir (a run directory)")
  policy = _POLICY.value or runs_lib.final_policy_dir(_WORKDIR.value)
  output = _OUTPUT.value or runs_lib.evaluation_path_for(policy)
  config = _CONFIG.value
  r = config.rollout
  tokenizer = Tokenizer.from_pretrained(policy)  # an export carries its tokenizer
  temperature = r.eval_temperature if _TEMPERATURE.value is None else _TEMPERATURE.value
  sampling = evaluation.worker_sampling(tokenizer, r.max_new_tokens, temperature)
  limits = agent.EpisodeLimits(max_turns=r.max_turns, max_total_tokens=r.max_total_tokens)
  harness = run_lib.harness_mixture(config).eval_harness  # the harness the run's workers validate through
  kwargs = config.env.kwargs.to_dict() if hasattr(config.env.kwargs, "to_dict") else dict(config.env.kwargs)

  async def run(url):
    async with SGLangEngine(url) as engine:
      return await evaluation.evaluate_splits(engine, tokenizer, config.env.name, kwargs, _SPLITS.value,
                                              _SAMPLES.value, sampling, limits, harness, _CONCURRENCY.value)

  process, url = start_local_engine(policy, port=0)
  with process:
    results = asyncio.run(run(url))
  print(f"{policy}: {_SAMPLES.value} samples per task, temperature {temperature}, harness {harness}")
  for split, res in results.items():
    print(f"  {split:<10} {res.success_rate:.3f} ± {res.stderr:.3f}  ({res.successes}/{res.episodes} episodes, "
          f"{res.num_tasks} tasks; mean reward {res.mean_reward:.3f}; {res.by_status})")
  if output:
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    print(f"results: {output}")
    with open(output, "w") as f:
      json.dump({s: {"success_rate": r_.success_rate, "stderr": r_.stderr, "episodes": r_.episodes,
                     "num_tasks": r_.num_tasks, "mean_reward": r_.mean_reward, "by_status": r_.by_status}
                 for s, r_ in results.items()}, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
