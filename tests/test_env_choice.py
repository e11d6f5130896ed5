"""sao.env_choice: a setting read from an environment variable, and every bad value an error naming the variable."""
import pytest

from sao import env_choice

MEANINGS = {"auto": "decide by the host", "on": "always", "off": "never"}


def test_reads_the_value_stripped_and_lowercased_and_the_default_when_unset_or_empty():
  assert env_choice.read("SAO_X", MEANINGS, "auto", {}) == "auto"
  assert env_choice.read("SAO_X", MEANINGS, "auto", {"SAO_X": "  "}) == "auto"
  assert env_choice.read("SAO_X", MEANINGS, "auto", {"SAO_X": " Off "}) == "off"
  assert env_choice.read("SAO_X", MEANINGS, "on", {"OTHER": "off"}) == "on"


def test_reads_the_process_environment_by_default(monkeypatch):
  monkeypatch.setenv("SAO_X", "ON")
  assert env_choice.read("SAO_X", MEANINGS, "auto") == "on"


def test_a_bad_value_names_the_variable_the_value_and_every_choice_with_the_default_marked():
  with pytest.raises(ValueError) as raised:
    env_choice.read("SAO_X", MEANINGS, "auto", {"SAO_X": "Sometimes"})
  assert str(raised.value) == ("SAO_X='sometimes': expected 'auto' (decide by the host; the default), "
                               "'on' (always) or 'off' (never)")


def test_a_default_outside_the_choices_is_refused():
  with pytest.raises(ValueError, match="SAO_X: the default 'maybe'"):
    env_choice.read("SAO_X", MEANINGS, "maybe", {})
