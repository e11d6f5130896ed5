"""Harnesses (agent scaffolds) by name: `get("json_block").run_episode(...)`, and the per-episode mixture.

Importing this package registers the built-in harnesses (see `base.py` for the interface).
"""
from sao.rollout.harnesses import bash_only  # noqa: F401  (registers bash_only)
from sao.rollout.harnesses import openai_tools  # noqa: F401  (registers openai_tools)
from sao.rollout.harnesses import syntaxes  # noqa: F401  (registers xml_json, json_block, function_call)
from sao.rollout.harnesses.base import Harness
from sao.rollout.harnesses.registry import HarnessMixture, get, register, registered

__all__ = ["Harness", "HarnessMixture", "get", "register", "registered"]
