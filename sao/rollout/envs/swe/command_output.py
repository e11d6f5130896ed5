"""What a sandboxed command gives back: its merged output kept within a byte bound, and the `CommandResult`.

A command may print without limit; the sandbox (`sao.rollout.envs.swe.sandbox`) keeps at most `limit` bytes of it:
the first `limit // 2` bytes and the last bytes up to `limit` in all, with a marker naming how many bytes were left
out in between. Memory stays bounded while the command runs: `BoundedOutput` holds at most `limit // 2` head bytes
and `limit` tail bytes (`add` drops the oldest tail bytes), however much the command prints.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CommandResult:
  """What a command did: its (possibly truncated) output, exit code (None if killed), timing, and `limit`: "" or
  the episode limit that killed it ("disk": the repository outgrew `disk_mb`; the sandbox is then spent)."""
  output: str
  exit_code: int | None
  timed_out: bool = False
  truncated: bool = False
  duration_s: float = 0.0
  limit: str = ""

  def observation(self) -> str:
    """The text an agent sees: the output, then a line on a non-zero exit or a timeout."""
    text = self.output
    if self.limit:
      text += f"\n[command killed: {self.limit} limit of the episode exceeded]"
    elif self.timed_out:
      text += f"\n[command timed out after {self.duration_s:.0f}s and was killed]"
    elif self.exit_code:
      text += f"\n[exit code {self.exit_code}]"
    return text


class BoundedOutput:
  """A command's output as it arrives, kept to its first `limit // 2` bytes (`head`) and at most its last `limit`
  bytes (`tail`); `total` counts every byte. `text()` cuts it to `limit` bytes."""

  def __init__(self, limit: int):
    self.limit = limit
    self.head, self.tail, self.total = bytearray(), bytearray(), 0

  def add(self, chunk: bytes) -> None:
    self.total += len(chunk)
    room = self.limit // 2 - len(self.head)
    if room > 0:
      self.head.extend(chunk[:room])
      chunk = chunk[room:]
    if chunk:
      self.tail.extend(chunk)
      if len(self.tail) > self.limit:  # keep memory bounded however much the command prints
        del self.tail[:len(self.tail) - self.limit]

  def text(self) -> tuple[str, bool]:
    """(the output as text, whether bytes were left out)."""
    return _truncate(bytes(self.head), bytes(self.tail), self.total, self.limit)


def _truncate(head: bytes, tail: bytes, total: int, limit: int) -> tuple[str, bool]:
  if total <= limit:
    return (head + tail).decode("utf-8", "replace"), False
  kept_tail = tail[-(limit - len(head)):] if limit > len(head) else b""
  omitted = total - len(head) - len(kept_tail)
  marker = f"\n[... output truncated: {omitted} bytes omitted ...]\n"
  return head.decode("utf-8", "replace") + marker + kept_tail.decode("utf-8", "replace"), True
