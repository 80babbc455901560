"""Moshi served as many sessions on one binding (one process, the vendor serves one).

Moshi keeps a stream's state inside its modules (every streaming module's
``_streaming_state``: the LM and Mimi ring KV caches, conv states, the LMGen delay
cache, host step counters), so a session's state is that set of objects, swapped in
place around every step (``runtime/trees.SharedState``) on one replay lane — the
modules are one set. Each session is a client of the server's loop: a connection
starts with ``mimi.reset_streaming(); lm_gen.reset_streaming()`` (server.py) and then
sends one 80 ms frame at a time (``step_frame``, the server's loop body). A session's
inputs are fixed by its seed (``pcm_stream``); its outputs (token IDs and float32 PCM)
hash to the same bytes as the session run alone on the unbound stock model
(``solo_stock``, eager, the vendor's graphs off).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from bench.workloads import moshi as W


def connect(mimi: Any, lm_gen: Any) -> None:
    """What the server does for each new connection: reset every streaming state."""
    mimi.reset_streaming()
    lm_gen.reset_streaming()


def state_roots(mimi: Any, lm_gen: Any):
    """The objects that hold one stream's state: the streaming state of every module
    (``LMGen.get_streaming_state()`` does not reach the LM's own transformer states,
    which LMGen enters through its exit stack, so every submodule is asked)."""

    def roots() -> list:
        return [
            m._streaming_state
            for top in (mimi, lm_gen)
            for m in top.modules()
            if getattr(m, "_streaming_state", None) is not None
        ]

    return roots


def digest_frame(digest: Any, tokens: list, pcm: list) -> None:
    for t, p in zip(tokens, pcm):
        digest.update(np.asarray(t[0, :, 0].cpu().tolist(), dtype=np.int64).tobytes())
        digest.update(p.detach().float().cpu().numpy().tobytes())


def solo_stock(mimi: Any, lm_gen: Any, seed: int, n_frames: int) -> str:
    """SHA-256 of one session's token IDs and PCM on the unbound stock model."""
    digest = hashlib.sha256()
    connect(mimi, lm_gen)
    for chunk in W.pcm_stream(seed, n_frames):
        tokens, pcm = W.step_frame(mimi, lm_gen, chunk)
        digest_frame(digest, tokens, pcm)
    return digest.hexdigest()


class MoshiAdapterServer:
    """Sessions on the generated Moshi adapter, one lane."""

    def __init__(self, mimi: Any, lm_gen: Any, device: Any, progress: bool = False) -> None:
        self.mimi, self.lm_gen = mimi, lm_gen
        with W.no_vendor_graphs():
            self.binding = W.bind_adapter(mimi, lm_gen, device, progress=progress)
        self.pool = self.binding.sessions(lanes=1, progress=progress)
        self.roots = state_roots(mimi, lm_gen)

    def open(self, seed: int, n_frames: int) -> Any:
        session = self.pool.open(None, seed=seed, shared=self.roots, name=f"moshi-{seed}")
        session.run(connect, self.mimi, self.lm_gen)
        session.digest = hashlib.sha256()
        session.frames = W.pcm_stream(seed, n_frames)
        session.sent = 0
        return session

    def frame(self, session: Any) -> None:
        chunk = session.frames[session.sent]
        session.sent += 1
        with W.no_vendor_graphs():
            tokens, pcm = session.run(W.step_frame, self.mimi, self.lm_gen, chunk)
        digest_frame(session.digest, tokens, pcm)

    def close(self, session: Any) -> None:
        session.close()
