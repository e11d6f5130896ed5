"""The task dispenser's live leases and the samples they hold (`sao.transport.dispenser.TaskDispenser`'s lease
bookkeeping; the dispenser decides what to lease, this table only records what is leased).

A lease is live from `add` until it expires (`pop_expired`) or every sample it holds has left it (`settle`: accepted,
or rejected for good). The table keeps the number of samples the live leases hold and have not had accepted
(their `Lease.pending`), by group and in all, up to date as leases change, so flow control reads it in
O(len(excluding)) (`leased_samples`), not O(leases) per lease call. Invariant: `leased_samples()` ==
Σ len(lease.pending) over the live leases.

Not thread-safe: the dispenser calls it under its lock.
"""
from __future__ import annotations

import collections
from typing import Iterable, Iterator

from sao.transport.leases import Lease


class LeaseTable:
  """Live leases by id, with their pending samples counted per group (module docstring)."""

  def __init__(self):
    self._leases: dict[str, Lease] = {}
    self._pending_by_group: collections.Counter[str] = collections.Counter()
    self._pending_total = 0

  def __len__(self) -> int:
    return len(self._leases)

  def __iter__(self) -> Iterator[Lease]:
    """The live leases, in issue order."""
    return iter(list(self._leases.values()))

  def get(self, lease_id: str) -> Lease | None:
    """The live lease `lease_id`; None when it is unknown, expired or ended."""
    return self._leases.get(lease_id)

  def add(self, lease: Lease) -> None:
    """Makes `lease` live, counting its `pending` samples. ValueError if a live lease has its id."""
    if lease.lease_id in self._leases:
      raise ValueError(f"lease_id {lease.lease_id!r}: a live lease already has this id")
    self._leases[lease.lease_id] = lease
    self._count(lease.group_id, len(lease.pending))

  def set_pending(self, lease: Lease, pending: Iterable[int]) -> None:
    """Replaces live `lease`'s pending samples (a restored lease whose other samples were accepted before the
    checkpoint), keeping the counts."""
    if self._leases.get(lease.lease_id) is not lease:
      raise ValueError(f"lease {lease.lease_id!r} is not live in this table")
    pending = set(pending)
    self._count(lease.group_id, len(pending) - len(lease.pending))
    lease.pending = pending

  def settle(self, lease: Lease, sample_index: int) -> None:
    """`sample_index` leaves `lease.pending` (accepted, or rejected for good); a live lease with nothing pending
    ends. A no-op for an index not pending; a lease no longer live only loses the index (it is not counted)."""
    if sample_index not in lease.pending:
      return
    lease.pending.discard(sample_index)
    if self._leases.get(lease.lease_id) is lease:
      self._count(lease.group_id, -1)
      if not lease.pending:
        del self._leases[lease.lease_id]

  def pop_expired(self, now: float) -> list[Lease]:
    """Removes and returns the leases due at `now` (`expires_at <= now`), in issue order. A lease with a submission
    in flight (`Lease.submitting`) is held: it stays live until that submission ends and a later call finds it
    still due."""
    due = [lease for lease in self._leases.values() if lease.expires_at <= now and not lease.submitting]
    for lease in due:
      del self._leases[lease.lease_id]
      self._count(lease.group_id, -len(lease.pending))
    return due

  def leased_samples(self, excluding: Iterable[str] = ()) -> int:
    """Σ len(lease.pending) over the live leases, leaving out the groups in `excluding`. O(len(excluding))."""
    return self._pending_total - sum(self._pending_by_group.get(group_id, 0) for group_id in excluding)

  def _count(self, group_id: str, delta: int) -> None:
    self._pending_total += delta
    self._pending_by_group[group_id] += delta
    if self._pending_by_group[group_id] <= 0:
      del self._pending_by_group[group_id]
