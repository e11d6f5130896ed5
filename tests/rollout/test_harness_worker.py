"""The rollout worker runs a harness mixture: training episodes through harnesses at the configured weights (fixed
seed), validation through `eval_harness`, every episode in its harness's syntax (in-process TrajectoryServer,
scripted engine)."""
import asyncio
import collections
import threading
import time

import numpy as np

from sao.engines.sglang_client import GenerateResult
from sao.models.tokenizer import toy_tokenizer
from sao.rollout import envs, harnesses
from sao.rollout.tool_format import ToolCall
from sao.rollout.worker import RolloutWorker, WorkerConfig
from sao.transport.dispenser import DispenserConfig, TaskDispenser
from sao.transport.server import ServerConfig, TrajectoryServer

NAMES = ("xml_json", "json_block", "function_call")
WEIGHTS = (1.0, 2.0, 3.0)
NUM_TRAIN = 240


class SyntaxAwareEngine:
  """Answers `compare(guess=1)` in whichever syntax the prompt's system message teaches."""

  def __init__(self, tokenizer):
    self.tokenizer = tokenizer

  async def generate(self, input_ids, sampling_params):
    del sampling_params
    prompt = self.tokenizer.decode(list(input_ids))
    name = "json_block" if "```json" in prompt else "function_call" if "Python call" in prompt else "xml_json"
    text = harnesses.get(name).format_text(ToolCall("compare", {"guess": 1}))
    ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
    return GenerateResult(tuple(ids), tuple([-0.5] * len(ids)), "stop", weight_version="0")


def test_worker_samples_harnesses_at_the_weights_and_validates_through_eval_harness(tmp_path):
  tokenizer = toy_tokenizer()
  env = envs.make("number_search", n=64)
  dispenser = TaskDispenser(env.tasks("train", NUM_TRAIN, seed=0),
                            DispenserConfig(mode="sao", lease_ttl_s=30.0, id_key="task_id", env_name="number_search",
                                            num_epochs=1),
                            validation_tasks=env.tasks("validation", 6, seed=1))
  server = TrajectoryServer(ServerConfig(log_dir=str(tmp_path / "log"), vocab_size=tokenizer.vocab_size,
                                         buffer_capacity=NUM_TRAIN, no_work_retry_ms=50), dispenser)
  dispenser.schedule_eval(0)
  port = server.start()
  worker = RolloutWorker(WorkerConfig(trainer_address=f"127.0.0.1:{port}", concurrency=32, max_turns=8,
                                      max_total_tokens=512, submit_interval_s=0.05, harnesses=NAMES,
                                      harness_weights=WEIGHTS, eval_harness="json_block", harness_seed=3), tokenizer)
  engine = SyntaxAwareEngine(tokenizer)
  worker._engine = lambda urls: engine  # pylint: disable=protected-access
  thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
  thread.start()
  trajs, evals = [], []
  try:
    deadline = time.monotonic() + 60
    while (len(trajs) < NUM_TRAIN or not evals) and time.monotonic() < deadline:
      batch = server.take_batch(NUM_TRAIN - len(trajs), timeout_s=0.2) if len(trajs) < NUM_TRAIN else []
      server.mark_consumed(batch, 0)
      trajs += batch
      evals += server.eval_results()
  finally:
    worker.stop()
    thread.join(timeout=30)
    server.stop()
  assert len(trajs) == NUM_TRAIN and evals, (len(trajs), evals)
  counts = collections.Counter(t.harness for t in trajs)
  total = sum(WEIGHTS)
  for name, weight in zip(NAMES, WEIGHTS):
    p = weight / total
    assert abs(counts[name] - NUM_TRAIN * p) < 4 * np.sqrt(NUM_TRAIN * p * (1 - p)), counts
  mixture = harnesses.HarnessMixture(NAMES, WEIGHTS, "json_block", seed=3)
  for t in trajs:  # the worker's choice is the mixture's deterministic pick for the lease group
    assert t.harness == mixture.pick(t.group_id, t.sample_index)
    assert "error:" not in tokenizer.decode(t.token_ids.tolist()), t.harness  # spoke the harness's syntax
  assert set(evals[0].by_harness) == {"json_block"}


def test_worker_runs_scaffold_episodes_through_the_proxy(tmp_path):
  """A mixture of an in-loop syntax and a proxied scaffold: both kinds of episodes reach the trainer intact."""
  tokenizer = toy_tokenizer()
  env = envs.make("number_search", n=16)
  n = 24
  dispenser = TaskDispenser(env.tasks("train", n, seed=0),
                            DispenserConfig(mode="sao", lease_ttl_s=30.0, id_key="task_id", env_name="number_search",
                                            num_epochs=1))
  server = TrajectoryServer(ServerConfig(log_dir=str(tmp_path / "log"), vocab_size=tokenizer.vocab_size,
                                         buffer_capacity=n, no_work_retry_ms=50), dispenser)
  port = server.start()
  worker = RolloutWorker(WorkerConfig(trainer_address=f"127.0.0.1:{port}", concurrency=8, max_turns=8,
                                      max_total_tokens=512, submit_interval_s=0.05,
                                      harnesses=("xml_json", "openai_tools")), tokenizer)
  engine = SyntaxAwareEngine(tokenizer)
  worker._engine = lambda urls: engine  # pylint: disable=protected-access
  thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
  thread.start()
  trajs = []
  try:
    deadline = time.monotonic() + 60
    while len(trajs) < n and time.monotonic() < deadline:
      batch = server.take_batch(n - len(trajs), timeout_s=0.2)
      server.mark_consumed(batch, 0)
      trajs += batch
  finally:
    worker.stop()
    thread.join(timeout=30)
    server.stop()
  assert len(trajs) == n
  by_harness = collections.Counter(t.harness for t in trajs)
  assert set(by_harness) == {"xml_json", "openai_tools"}, by_harness
  for t in trajs:
    t.validate(tokenizer.vocab_size)
    assert t.status in ("ok", "truncated") and t.num_turns >= 1, t.metadata
    assert "error:" not in tokenizer.decode(t.token_ids.tolist())
