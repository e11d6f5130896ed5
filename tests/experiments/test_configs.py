"""Every shipped experiment config: every variant loads, validates, and carries the recipe docs/algorithm.md states."""
from __future__ import annotations

import importlib
import importlib.util
import pathlib

import ml_collections
import pytest

from launch import run as run_lib
from sao.rollout import envs
from sao.train.config import validate_learner_config

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "experiments" / "configs"
MODULES = sorted(p.stem for p in CONFIG_DIR.glob("*.py") if p.stem not in ("__init__", "common", "pod_layout"))
STABILIZED = ("sao_openswe", "sao_multilingual", "sao_mixed_harness")
INITIAL = ("sao_openswe_initial",)
# Configs of a CPU toy task only (no paper-scale setting exists for it): `toy` and no `full`.
TOY_ONLY = ("sao_search_chain",)
CASES = [(name, variant) for name in MODULES for variant in importlib.import_module(
    f"experiments.configs.{name}").VARIANTS]


def _load(name: str):
  return importlib.import_module(f"experiments.configs.{name}")


def test_the_shipped_set_is_discovered():
  for name in STABILIZED + INITIAL:
    assert name in MODULES


@pytest.mark.parametrize("name,variant", CASES)
def test_every_variant_loads_and_validates(name, variant):
  module = _load(name)
  assert {"toy"} <= set(module.VARIANTS) if name in TOY_ONLY else {"toy", "full"} <= set(module.VARIANTS)
  config = module.get_config(variant)
  assert config.name and variant in config.name
  validate_learner_config(config.learner)
  with pytest.raises(AttributeError):
    config.not_a_knob = 1  # locked: a typo in an experiment file cannot add a silent key
  assert config.learner.actor.optimizer.total_steps >= config.total_steps


@pytest.mark.parametrize("name", MODULES)
def test_unknown_keys_and_variants_are_rejected(name):
  module = _load(name)
  with pytest.raises(ValueError, match="nonexistent"):
    module.get_config("toy,nonexistent=1")
  with pytest.raises(ValueError, match="learner.sao.nonexistent"):
    module.get_config("toy,learner.sao.nonexistent=1")
  with pytest.raises(ValueError, match="unknown variant"):
    module.get_config("tiny")


@pytest.mark.parametrize("name", MODULES)
def test_overrides_reach_dependent_fields(name):
  config = _load(name).get_config("toy,total_steps=7,learner.sao.critic_epochs=3,seed=2")
  assert (config.total_steps, config.learner.sao.critic_epochs, config.seed) == (7, 3, 2)
  assert config.learner.actor.optimizer.total_steps == 7  # a run shorter than its warmup: the schedule clamps (optim)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_holds_the_commands(name):
  doc = _load(name).__doc__
  for variant in ("toy",) if name in TOY_ONLY else ("toy", "full"):
    assert f"python experiments/train.py --config=experiments/configs/{name}.py:{variant}" in doc


@pytest.mark.parametrize("name", [m for m in MODULES if m not in TOY_ONLY])
def test_full_variant_is_fully_specified(name):
  module = _load(name)
  config = module.get_config("full")
  assert config.model.init == "hf" and config.model.hf_path, "full: the model checkpoint must be named"
  assert config.env.name != "number_search" and config.env.name != "code_repair"
  # Engines: either configured, or the docstring's command says how to pass the router's address.
  assert config.engine_urls or "--config.engine_urls=" in module.__doc__
  assert all(url.startswith("http") for url in config.engine_urls)
  assert config.server.host == "0.0.0.0", "remote workers must reach the trainer"
  assert max(config.learner.batching.bucket_lengths) >= config.rollout.max_total_tokens
  # The paper's optimiser: actor 1e-6 after 10 warmup steps, constant (only the toy decays its rate).
  actor = config.learner.actor.optimizer
  assert (actor.learning_rate, actor.warmup_steps, actor.schedule) == (1e-6, 10, "constant")
  if config.learner.critic.init == "checkpoint":
    assert config.learner.critic.init_path


