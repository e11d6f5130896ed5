"""Scaffold harnesses: an agent program that drives the policy only through the OpenAI-compatible token-capturing
proxy (`sao.rollout.proxy`), exactly as an external scaffold would.

Per episode, `ProxiedHarness.run_episode` serves a `TokenCapturingProxy` over the episode's engine on a loopback
port, points an `openai.AsyncOpenAI` client at `http://127.0.0.1:<port>/sessions/<id>/v1`, runs the subclass's
`scaffold(client, env, task, settings)` coroutine, scores the environment, and returns the session's recorded token
stream as the trajectory (token ids, masks and log-probs exactly as sampled; nothing re-tokenised). A scaffold must
keep its conversation append-only: a session that splits into several segments (history rewritten) cannot be one
trajectory and ends as `env_error`.

Statuses, as in the agent loop: `ok` when the environment ended the episode; `truncated` when the scaffold ran out
of turns or of token budget (it stops before a request that could overflow `max_total_tokens`: it counts an
observation's UTF-8 bytes as an upper bound on its tokens, exact for byte-level tokenizers), or its conversation
outgrew the engine's context (the proxy's 400 `context_length_exceeded`); `timeout` on the episode's wall clock or
an engine timeout; `env_error` when the engine, the environment, the proxy or the scaffold failed (the message in
`metadata["error"]`).
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any, Callable

import openai
from aiohttp import web

from sao.models.sampling import SamplingParams
from sao.models.tokenizer import Tokenizer
from sao.rollout import agent
from sao.rollout.envs.base import Env
from sao.rollout.harnesses.base import Harness
from sao.rollout.proxy import TokenCapturingProxy
from sao.transport.trajectory import Status, Trajectory

log = logging.getLogger(__name__)

# Tokens a chat template adds around one message (role header, end-of-turn), counted on top of its content.
TEMPLATE_OVERHEAD_TOKENS = 16


class ScaffoldError(RuntimeError):
  """A scaffold cannot run this episode (e.g. the environment lacks a tool the scaffold needs)."""


@dataclasses.dataclass(frozen=True)
class ScaffoldSettings:
  """What a scaffold may spend: model turns, tokens per turn and in the whole conversation; its sampling knobs."""
  max_turns: int
  max_total_tokens: int
  max_tokens_per_turn: int
  temperature: float = 1.0
  top_p: float = 1.0
  model: str = "policy"

  def request_budget(self, last_total_tokens: int, pending_text: str) -> int:
    """`max_tokens` for the next request, or 0 when it could overflow the conversation budget.

    `last_total_tokens` is the previous response's `usage.total_tokens` (0 before the first request: then the
    prompt is `pending_text`); `pending_text` is what the scaffold appends before the request.
    """
    prompt = last_total_tokens + len(pending_text.encode("utf-8")) + TEMPLATE_OVERHEAD_TOKENS
    return max(0, min(self.max_tokens_per_turn, self.max_total_tokens - prompt))


class ProxiedHarness(Harness):
  """A scaffold behind the proxy; subclasses implement `scaffold` and `format_call`."""

  @abc.abstractmethod
  async def scaffold(self, client: openai.AsyncOpenAI, env: Env, task: dict[str, Any],
                     settings: ScaffoldSettings) -> Status:
    """Plays one episode through `client` (reset `env` first); returns `Status.OK` when the environment ended the
    episode, `Status.TRUNCATED` when the scaffold stopped for its turn or token budget. May raise."""

  async def run_episode(self, engine: agent.Engine, tokenizer: Tokenizer, env: Env, task: dict[str, Any],
                        sampling: SamplingParams, limits: agent.EpisodeLimits, *,
                        policy_version_fn: Callable[[], int] | None = None, sample_index: int = 0,
                        group_id: str = "", lease_id: str = "") -> Trajectory:
    start = time.monotonic()
    proxy = TokenCapturingProxy(engine, tokenizer, default_max_tokens=sampling.max_new_tokens, harness=self.name)
    runner = web.AppRunner(proxy.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    session_id = uuid.uuid4().hex
    client = openai.AsyncOpenAI(base_url=f"http://{host}:{port}/sessions/{session_id}/v1", api_key="sao-proxy",
                                max_retries=0, timeout=limits.timeout_s)
    settings = ScaffoldSettings(max_turns=limits.max_turns, max_total_tokens=limits.max_total_tokens,
                                max_tokens_per_turn=sampling.max_new_tokens, temperature=sampling.temperature,
                                top_p=sampling.top_p)
    status, error = Status.OK, ""
    try:
      async with asyncio.timeout(limits.timeout_s):
        status = await self.scaffold(client, env, task, settings)
    except (TimeoutError, openai.APITimeoutError) as e:
      status, error = Status.TIMEOUT, f"episode exceeded {limits.timeout_s}s ({type(e).__name__})"
    except Exception as e:  # noqa: BLE001 — a failing engine/env/scaffold fails this episode, not the worker
      if isinstance(e, openai.BadRequestError) and e.code == "context_length_exceeded":
        status = Status.TRUNCATED  # the conversation outgrew the context: the agent loop's budget stop
      else:
        status, error = Status.ENV_ERROR, f"{type(e).__name__}: {e}"
        log.warning("task %s: %s scaffold failed: %s", task.get("task_id"), self.name, error)
    finally:
      await client.close()
    reward = 0.0
    if status in (Status.OK, Status.TRUNCATED):
      try:
        reward = float(await asyncio.to_thread(env.score))
      except Exception as e:  # noqa: BLE001
        status, error = Status.ENV_ERROR, f"score() failed: {type(e).__name__}: {e}"
        log.warning("task %s: scoring failed: %s", task.get("task_id"), error)
    segments = proxy.trajectories(session_id, reward) if session_id in proxy.sessions else []
    await runner.cleanup()
    if len(segments) > 1:
      status, error = Status.ENV_ERROR, (f"the scaffold rewrote its history ({len(segments)} proxy segments: "
                                         f"{segments[-1].metadata.get('segment_reason', '')}); one trajectory "
                                         "per episode needs an append-only conversation")
    elif not segments and status in (Status.OK, Status.TRUNCATED):
      status, error = Status.ENV_ERROR, "the scaffold made no model request"
    seg = segments[-1] if segments else None
    if seg is not None and seg.status != Status.OK and status != Status.TIMEOUT:
      status = seg.status  # the proxy saw the engine fail
    metadata = {"env": str(task.get("env", "")), "stop": str(status)}
    if error:
      metadata["error"] = error[:2000]
    if seg is not None and "segment_reason" in seg.metadata:
      metadata["segment_reason"] = seg.metadata["segment_reason"]
    version = seg.policy_version if seg is not None else (policy_version_fn() if policy_version_fn else 0)
    action_tokens = float(seg.action_mask.sum()) if seg is not None else 0.0
    return Trajectory(
        task_id=str(task.get("task_id") or task.get("key") or "unknown"),
        token_ids=seg.token_ids if seg is not None else [], action_mask=seg.action_mask if seg is not None else [],
        rollout_logprobs=seg.rollout_logprobs if seg is not None else [], reward=reward, policy_version=version,
        sample_index=sample_index, group_id=group_id,
        turn_boundaries=seg.turn_boundaries if seg is not None else (),
        num_turns=seg.num_turns if seg is not None else 0, status=status, harness=self.name, lease_id=lease_id,
        timings={"generate_s": seg.timings.get("generate_s", 0.0) if seg is not None else 0.0,
                 "total_s": time.monotonic() - start},
        metrics={"num_action_tokens": action_tokens,
                 "num_tokens": float(len(seg.token_ids)) if seg is not None else 0.0},
        metadata=metadata, routed_experts=seg.routed_experts if seg is not None else None)
