"""Scripted-expert demonstrations as token-level trajectories, for the supervised warm start of a base policy.

A demonstration is tokenised in exactly the order the agent loop builds a rollout (`sao.rollout.agent`): the chat
prompt (system + user + tool schemas + generation prompt, mask 0), then for each turn the assistant text's tokens and
the stop token (mask 1), then the template's end-of-turn tokens and the tool message with the next generation prompt
(mask 0); the last observation has no generation prompt after it. Supervised training on these sequences
therefore teaches the model the very token stream it will be asked to continue at rollout time (tested against the
agent loop replaying the same actions).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sao.models.tokenizer import Tokenizer
from sao.rollout import harnesses as harness_lib
from sao.rollout.envs import make
from sao.rollout.harnesses import expert
from sao.rollout.envs.base import Demonstration
from sao.transport.trajectory import Trajectory


def demonstration_to_trajectory(demo: Demonstration, tokenizer: Tokenizer, tool_schemas: Sequence[dict[str, Any]],
                                harness: str = "demonstration") -> Trajectory:
  """Tokenises one demonstration. `rollout_logprobs` are 0 (no sampling policy); the reward is the expert's."""
  messages = demo.messages
  first = [m for m in messages[:2]]
  if [m["role"] for m in first] != ["system", "user"]:
    raise ValueError(f"demonstration of task {demo.task.get('task_id')!r}: must start with system and user messages")
  stop_id = tokenizer.eos_token_ids[0]
  end_ids = tokenizer.assistant_end_ids()
  ids = list(tokenizer.apply_chat_template(first, tools=tool_schemas, add_generation_prompt=True))
  mask = [False] * len(ids)
  boundaries = [0]
  history = list(first)
  turns = 0
  for position, message in enumerate(messages[2:], start=2):
    boundaries.append(len(ids))
    if message["role"] == "assistant":
      turn = tokenizer.encode(message["content"]) + [stop_id]
      ids += turn
      mask += [True] * len(turn)
      turns += 1
    else:
      # The episode's last observation opens no further assistant turn (as in the agent loop).
      last = position == len(messages) - 1
      observation = end_ids + tokenizer.render_message_ids(message, history=history, tools=tool_schemas,
                                                           add_generation_prompt=not last)
      ids += observation
      mask += [False] * len(observation)
    history.append(message)
  n = len(ids)
  return Trajectory(
      task_id=str(demo.task.get("task_id", demo.task.get("key", ""))),
      token_ids=np.asarray(ids, np.int32),
      action_mask=np.asarray(mask, bool),
      rollout_logprobs=np.zeros(n, np.float32),
      reward=float(demo.reward),
      turn_boundaries=tuple(boundaries),
      num_turns=turns,
      status="ok",
      harness=harness,
  )


def demonstration_trajectories(env_name: str, tokenizer: Tokenizer, n: int, seed: int, noise: float = 0.0,
                               split: str = "train", successful_only: bool = False,
                               env_kwargs: dict[str, Any] | None = None, harnesses: Sequence[str] = (),
                               harness_weights: Sequence[float] = ()) -> list[Trajectory]:
  """`n` expert episodes on `split` tasks of `env_name`, tokenised. Deterministic given `seed`.

  With `successful_only`, failed (noisy) episodes are dropped (so the result may hold fewer than `n`). With
  `harnesses`, each episode is played through one of them (picked at `harness_weights`, as the rollout worker picks
  training harnesses; `sao.rollout.harnesses.expert`), in that harness's own format; without, in the chat
  template's own tool format (what the `xml_json` harness speaks).
  """
  env = make(env_name, **(env_kwargs or {}))
  rng = np.random.default_rng(seed)
  tasks = env.tasks(split, n, seed)
  if harnesses:
    mixture = harness_lib.HarnessMixture(tuple(harnesses), tuple(harness_weights), seed=seed)
    names = [mixture.pick(f"demonstration:{i}", 0) for i in range(len(tasks))]
    trajs = expert.demonstrate_all(names, env, tasks, tokenizer, rng, noise)
    return [t for t in trajs if t.reward > 0 or not successful_only]
  out = []
  for task in tasks:
    demo = env.demonstrate(task, rng, noise=noise)
    if successful_only and demo.reward <= 0:
      continue
    out.append(demonstration_to_trajectory(demo, tokenizer, env.tool_schemas))
  return out