@pytest.mark.parametrize("name,variant", CASES)
def test_env_turn_limit_is_the_agent_loops(name, variant):
  """An env's own turn limit below `rollout.max_turns` would silently end the episodes first (the SWE env's default
  is 30 against the full configs' 200)."""
  config = _load(name).get_config(variant)
  env = envs.make(config.env.name, **config.env.kwargs) if config.env.name != "swe" else None
  turns = config.env.kwargs.get("max_turns", getattr(env, "config_max_turns", None))
  if config.env.name == "swe":
    assert turns == config.rollout.max_turns, (turns, config.rollout.max_turns)
  elif turns is not None:
    assert turns <= config.rollout.max_turns, (turns, config.rollout.max_turns)


@pytest.mark.parametrize("name", STABILIZED)
@pytest.mark.parametrize("variant", ("toy", "full"))
def test_stabilized_recipe(name, variant):
  config = _load(name).get_config(variant)
  s = config.learner.sao
  assert config.learner.algorithm == "sao" and config.rollout.group_size == 1
  assert s.critic_warmup_steps == 20 and s.critic_epochs == 2 and s.whiten_advantages
  assert (s.dis_ratio_low, s.dis_ratio_high) == (0.2, 4.0)
  assert config.learner.critic.optimizer.clip_norm == 10.0
  # A warm-started critic: pretrained on the toy, loaded from a value checkpoint at full scale.
  assert config.recipe.value_pretrain_steps > 0 or config.learner.critic.init == "checkpoint"


@pytest.mark.parametrize("variant", ("toy", "full"))
def test_initial_recipe(variant):
  config = _load("sao_openswe_initial").get_config(variant)
  s = config.learner.sao
  assert s.critic_warmup_steps == 10 and s.critic_epochs == 2 and not s.whiten_advantages
  assert (s.dis_ratio_low, s.dis_ratio_high) == (0.2, 4.0)
  assert config.learner.critic.optimizer.clip_norm == 1.0
  assert config.recipe.value_pretrain_steps == 0 and config.learner.critic.init == "policy"
  stabilized = _load("sao_openswe").get_config(variant)
  # Only the critic recipe differs from the stabilized run it is compared with.
  plain = lambda v: v.to_dict() if isinstance(v, ml_collections.ConfigDict) else v
  for key in ("env", "rollout", "model", "total_steps", "engine_urls"):
    assert plain(config[key]) == plain(stabilized[key]), key


def test_multilingual_settings():
  module = _load("sao_multilingual")
  toy, full = module.get_config("toy"), module.get_config("full")
  assert toy.env.name == "code_repair"
  assert toy.rollout.max_total_tokens <= max(toy.learner.batching.bucket_lengths)
  assert full.env.num_validation_tasks == 300
  # The `swe` env's own data keywords (SWE-bench JSONL + snapshots), not keywords no environment takes.
  assert set(full.env.kwargs) == {"jsonl", "snapshot_root", "max_turns"} and full.env.kwargs.jsonl.endswith(".jsonl")
  assert full.rollout.harnesses == ("openai_tools",) and full.rollout.eval_harness == "openai_tools"


@pytest.mark.parametrize("variant", ("toy", "full"))
def test_mixed_harness_is_an_equal_weight_mixture(variant):
  config = _load("sao_mixed_harness").get_config(variant)
  names, weights = config.rollout.harnesses, config.rollout.harness_weights
  assert len(names) >= 2 and len(set(names)) == len(names) and len(weights) == len(names)
  assert len(set(weights)) == 1 and weights[0] > 0
  assert config.rollout.eval_harness in names
  if variant == "full":
    assert set(names) == {"openai_tools", "bash_only"}  # the registered SWE scaffolds


