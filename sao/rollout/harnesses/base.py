"""A harness: the agent scaffold an episode runs through — how the model sees the tools, how its text becomes tool
calls, and who drives the conversation.

Two kinds share one interface (`Harness.run_episode` → one `Trajectory` with `harness` set to the harness's name):
- tool syntaxes (`syntaxes.py`): the built-in agent loop (`sao.rollout.agent`) with a harness-specific tool
  presentation and call format (Qwen `<tool_call>` JSON, a fenced ```json block, a Python-style call);
- scaffolds (`proxied.py` and the scaffolds built on it): an agent program that talks to the policy only through
  the OpenAI-compatible token-capturing proxy (`sao.rollout.proxy`), exactly as an external scaffold would.

`format_call` is the inverse of a harness's parsing: the assistant text that makes the harness perform a call. The
scripted expert (`expert.py`) uses it to play demonstrations in every harness's own format.
"""
from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar

from sao.models.sampling import SamplingParams
from sao.models.tokenizer import Tokenizer
from sao.rollout import agent
from sao.rollout.envs.base import Env
from sao.rollout.tool_format import ToolCall
from sao.transport.trajectory import Trajectory


class Harness(abc.ABC):
  """One agent scaffold. Stateless: one instance serves any number of concurrent episodes."""
  name: ClassVar[str]

  @abc.abstractmethod
  async def run_episode(self, engine: agent.Engine, tokenizer: Tokenizer, env: Env, task: dict[str, Any],
                        sampling: SamplingParams, limits: agent.EpisodeLimits, *,
                        policy_version_fn: Callable[[], int] | None = None, sample_index: int = 0,
                        group_id: str = "", lease_id: str = "") -> Trajectory:
    """Plays `task` in `env` (reset here) with the engine; never raises for engine/env/scaffold failures (they
    become the trajectory's status, as in `agent.run_episode`)."""

  @abc.abstractmethod
  def format_call(self, call: ToolCall, env: Env) -> str:
    """The assistant text that makes this harness perform `call` in `env` (whose tools it uses)."""

  def expert_call(self, env: Env, num_expert_calls: int) -> ToolCall:
    """The scripted expert's next call, after `num_expert_calls` expert calls of this episode ran.

    By default the environment's own expert (`env.expert_action()`, which tracks its progress from the calls it
    executes). A harness that executes the expert's calls as different tool calls (bash_only's edits as shell
    commands) overrides this to follow the expert's plan by count instead.
    """
    del num_expert_calls
    return env.expert_action()
