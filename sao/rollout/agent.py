"""The multi-turn agent loop: one episode of an `Env` against an SGLang-compatible engine → one `Trajectory`.

Token stream (never re-tokenised: the engine's sampled ids go in verbatim):

  [system + user (+ tools) template tokens, ending in the generation prompt]          mask 0, log-prob 0
  repeat:
    [assistant turn: the sampled ids, a matched stop token included]                   mask 1, engine log-probs
    [eos if the turn hit max_new_tokens] + [assistant_end_ids]                         mask 0
    [tool message template + observation (+ the next generation prompt)]               mask 0

`turn_boundaries` holds the token offset where each message starts: 0, the user message (when the template renders
the prompt's messages incrementally), each assistant turn (at its generation prompt) and each tool message. The
scalar reward stays a scalar: the learner puts it on `Trajectory.reward_token_index()` (the last model token).

Stopping: the environment says done (status `ok`); `limits.max_turns` model turns or `limits.max_total_tokens`
tokens (status `truncated`; an observation that would overflow the token budget is not appended, so a trajectory
never exceeds it); `limits.timeout_s` wall-clock seconds or an engine request timeout (`timeout`); a failing engine,
environment or chat template (`env_error`, the message in `metadata["error"]`). The loop never raises for these;
timeout/env_error trajectories may lack action tokens and are not trained on (`Trajectory.is_trainable`).

Routed experts (MoE routing replay, an engine client with `return_routed_experts`): each turn's record covers the
whole stream up to that turn's last token (SGLang's rows: prompt + completion − 1), so the trajectory keeps the last
turn's; tokens after it (the closing and last observation) have no row and are never replayed.

Policy version: each turn's `meta_info.weight_version` (an integer string; else `policy_version_fn()`, else 0); the
trajectory records the minimum over its turns, so staleness is never under-reported.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Callable, Protocol, Sequence

from sao.engines.sglang_client import EngineError, EngineTimeoutError, GenerateResult
from sao.models.sampling import SamplingParams
from sao.models.tokenizer import Tokenizer
from sao.rollout import envs, tool_format
from sao.transport.trajectory import Status, Trajectory

log = logging.getLogger(__name__)


class Engine(Protocol):
  """What the loop needs from an engine (`SGLangEngine` provides it)."""

  async def generate(self, input_ids: Sequence[int], sampling_params: SamplingParams) -> GenerateResult:
    ...


class ToolSyntax(Protocol):
  """How an episode shows its tools and reads tool calls from assistant text (`sao.rollout.harnesses` has them).

  Without one the loop speaks the chat template's own tool format (`tool_format`: tools rendered by the template,
  `<tool_call>{json}</tool_call>` calls).
  """

  def present(self, messages: Sequence[dict], tool_schemas: Sequence[dict]) -> tuple[list[dict], list[dict] | None]:
    """(the first messages to render, the `tools` to give the chat template) for the env's first messages."""
    ...

  def parse_call(self, text: str, tool_schemas: Sequence[dict]) -> tool_format.ToolCall | tool_format.ToolCallError:
    ...


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
  """max_turns: model turns; max_total_tokens: the whole token stream; timeout_s: wall-clock seconds per episode."""
  max_turns: int = 32
  max_total_tokens: int = 8192
  timeout_s: float = 600.0

  def __post_init__(self):
    if self.max_turns < 1 or self.max_total_tokens < 1 or self.timeout_s <= 0:
      raise ValueError(f"EpisodeLimits: need max_turns >= 1, max_total_tokens >= 1, timeout_s > 0; got {self}")


def parse_weight_version(version: str | None) -> int | None:
  """The engine's weight version as an int (SGLang reports strings; "default" or None → None)."""
  if version is None:
    return None
  try:
    return int(version)
  except ValueError:
    return None


