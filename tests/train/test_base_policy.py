"""`sao.train.base_policy`: a loaded checkpoint (`model.init == "hf"`) with `recipe.sft_steps > 0` is warm-started
on the scripted expert's demonstrations — rendered by the checkpoint's own tokenizer and chat template through the
configured harness, as the entry point (`launch.run`) makes them — exported as `<workdir>/base_model`, and reused
from there by a re-run."""
import os

import jax
import numpy as np
import pytest

from experiments.configs import common, sao_openswe
from launch import run as run_lib
from sao.models import hf, toy_vocab
from sao.models.config import ModelConfig
from sao.models.tokenizer import Tokenizer, toy_tokenizer
from sao.rollout import harnesses
from sao.rollout.envs import make
from sao.rollout.tool_format import ToolCallError
from sao.train.trainer import Trainer
from tests.models.helpers import random_params

HARNESS = "xml_json_system"
# The checkpoint's template: the toy's with a marker in every user turn, so a prompt rendered by the toy's template
# (or any other) cannot pass for it.
MARKER = "[checkpoint template] "


def _checkpoint(directory: str) -> Tokenizer:
  """A tiny qwen3 checkpoint with random weights and its own tokenizer (the toy vocabulary, its own template)."""
  base = toy_tokenizer()
  template = toy_vocab.TOY_CHAT_TEMPLATE.replace("'<|im_start|>user\\n' +", f"'<|im_start|>user\\n{MARKER}' +")
  assert template != toy_vocab.TOY_CHAT_TEMPLATE
  tok = Tokenizer(base.backend, base.config, template, base.generation_config)
  config = ModelConfig.tiny("qwen3", vocab_size=tok.vocab_size)
  hf.save_pretrained(config, random_params(config, seed=3), directory)
  tok.save_pretrained(directory)
  return tok


def _config(checkpoint: str):
  config = sao_openswe.get_config("toy")
  config.model.init = "hf"
  config.model.hf_path = checkpoint
  common.harness_mixture(config, (HARNESS,))
  config.recipe.sft_steps = 3
  config.recipe.sft_batch_size = 2
  config.recipe.num_demonstrations = 4
  config.recipe.sft_learning_rate = 1e-2
  config.learner.batching.precompile = False
  return config


def _base_policy(config, workdir: str, demonstrations):
  trainer = Trainer(config, workdir, tokenizer=run_lib.tokenizer(config), train_tasks=[], validation_tasks=[])
  try:
    return trainer.base_policy(demonstrations)
  finally:
    trainer.writer.close()


def test_a_loaded_checkpoint_is_warm_started_exported_and_reused(tmp_path):
  checkpoint = str(tmp_path / "checkpoint")
  ckpt_tok = _checkpoint(checkpoint)
  config = _config(checkpoint)
  workdir = str(tmp_path / "work")
  made = []

  def demonstrations():
    made.extend(run_lib._demonstrations(config, run_lib.tokenizer(config))())  # pylint: disable=protected-access
    return made

  model_config, params, base_dir = _base_policy(config, workdir, demonstrations)
  assert base_dir == os.path.join(workdir, "base_model")

  # The demonstrations: the checkpoint's template and tokenizer, the configured harness's tool calls.
  assert len(made) == 4
  env = make(config.env.name, **dict(config.env.kwargs))
  harness = harnesses.get(HARNESS)
  tasks = {t["task_id"]: t for t in env.tasks("train", 4, config.seed)}
  for t in made:
    assert t.harness == HARNESS
    messages, tools = harness.present(env.reset(tasks[t.task_id]), env.tool_schemas)
    prompt = ckpt_tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    assert list(t.token_ids[:len(prompt)]) == list(prompt)
    assert MARKER in ckpt_tok.decode(list(t.token_ids[:len(prompt)]))
    assert list(toy_tokenizer().apply_chat_template(messages, tools=tools, add_generation_prompt=True)) != list(prompt)
    ids, mask = np.asarray(t.token_ids), np.asarray(t.action_mask, bool)
    starts = [i for i in range(len(ids)) if mask[i] and not mask[i - 1]]
    assert len(starts) == t.num_turns > 0
    for start in starts:
      end = start
      while mask[end]:
        end += 1
      assert ids[end - 1] == ckpt_tok.eos_token_ids[0]
      call = harness.parse_call(ckpt_tok.decode(list(ids[start:end - 1])), env.tool_schemas)
      assert not isinstance(call, ToolCallError), call

  # The export: the warm-started params (not the checkpoint's), with the checkpoint's tokenizer and template.
  loaded_config, loaded = hf.load_pretrained(checkpoint)
  exported_config, exported = hf.load_pretrained(base_dir)
  assert exported_config == loaded_config == model_config
  changed = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(jax.tree.leaves(exported),
                                                                            jax.tree.leaves(loaded))]
  assert any(changed)
  for a, b in zip(jax.tree.leaves(exported), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert Tokenizer.from_pretrained(base_dir).chat_templates == ckpt_tok.chat_templates

  # A re-run reuses the cached base policy: no demonstrations, no warm start.
  def no_demonstrations():
    raise AssertionError("a cached base_model must not be warm-started again")

  _, again, again_dir = _base_policy(config, workdir, no_demonstrations)
  assert again_dir == base_dir
  for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(exported)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sft_without_demonstrations_is_an_error(tmp_path):
  checkpoint = str(tmp_path / "checkpoint")
  _checkpoint(checkpoint)
  with pytest.raises(ValueError, match="needs demonstrations"):
    _base_policy(_config(checkpoint), str(tmp_path / "work"), None)
  assert not os.path.exists(tmp_path / "work" / "base_model")