@pytest.mark.parametrize("name,variant", CASES)
def test_every_variant_names_registered_harnesses(name, variant):
  """What a worker would refuse at start: harness names must be registered (`sao.rollout.harnesses`)."""
  config = _load(name).get_config(variant)
  mixture = run_lib.harness_mixture(config)
  assert mixture.eval_harness in mixture.names


@pytest.mark.parametrize("name,variant", CASES)
def test_every_variant_builds_its_environment_and_tasks(name, variant):
  """The run's own start-up check (`launch.run.check_startable`): the environment takes the config's kwargs, the
  harnesses are registered, and the task lists load; for data this machine does not have, a FileNotFoundError that
  names the missing file and the config keys to pass instead."""
  config = _load(name).get_config(f"{variant},env.num_train_tasks=4,env.num_validation_tasks=2")
  run_lib.make_env(config)  # a wrong keyword fails here, whatever the data
  try:
    train, validation = run_lib.check_startable(config)
  except FileNotFoundError as e:
    assert config.env.kwargs.get("jsonl") and config.env.kwargs.jsonl in str(e), e
    assert "--config.env.kwargs." in str(e), e
    return
  assert len(train) == 4 and len(validation) == 2
  assert all(t["env"] == config.env.name for t in train + validation)


def test_bad_env_kwargs_and_harnesses_fail_before_start_naming_them():
  module = _load("sao_openswe")
  config = module.get_config("toy")
  with config.unlocked():
    config.env.kwargs.train_dataset = "x"  # what sao_multilingual:full once passed to the `swe` env
  with pytest.raises(ValueError, match="train_dataset"):
    run_lib.make_env(config)
  with pytest.raises(ValueError, match="claude_code.*not a registered harness.*--config.rollout.harnesses"):
    run_lib.harness_mixture(module.get_config("toy,rollout.harnesses=claude_code"))


def test_booleans_parse_strictly():
  module = _load("sao_openswe")
  assert module.get_config("toy,jax_distributed=true").jax_distributed is True
  assert module.get_config("toy,learner.sao.whiten_advantages=False").learner.sao.whiten_advantages is False
  with pytest.raises(ValueError, match="jax_distributed.*'ture' is not a boolean"):
    module.get_config("toy,jax_distributed=ture")


def test_swe_toy_trains_through_the_proxied_scaffolds():
  config = _load("sao_openswe").get_config("swe_toy")
  assert config.env.name == "swe" and set(config.rollout.harnesses) == {"openai_tools", "bash_only"}
  assert config.model.toy.max_position_embeddings >= config.rollout.max_total_tokens
  assert max(config.learner.batching.bucket_lengths) >= config.rollout.max_total_tokens
  single = _load("sao_openswe").get_config("swe_toy,rollout.harnesses=bash_only,rollout.harness_weights=1")
  assert single.rollout.harnesses == ("bash_only",)


def test_tuple_overrides_take_the_items_type():
  module = _load("sao_openswe")
  config = module.get_config("toy,env.kwargs.sizes=8+9,env.kwargs.split_fractions=0.5+0.3+0.2,"
                             "learner.critic.frozen_params=,engine_urls=http://a:1+http://b:2")
  assert config.env.kwargs.sizes == (8, 9) and config.env.kwargs.split_fractions == (0.5, 0.3, 0.2)
  assert config.learner.critic.frozen_params == () and config.engine_urls == ("http://a:1", "http://b:2")
  with pytest.raises(ValueError, match="env.kwargs.sizes.*must be ints"):
    module.get_config("toy,env.kwargs.sizes=8+x")


def test_toy_holds_out_whole_ranges():
  """The toy's validation and test ranges are never trained on (no training target shares a prompt with them)."""
  config = _load("sao_openswe").get_config("toy")
  env = envs.make(config.env.name, **config.env.kwargs)
  ranges = {s: {t["n"] for t in env.split_pool(s)} for s in envs.SPLITS}
  assert ranges == {"train": {9, 10, 11, 15, 16}, "validation": {8, 13}, "test": {12, 14}}


