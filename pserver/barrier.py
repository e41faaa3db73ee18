"""Step barriers for `train.sgd = "sync"` and the step ledger behind `"bounded"` staleness.

Sync: a shard applies step k only when every participating trainer's step-k delta has
arrived (trainers send every shard a delta for every push group, empty ones included, so a
shard sees every step of every trainer). Participants are the trainers whose membership
lease is alive *and* whose deltas keep coming (one silent for `idle_s`, e.g. between tasks or
out of work, stops holding others back): a trainer whose lease expires leaves the barrier.
A delta for a step already released (a trainer that was away) is applied at once.

Bounded: nothing waits here; the shard reports the newest step seen per trainer and each
trainer waits while it is more than `staleness` steps ahead of the slowest participant.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from streamtrain.schemas import GradientDelta


@dataclass
class _Seen:
    step: int
    at: float


@dataclass
class StepBarrier:
    sync: bool
    idle_s: float = 5.0
    next_step: int = 0  # every step below it is released
    live: set[str] = field(default_factory=set)
    seen: dict[str, _Seen] = field(default_factory=dict)
    _waiting: dict[int, list[tuple[int, GradientDelta]]] = field(default_factory=lambda: defaultdict(list))

    def offer(self, delta: GradientDelta, offset: int) -> list[GradientDelta]:
        """Take a delta; returns those that may be applied now, in order."""
        previous = self.seen.get(delta.trainer_id)
        self.seen[delta.trainer_id] = _Seen(max(delta.step, previous.step if previous else -1), time.monotonic())
        if not self.sync or delta.step < self.next_step:
            return [delta] + (self.release() if self.sync else [])
        self._waiting[delta.step].append((offset, delta))
        return self.release()

    def participants(self) -> set[str]:
        now = time.monotonic()
        return {t for t, s in self.seen.items() if t in self.live and now - s.at < self.idle_s}

    def release(self) -> list[GradientDelta]:
        """Deltas of every step all participants have reached, step by step."""
        out: list[GradientDelta] = []
        while self._waiting:
            members = self.participants()
            if any(self.seen[t].step < self.next_step for t in members):
                break
            out += [d for _, d in self._waiting.pop(self.next_step, [])]
            # With nobody left to wait for, skip straight to the oldest waiting step.
            self.next_step = self.next_step + 1 if members else min(self._waiting, default=self.next_step)
        return out

    def applied_below(self, consumed: int) -> int:
        """The offset below which every delta is applied, given that those below `consumed`
        are consumed: deltas waiting here are consumed but not applied (a checkpoint resumes
        there; the dedup ledger folds only below it)."""
        return min((o for waiting in self._waiting.values() for o, _ in waiting), default=consumed)

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    def steps(self) -> dict[str, int]:
        return {t: s.step for t, s in self.seen.items() if t in self.participants()}
