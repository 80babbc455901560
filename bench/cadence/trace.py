"""A seeded trace of real-time sessions: who arrives when, and which chunk comes when.

Session ``i`` of a trace depends only on (trace seed, ``i``) and the trace settings, not
on how many sessions run beside it, so a session's bytes can be compared across N and
against its solo reference. A session arrives (opens) at ``arrival_s`` (uniform in the
ramp), then speaks in turns: a turn of ``n`` chunks (uniform in ``turn_chunks``) sends
one chunk per ``period_s`` (one second of audio per chunk for a real-time client), its
first chunk one period after the turn starts (after the session opens, for turn 0);
turns are separated by silences (uniform in ``silence_s``) and a turn after the first
starts with a reset (new turn: the stock client's re-priming) with probability
``p_reset``. Chunks stop at ``duration_s``. ``voices`` says how sessions' voices vary:
``default`` (the workload's few voices), ``clone`` (every session its own voice, as a
voice-cloning service sees them) or ``five`` (five fixed voices, of five sizes); each
workload maps it to its own parameters (Token2Wav: the voice prompt's length).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Chunk:
    session: int  # session index in the trace
    turn: int  # turn index in the session
    k: int  # chunk index in the turn (0: the turn's first packet)
    seq: int  # chunk index in the session (what the workload's inputs are indexed by)
    arrival_s: float  # when the client sends it, from the trace start
    last_in_turn: bool
    reset: bool  # the turn starts with a reset (only on k == 0)


@dataclass(frozen=True)
class SessionSpec:
    index: int
    seed: int  # the session's own seed (its inputs; the workload's weights are shared)
    arrival_s: float
    chunks: tuple[Chunk, ...]
    voices: str = "default"  # the trace's voice policy (TraceSettings.voices)

    @property
    def turns(self) -> int:
        return len({c.turn for c in self.chunks})


@dataclass(frozen=True)
class TraceSettings:
    seed: int = 0
    duration_s: float = 60.0
    period_s: float = 1.0
    ramp_s: float = 10.0
    turn_chunks: tuple[int, int] = (3, 12)
    silence_s: tuple[float, float] = (1.0, 4.0)
    p_reset: float = 0.5
    voices: str = "default"


VOICE_POLICIES = ("default", "clone", "five")


def session(settings: TraceSettings, index: int) -> SessionSpec:
    """Session ``index`` of the trace (independent of every other session)."""
    s = settings
    rng = random.Random(f"{s.seed}:{index}")
    arrival = rng.uniform(0.0, s.ramp_s)
    chunks: list[Chunk] = []
    start, turn = arrival, 0
    while True:
        n = rng.randint(*s.turn_chunks)
        reset = turn > 0 and rng.random() < s.p_reset
        times = [start + (k + 1) * s.period_s for k in range(n)]
        times = [t for t in times if t < s.duration_s]
        for k, t in enumerate(times):
            last = k == n - 1
            chunks.append(Chunk(index, turn, k, len(chunks), t, last, reset and k == 0))
        if len(times) < n:
            break
        start, turn = times[-1] + rng.uniform(*s.silence_s), turn + 1
    return SessionSpec(index, rng.randrange(2**31), arrival, tuple(chunks), s.voices)


def trace(settings: TraceSettings, n_sessions: int) -> list[SessionSpec]:
    return [session(settings, i) for i in range(n_sessions)]
