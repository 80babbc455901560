"""A small session workload for the cadence harness tests (``bench.cadence``): a tiny
torch module with a per-session carry, whose chunk costs a few milliseconds on a CPU.

Each session's input for chunk ``seq`` comes from its own seed; the carry advances
every chunk and is zeroed by ``reset``. Arms: ``stock_procs`` (one process per
session, the reference), ``stock_inproc`` (sessions in one process, one lock),
``stock_replicas`` (the same in two processes, every other session each),
``forgetful_inproc`` (ignores resets: its bytes differ wherever a turn resets).
"""

from __future__ import annotations

import threading

import torch

from bench.cadence import Arm, Chunk, SessionSpec, SessionWorkload
from bench.harness import Stream

WIDTH, DEPTH = 64, 12  # a few ms per chunk on one CPU thread


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(DEPTH, WIDTH, WIDTH, generator=g) / 8)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
        h = x + carry
        for w in self.w:
            h = torch.tanh(h @ w)
        return h


class Server:
    def __init__(self, arm: Arm, device: torch.device) -> None:
        self.model, self.device = Model().to(device), device
        self.lock = threading.Lock()
        self.forget = arm.options.get("forget_resets", False)
        self.served = 0

    def open(self, spec: SessionSpec) -> dict:
        g = torch.Generator().manual_seed(spec.seed)
        inputs = torch.randn(len(spec.chunks), 8, WIDTH, generator=g)
        return {"inputs": inputs, "carry": torch.zeros(8, WIDTH, device=self.device)}

    def submit(self, session: dict, chunk: Chunk) -> dict:
        with self.lock:
            y = self.model(session["inputs"][chunk.seq].to(self.device), session["carry"])
            session["carry"] = y[:, :WIDTH].clone()
            self.served += 1
            return {"pcm": y.cpu()}

    def reset(self, session: dict) -> None:
        if not self.forget:
            session["carry"].zero_()

    def close(self, session: dict) -> None:
        session.clear()

    def stats(self) -> dict:
        return {"chunks_served": self.served}


SESSIONS = SessionWorkload(
    name="fake_sessions",
    arms=(
        Arm("stock_procs", "procs", "one process per session"),
        Arm("stock_inproc", "inproc", "all sessions in one process, one lock"),
        Arm("stock_replicas", "inproc", "every other session in each of 2 processes", processes=2),
        Arm("forgetful_inproc", "inproc", "ignores resets", options={"forget_resets": True}),
    ),
    reference="stock_procs",
    streams=(Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_pcm_sha256"),),
    server=Server,
)
