"""What a request in flight during a weight update gets from the local engine (docs/fleet.md, "The router and weight
updates"): the update waits for the running batch, whose requests finish on the OLD weights and report the old
version; requests after it use the new weights and report the new version. No response mixes the two.

The sampler is wrapped so the test holds a batch mid-run: the ordering is forced, not a race that usually wins."""
from __future__ import annotations

import asyncio
import threading

import numpy as np

from sao.engines import local_engine
from sao.engines.local_engine import EngineConfig, LocalEngine
from sao.models.sampling import SamplingParams
from tests.engines.helpers import save_tiny_model

PROMPT = np.asarray([0, 265, 17, 40, 41, 42], np.int32)
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


def test_a_batch_running_during_an_update_finishes_on_the_old_weights(tmp_path, monkeypatch):
  old_dir = save_tiny_model(str(tmp_path / "old"), seed=0, scale=4.0)
  new_dir = save_tiny_model(str(tmp_path / "new"), seed=1, scale=4.0)
  engine = LocalEngine(old_dir, EngineConfig(batch_window_ms=0, max_batch_size=1, prompt_buckets=(64,),
                                             batch_buckets=(1,), new_token_buckets=(8,)), weight_version="0")
  reference_new = LocalEngine(new_dir, engine.config, weight_version="1")
  started, release, loaded = threading.Event(), threading.Event(), threading.Event()
  generate = engine.sampler.generate
  load = local_engine.load_pretrained_sharded

  def observed_load(*args, **kwargs):
    out = load(*args, **kwargs)
    loaded.set()
    return out

  monkeypatch.setattr(local_engine, "load_pretrained_sharded", observed_load)

  def held_generate(*args, **kwargs):  # runs in the engine's worker thread
    started.set()
    release.wait(60)
    return generate(*args, **kwargs)

  async def main():
    await engine.start()
    await reference_new.start()
    try:
      ((old_alone, v_old_alone),) = await engine.generate([(PROMPT, GREEDY)])
      ((new_alone, _),) = await reference_new.generate([(PROMPT, GREEDY)])
      engine.sampler.generate = held_generate
      in_flight = asyncio.create_task(engine.generate([(PROMPT, GREEDY)]))
      await asyncio.to_thread(started.wait, 60)
      update = asyncio.create_task(engine.update_weights(new_dir, "1"))
      await asyncio.to_thread(loaded.wait, 60)  # the new weights are loaded while the batch is held ...
      await asyncio.sleep(0.5)  # ... and the swap, were it not waiting for the batch, would happen now
      swapped_early = update.done()
      release.set()
      ((during, v_during),) = await in_flight
      assert await update == "1"
      engine.sampler.generate = generate
      ((after, v_after),) = await engine.generate([(PROMPT, GREEDY)])
      return swapped_early, (old_alone, v_old_alone), (new_alone,), (during, v_during), (after, v_after)
    finally:
      release.set()
      await engine.stop()
      await reference_new.stop()

  swapped_early, (old_alone, v0), (new_alone,), (during, v_during), (after, v_after) = asyncio.run(main())
  assert not swapped_early, "the weights were swapped while a batch was running"
  assert not np.array_equal(old_alone.token_ids, new_alone.token_ids)  # the two policies are told apart
  # In flight during the update: the old weights' tokens and log-probs, reported as the old version.
  assert v0 == v_during == "0"
  np.testing.assert_array_equal(during.token_ids, old_alone.token_ids)
  np.testing.assert_allclose(during.logprobs, old_alone.logprobs, rtol=1e-5, atol=1e-6)
  # After it: the new weights', reported as the new version.
  assert v_after == "1"
  np.testing.assert_array_equal(after.token_ids, new_alone.token_ids)
  np.testing.assert_allclose(after.logprobs, new_alone.logprobs, rtol=1e-5, atol=1e-6)