@dataclasses.dataclass
class TokenStream:
  """A growing token stream: ids, model-vs-context mask, log-probs (0 on context) and message boundaries.

  Shared by the agent loop's episodes and the proxy's session segments, so both record tokens the same way.
  """
  token_ids: list[int] = dataclasses.field(default_factory=list)
  action_mask: list[bool] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  boundaries: list[int] = dataclasses.field(default_factory=list)

  def append(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
    """Appends `ids`: model tokens (mask 1) when `logprobs` is given, else context tokens (mask 0, log-prob 0)."""
    self.token_ids.extend(int(i) for i in ids)
    self.action_mask.extend([logprobs is not None] * len(ids))
    self.logprobs.extend([0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs])

  def mark(self, offset: int) -> None:
    if not self.boundaries or offset > self.boundaries[-1]:
      self.boundaries.append(offset)


@dataclasses.dataclass
class _Episode(TokenStream):
  """One episode's token stream and bookkeeping (kept outside the timeout scope: a timed-out episode still returns
  what it had)."""
  versions: list[int] = dataclasses.field(default_factory=list)
  num_turns: int = 0
  length_turns: int = 0
  generate_s: float = 0.0
  tool_s: float = 0.0
  status: Status = Status.OK
  error: str = ""
  routed_experts: Any = None  # the last turn's record, int32 [rows, layers·top_k] (the engine's, when asked for)


def message_boundaries(tokenizer: Tokenizer, messages: Sequence[dict], tools: Any, prompt: Sequence[int]) -> list[int]:
  """Where each prompt message starts, when rendering the first k messages gives a token prefix of the prompt."""
  out = [0]
  for k in range(1, len(messages)):
    ids = tokenizer.apply_chat_template(messages[:k], tools=tools, add_generation_prompt=False)
    if 0 < len(ids) < len(prompt) and list(prompt[:len(ids)]) == ids:
      out.append(len(ids))
  return out


def runs_inline(env: envs.Env) -> bool:
  """True when `env`'s own class (not a base class: a subclass may do slow work in its hooks) sets
  `runs_inline = True`: its reset/step/score are pure microsecond-scale Python, so the loop calls them directly
  instead of handing each to a thread (three thread hand-offs per turn cost more than the calls themselves)."""
  return bool(vars(type(env)).get("runs_inline", False))


async def _env_call(env: envs.Env, fn: Callable[..., Any], *args: Any) -> Any:
  """`fn(*args)` (a method of `env`): on this thread if `runs_inline(env)`, else in the default executor."""
  if runs_inline(env):
    return fn(*args)
  return await asyncio.to_thread(fn, *args)


async def _play(ep: _Episode, engine: Engine, tokenizer: Tokenizer, env: envs.Env, task: dict,
                sampling: SamplingParams, limits: EpisodeLimits, policy_version_fn: Callable[[], int] | None,
                syntax: ToolSyntax | None) -> None:
  messages = await _env_call(env, env.reset, task)
  schemas = env.tool_schemas
  messages, tools = syntax.present(messages, schemas) if syntax is not None else (messages, schemas)
  prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
  ep.append(prompt)
  for b in message_boundaries(tokenizer, messages, tools, prompt):
    ep.mark(b)
  generation_prompt_len = len(tokenizer.generation_prompt_ids())
  ep.mark(len(ep.token_ids) - generation_prompt_len)
  stop_ids = tuple(sampling.stop_token_ids) or tuple(tokenizer.eos_token_ids)
  if not stop_ids:
    raise ValueError("no stop token: set sampling.stop_token_ids or use a tokenizer with an eos token")
  end_ids = tokenizer.assistant_end_ids()
  history = list(messages)
  while True:
    if ep.num_turns >= limits.max_turns:
      ep.status = Status.TRUNCATED
      return
    budget = limits.max_total_tokens - len(ep.token_ids)
    if budget <= 0:
      ep.status = Status.TRUNCATED
      return
    params = dataclasses.replace(sampling, max_new_tokens=min(sampling.max_new_tokens, budget),
                                 stop_token_ids=stop_ids)
    start = time.monotonic()
    result = await engine.generate(ep.token_ids, params)
    ep.generate_s += time.monotonic() - start
    if result.finish_reason == "abort" or not result.token_ids:
      raise EngineError("/generate", f"the engine returned no tokens (finish {result.finish_detail or 'empty'})")
    if len(result.logprobs) != len(result.token_ids):
      raise EngineError("/generate", "token ids and log-probs differ in length")
    if result.routed_experts is not None:
      rows = len(ep.token_ids) + len(result.token_ids) - 1
      if len(result.routed_experts) != rows:
        raise EngineError("/generate", f"routed_experts: {len(result.routed_experts)} rows for a stream of {rows} "
                          "fed tokens")
      ep.routed_experts = result.routed_experts
    ep.append(result.token_ids, result.logprobs)
    ep.num_turns += 1
    version = parse_weight_version(result.weight_version)
    if version is None:
      version = policy_version_fn() if policy_version_fn is not None else 0
    ep.versions.append(version)
    ended_on_stop = result.finish_reason == "stop" and result.token_ids[-1] in stop_ids
    ep.length_turns += not ended_on_stop
    text = tokenizer.decode(result.token_ids[:-1] if ended_on_stop else result.token_ids)
    # Malformed → ToolCallError → an error observation from env.step.
    call = syntax.parse_call(text, schemas) if syntax is not None else tool_format.parse_tool_call(text, tools)
    start = time.monotonic()
    observation, done = await _env_call(env, env.step, call)
    ep.tool_s += time.monotonic() - start
    # Close the assistant turn as the template would: a turn cut by max_new_tokens gets its stop token (mask 0).
    closing = ([] if ended_on_stop else [stop_ids[0]]) + list(end_ids)
    history.append({"role": "assistant", "content": text})
    tool_message = {"role": "tool", "content": observation}
    obs_ids = tokenizer.render_message_ids(tool_message, history=history, tools=tools, add_generation_prompt=not done)
    history.append(tool_message)
    if len(ep.token_ids) + len(closing) + len(obs_ids) > limits.max_total_tokens:
      ep.status = Status.TRUNCATED
      return
    ep.append(closing)
    ep.mark(len(ep.token_ids))
    ep.append(obs_ids)
    if done:
      return
    ep.mark(len(ep.token_ids) - generation_prompt_len)


async def run_episode(engine: Engine, tokenizer: Tokenizer, env: envs.Env, task: dict,
                      sampling: SamplingParams = SamplingParams(), limits: EpisodeLimits = EpisodeLimits(),
                      policy_version_fn: Callable[[], int] | None = None, *, sample_index: int = 0,
                      group_id: str = "", harness: str = "sao", lease_id: str = "",
                      syntax: ToolSyntax | None = None) -> Trajectory:
  """Plays `task` in `env` (reset here) with the engine; returns the trajectory. Never raises for engine,
  environment, template or timeout failures (they become the status); see the module docstring. `harness` labels
  the trajectory; `syntax` is its tool-call text format (None: the chat template's own)."""
  ep = _Episode()
  start = time.monotonic()
  try:
    async with asyncio.timeout(limits.timeout_s):
      await _play(ep, engine, tokenizer, env, task, sampling, limits, policy_version_fn, syntax)
  except TimeoutError:
    ep.status, ep.error = Status.TIMEOUT, f"episode exceeded {limits.timeout_s}s"
  except EngineTimeoutError as e:
    ep.status, ep.error = Status.TIMEOUT, str(e)
  except EngineError as e:
    ep.status, ep.error = Status.ENV_ERROR, str(e)
    log.warning("task %s: engine failed after %d turns: %s", task.get("task_id"), ep.num_turns, e)
  except Exception as e:  # noqa: BLE001 — an environment/template bug fails this episode, not the worker
    ep.status, ep.error = Status.ENV_ERROR, f"{type(e).__name__}: {e}"
    log.exception("task %s: episode failed after %d turns", task.get("task_id"), ep.num_turns)
  reward = 0.0
  if ep.status in (Status.OK, Status.TRUNCATED):
    try:
      reward = float(await _env_call(env, env.score))
    except Exception as e:  # noqa: BLE001
      ep.status, ep.error = Status.ENV_ERROR, f"score() failed: {type(e).__name__}: {e}"
      log.exception("task %s: scoring failed", task.get("task_id"))
  if ep.versions:
    version = min(ep.versions)
  else:
    version = policy_version_fn() if policy_version_fn is not None else 0
  metadata = {"env": str(task.get("env", "")), "stop": str(ep.status)}
  if ep.error:
    metadata["error"] = ep.error[:2000]
  return Trajectory(
      task_id=str(task.get("task_id") or task.get("key") or "unknown"), token_ids=ep.token_ids,
      action_mask=ep.action_mask, rollout_logprobs=ep.logprobs, reward=reward, policy_version=version,
      sample_index=sample_index, group_id=group_id, turn_boundaries=tuple(ep.boundaries), num_turns=ep.num_turns,
      status=ep.status, harness=harness, lease_id=lease_id,
      timings={"generate_s": ep.generate_s, "tool_s": ep.tool_s, "total_s": time.monotonic() - start},
      metrics={"num_action_tokens": float(sum(ep.action_mask)), "num_tokens": float(len(ep.token_ids)),
               "length_capped_turns": float(ep.length_turns),
               "policy_version_max": float(max(ep.versions)) if ep.versions else float(version)},
      metadata=metadata, routed_experts=ep.routed_experts)


async def run_episodes(engine: Engine, tokenizer: Tokenizer, env_factory: str | Callable[[], envs.Env],
                       tasks: Sequence[dict], sampling: SamplingParams = SamplingParams(),
                       limits: EpisodeLimits = EpisodeLimits(), concurrency: int = 64,
                       policy_version_fn: Callable[[], int] | None = None, harness: str = "sao") -> list[Trajectory]:
  """Runs one episode per task, at most `concurrency` at once, each with its own environment from `env_factory`
  (an env name for `envs.make`, or a zero-argument factory). Returns trajectories in task order."""
  if concurrency < 1:
    raise ValueError(f"concurrency: must be >= 1, got {concurrency}")
  make_env = (lambda: envs.make(env_factory)) if isinstance(env_factory, str) else env_factory
  gate = asyncio.Semaphore(concurrency)

  async def one(task: dict) -> Trajectory:
    async with gate:
      return await run_episode(engine, tokenizer, make_env(), task, sampling, limits, policy_version_fn,
                               harness=harness)

  return list(await asyncio.gather(*(one(t) for t in tasks)))
