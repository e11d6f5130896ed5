"""One row's failure kept from its batch-mates: the local engine's batch run with a per-row fallback.

The engine (`sao.engines.local_engine`) runs the rows waiting for a batch as ONE Sampler call. Rows are validated
before they are queued (`sao.engines.request_checks`), but if that call still raises, or returns a row whose
log-probs are not finite (not valid JSON, `bad_completion`), the rows that did not come back clean are re-run one
at a time, each with its own seed: each outcome is then the row's own — a `Completion`, or the exception the row
fails with alone (`RowFailedError` for an unusable completion; its request gets HTTP 500). Batch-mates never see
another row's failure; `stats["isolated_batches"]` counts the batches whose call raised.
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from sao.models.sampling import Completion

log = logging.getLogger(__name__)


class RowFailedError(RuntimeError):
  """One row failed inside the sampler even when run alone (its request gets 500; its batch-mates are unaffected)."""


def bad_completion(c: Completion) -> str | None:
  """Why a completion must not be returned (None if it is fine): non-finite log-probs are not valid JSON."""
  if not np.all(np.isfinite(c.logprobs)):
    return f"the sampler returned non-finite log-probs {c.logprobs[~np.isfinite(c.logprobs)][:4].tolist()}"
  return None


async def run_isolated(batch: Sequence[Any], sample: Callable[[Sequence[Any]], Awaitable[list[Completion]]],
                       stats: dict[str, Any]) -> list[Completion | BaseException]:
  """One `sample(batch)` call; if it raises or returns an unusable row, the affected rows are re-run one at a time
  (`sample([row])`), so each outcome is the row's own (a Completion, or the exception it fails with alone).

  `batch`: the engine's queued rows (each with the `future` its caller awaits: a row whose future is already done
  is not re-run); `sample(rows)`: one Sampler call on `rows` with a fresh seed, in order; `stats`: the engine's
  counters (`isolated_batches`)."""
  outcomes: list[Completion | BaseException | None] = [None] * len(batch)
  try:
    completions = await sample(batch)
  except Exception as e:  # noqa: BLE001 — which row caused it is found by re-running them one by one
    if len(batch) == 1:
      log.exception("engine row failed")
      return [e]
    log.warning("engine batch of %d rows failed (%s: %s); re-running its rows one at a time", len(batch),
                type(e).__name__, e)
    stats["isolated_batches"] += 1
  else:
    for k, c in enumerate(completions):
      why = bad_completion(c)
      outcomes[k] = c if why is None else RowFailedError(why)
    if len(batch) == 1 or not any(isinstance(o, BaseException) for o in outcomes):
      return outcomes  # type: ignore[return-value]
  for k, r in enumerate(batch):  # rows that did not come back clean, alone (each with its own seed)
    if isinstance(outcomes[k], Completion) or r.future.done():
      continue
    try:
      (c,) = await sample([r])
    except Exception as e:  # noqa: BLE001 — this row's own failure: its request gets it (500)
      log.exception("engine row %d of %d failed alone", k, len(batch))
      outcomes[k] = e
      continue
    why = bad_completion(c)
    outcomes[k] = c if why is None else RowFailedError(why)
    if why is not None:
      log.error("engine row %d of %d: %s", k, len(batch), why)
  return [RowFailedError("cancelled") if o is None else o for o in outcomes]
