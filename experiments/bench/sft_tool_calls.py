"""Offline (not CI): how many supervised warm-start steps a loaded checkpoint needs before its sampled turns parse as
tool calls of the config's harness. Runs the trainer's warm start (`phases.sft_config`: the config's
`recipe.sft_learning_rate`, `sft_batch_size`, warm-up and cosine decay over `--steps`) on the demonstrations the
entry point makes (`launch.run`: the scripted expert through the configured harness, rendered by the checkpoint's
tokenizer and chat template), and every `--every` steps samples the first turn of `--prompts` validation episodes
(the training temperature, `rollout.max_new_tokens`, stop at the template's end of turn) and counts those the
harness parses as a tool call.

    python experiments/bench/sft_tool_calls.py --config=sao_openswe.py:smollm2 --steps=40 --every=5

Prints one line per evaluation: step, the warm start's NLL, parsed / sampled, a sample turn.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from launch import run as run_lib  # noqa: E402
from sao.models import hf  # noqa: E402
from sao.models.sampling import Sampler, SamplingParams  # noqa: E402
from sao.rollout import harnesses
from sao.rollout.envs import make
from sao.rollout.tool_format import ToolCallError
from sao.train import phases
from sao.train.learner import Learner


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="sao_openswe.py:smollm2", help="experiments/configs/<file>:<arg>")
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--every", type=int, default=5)
  parser.add_argument("--prompts", type=int, default=16)
  args = parser.parse_args()
  module, arg = args.config.split(":", 1)
  config = importlib.import_module(f"experiments.configs.{module.removesuffix('.py')}").get_config(arg)
  config.recipe.sft_steps = args.steps
  r = config.recipe
  print(f"sft: batch {r.sft_batch_size}, learning rate {r.sft_learning_rate}, {args.steps} steps, "
        f"{r.num_demonstrations} demonstrations (noise {r.demonstration_noise})", flush=True)
  tok = run_lib.tokenizer(config)
  demos = run_lib._demonstrations(config, tok)()  # pylint: disable=protected-access
  model_config, params = hf.load_pretrained(config.model.hf_path, scan_layers=config.model.get("scan_layers", False))
  learner = Learner(phases.sft_config(config), model_config, params)
  env = make(config.env.name, **dict(config.env.kwargs))
  harness = harnesses.get(tuple(config.rollout.harnesses)[0])
  prompts = []
  for task in env.tasks("validation", args.prompts, config.seed):
    messages, tools = harness.present(env.reset(task), env.tool_schemas)
    prompts.append(np.asarray(tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True), np.int32))
  sampling = SamplingParams(max_new_tokens=config.rollout.max_new_tokens, temperature=config.learner.temperature,
                            stop_token_ids=tuple(tok.eos_token_ids))
  rng = np.random.default_rng(config.seed)
  nll, start = float("nan"), time.time()
  for step in range(args.steps + 1):
    if step % args.every == 0 or step == args.steps:
      completions = Sampler(model_config, learner.actor_params).generate(prompts, sampling, seed=step)
      texts = [tok.decode([t for t in c.token_ids if t not in tok.eos_token_ids]) for c in completions]
      parsed = sum(not isinstance(harness.parse_call(t, env.tool_schemas), ToolCallError) for t in texts)
      print(f"step {step:3d}  nll {nll:.3f}  parsed {parsed}/{len(texts)}  ({time.time() - start:.0f}s)  "
            f"e.g. {texts[0][:80]!r}", flush=True)
    if step == args.steps:
      break
    batch = [demos[i] for i in rng.integers(0, len(demos), r.sft_batch_size)]
    nll = learner.sft_update(batch)["actor/loss"]


if __name__ == "__main__":
  main()
