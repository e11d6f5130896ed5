"""sao.run_config: dotted keys, typed text overrides (strict booleans), flag round trips, the tokenizer rule."""
from __future__ import annotations

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from sao import run_config


def _config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict(dict(
      seed=0, flag=False, rate=0.5, name="x", urls=(), sizes=(8, 9), flags_=(True,),
      model=dict(init="toy", hf_path="", tokenizer_path=""), learner=dict(sao=dict(critic_epochs=2))))
  config.lock()
  return config


def test_dotted_get_and_set_reach_nested_keys():
  config = _config()
  run_config.set_dotted(config, "learner.sao.critic_epochs", 3)
  assert run_config.get_dotted(config, "learner.sao.critic_epochs") == 3
  assert run_config.set_all(config, {"seed": 4, "model.init": "hf"}) is config
  assert (config.seed, config.model.init) == (4, "hf")


@pytest.mark.parametrize("dotted", ["learner.sao.nonexistent", "nope", "seed.deeper", "learner.x.y"])
def test_unknown_dotted_keys_are_errors_naming_the_whole_key(dotted):
  with pytest.raises(KeyError, match=dotted):
    run_config.set_dotted(_config(), dotted, 1)
  with pytest.raises(ValueError, match=f"unknown key '{dotted}'"):
    run_config.apply_overrides(_config(), {dotted: "1"})


def test_text_overrides_take_the_type_they_replace():
  config = _config()
  run_config.apply_overrides(config, {"seed": "3", "rate": "1e-3", "name": "y", "flag": "True",
                                      "urls": "http://a:1+http://b:2", "sizes": "10+11", "flags_": "false+yes"})
  assert (config.seed, config.rate, config.name, config.flag) == (3, 1e-3, "y", True)
  assert config.urls == ("http://a:1", "http://b:2") and config.sizes == (10, 11) and config.flags_ == (False, True)


@pytest.mark.parametrize("text", ["ture", "", "2", "on", "Truee"])
def test_booleans_parse_strictly(text):
  with pytest.raises(ValueError, match="flag.*is not a boolean"):
    run_config.apply_overrides(_config(), {"flag": text})
  with pytest.raises(ValueError, match="flags_.*items must be bools"):
    run_config.apply_overrides(_config(), {"flags_": f"true+{text or 'x'}"})


@pytest.mark.parametrize("key,text", [("seed", "1.5"), ("rate", "fast"), ("sizes", "8+x")])
def test_unparsable_numbers_name_the_key(key, text):
  with pytest.raises(ValueError, match=key):
    run_config.apply_overrides(_config(), {key: text})


def test_override_flags_parse_back_to_the_same_values(tmp_path):
  """What `format_value` writes, ml_collections' `--config.<key>=` flags read back (strict booleans included)."""
  path = tmp_path / "cfg.py"
  path.write_text("import ml_collections\n"
                  "def get_config():\n"
                  "  return ml_collections.ConfigDict(dict(seed=0, flag=False, rate=0.5, name='x', urls=(),\n"
                  "                                         sizes=(8, 9), model=dict(init='toy')))\n")
  values = {"seed": 7, "flag": True, "rate": 1e-6, "name": "a b", "urls": ("http://a:1", "http://b:2"),
            "sizes": (3,), "model.init": "hf"}
  argv = ["prog", f"--config={path}", *run_config.override_flags(values)]
  fv = flags.FlagValues()
  holder = config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
  fv(argv)
  for key, value in values.items():
    assert run_config.get_dotted(holder.value, key) == value, key
  argv = ["prog", f"--config={path}", "--config.flag=ture"]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
  with pytest.raises(flags.IllegalFlagValueError, match="ture"):
    fv(argv)


def test_tokenizer_path_rule():
  config = _config()
  assert run_config.tokenizer_path(config) == ""  # the toy tokenizer
  config.model.hf_path = "/ckpt"
  assert run_config.tokenizer_path(config) == ""  # an hf_path is only the tokenizer of an hf-initialised model
  config.model.init = "hf"
  assert run_config.tokenizer_path(config) == "/ckpt"
  config.model.tokenizer_path = "/tok"
  assert run_config.tokenizer_path(config) == "/tok"
