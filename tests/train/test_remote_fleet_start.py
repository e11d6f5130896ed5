"""A fleet the run did not start (`config.engine_urls`: launch/tpu_pod.py, launch/sglang_fleet.py) serves
`model.hf_path`; before any worker samples from it, the trainer publishes the base policy the learner starts from
(`<workdir>/base_model`, e.g. after the supervised warm start) as version 0 — and only then."""
import os

import pytest

from experiments.configs import sao_openswe
from launch import run as run_lib
from sao.rollout.envs import make
from sao.train import trainer as trainer_lib


class _WorkersStarted(Exception):
  """Raised by the stub launcher: the run has reached its workers' start, which is all these tests need."""


def _run_until_workers(tmp_path, monkeypatch, engine_urls) -> list:
  events = []

  async def fake_publish(urls, model_path, version, fleet=None):  # the engines' side of a publish
    events.append(("publish", tuple(urls), model_path, version))
    return {}

  def start_workers(address):
    events.append(("workers", address))
    raise _WorkersStarted

  monkeypatch.setattr(trainer_lib, "_publish", fake_publish)
  config = sao_openswe.get_config("toy")
  config.recipe.sft_steps = 0  # the toy model as initialised is the base policy: exported to <workdir>/base_model
  config.learner.batching.precompile = False
  config.engine_urls = tuple(engine_urls)
  workdir = str(tmp_path / "run")
  env = make(config.env.name, **dict(config.env.kwargs))
  trainer = trainer_lib.Trainer(config, workdir, tokenizer=run_lib.tokenizer(config),
                                train_tasks=env.tasks("train", 4, 0), validation_tasks=env.tasks("validation", 2, 0))
  launcher = trainer_lib.Launcher(start_engines=lambda path: events.append(("engines", path)) or ["http://local:1"],
                                  start_workers=start_workers)
  with pytest.raises(_WorkersStarted):
    trainer._run(launcher, None)  # pylint: disable=protected-access
  return events, os.path.join(workdir, "base_model")


def test_a_fleet_started_elsewhere_gets_the_base_policy_before_the_workers(tmp_path, monkeypatch):
  events, base_dir = _run_until_workers(tmp_path, monkeypatch, ("http://fleet:30000",))
  assert events[0] == ("publish", ("http://fleet:30000",), base_dir, 0), events
  assert events[1][0] == "workers" and len(events) == 2, events
  assert os.path.isfile(os.path.join(base_dir, "config.json"))


def test_engines_the_run_starts_serve_the_base_policy_already(tmp_path, monkeypatch):
  events, base_dir = _run_until_workers(tmp_path, monkeypatch, ())
  assert events[0] == ("engines", base_dir) and events[1][0] == "workers" and len(events) == 2, events