def test_flag_overrides_reach_the_derived_fields():
  """`--config.seed` / `--config.total_steps` / `--config.rollout.batch_size` (applied after `get_config`) change
  the learner's seed, both optimisers' schedule lengths and the flow-control bound, as the arg form does."""
  from experiments.configs import sao_openswe  # pylint: disable=g-import-not-at-top
  by_flags = sao_openswe.get_config("toy")
  by_flags.seed, by_flags.total_steps, by_flags.rollout.batch_size = 1, 160, 32  # what config_flags does
  by_arg = sao_openswe.get_config("toy,seed=1,total_steps=160,rollout.batch_size=32")
  for config in (by_flags, by_arg):
    assert config.learner.seed == 1
    assert config.learner.actor.optimizer.total_steps == 160
    assert config.learner.critic.optimizer.total_steps == 160 + config.recipe.value_pretrain_steps
    assert config.server.max_outstanding == 64
  assert by_flags.to_dict() == by_arg.to_dict()
  by_flags.server.max_outstanding = 100  # setting a derived key itself replaces the derivation
  assert by_flags.server.max_outstanding == 100 and by_flags.rollout.batch_size == 32


FULL_CASES = [(name, variant) for name in MODULES for variant in _load(name).VARIANTS if variant.startswith("full")]


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="libtpu is not installed (pip install -e '.[test]' installs it)")
@pytest.mark.parametrize("topology", ["v5p:4x4x8", "v6e:16x16"])
@pytest.mark.parametrize("name, variant", FULL_CASES)
def test_full_variant_builds_its_learner_mesh_on_a_pod_slice(name, variant, topology):
  """As shipped (no mesh overrides), every `full` config's learner mesh (`full_64k`'s expert-parallel one too) covers
  a v5p-128's (and a v6e-256's) chips and its micro-batches split evenly over the batch shards — the learner's own
  precondition (`Learner.__init__`) — without compiling anything (libtpu only describes the devices)."""
  from sao.train import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from sao.aot import tpu_topology  # pylint: disable=g-import-not-at-top
  config = _load(name).get_config(variant)
  _, devices = tpu_topology.topology_devices(topology)
  mesh = mesh_lib.make_mesh(dict(config.learner.mesh), devices)
  assert mesh.devices.size == len(devices), f"{name}: the mesh leaves chips idle on {topology}"
  shards = mesh_lib.batch_parallel_size(mesh)
  micro = config.learner.batching.micro_batch_size
  assert micro and micro % shards == 0, (micro, shards)
  assert config.rollout.batch_size % micro == 0  # whole micro-batches, no padded rows
  assert config.model.param_dtype == config.model.compute_dtype == "bfloat16"
  assert config.learner.actor.optimizer.master_weights and config.learner.critic.optimizer.master_weights
  if mesh.shape["expert"] > 1:  # 256 experts over `expert`; no row longer than the layout fits
    assert max(config.learner.batching.bucket_lengths) == config.rollout.max_total_tokens == 65536


@pytest.mark.parametrize("name", MODULES)
def test_toy_variants_stay_float32(name):
  config = _load(name).get_config("toy")
  assert (config.model.param_dtype, config.model.compute_dtype, config.model.remat) == ("float32", "float32", "none")
  assert not config.learner.actor.optimizer.master_weights


@pytest.mark.parametrize("name", MODULES)
def test_toy_variants_wait_for_each_publish_and_full_ones_publish_in_the_background(name):
  """docs/performance_job.md ("The RL step against the tree before the speed work"): publishing in the background
  changed the toy's learning; at full scale it overlaps a publish of tens of seconds with the next step."""
  module = _load(name)
  assert module.get_config("toy").async_publish is False
  if "full" in module.VARIANTS:
    assert module.get_config("full").async_publish is True
