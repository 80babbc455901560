"""Token2Wav served as many sessions: stock in one process, stock alone, and the adapter.

A session is a real-time client of the released streaming decoder: a voice prompt,
turns of 25-token chunks (each turn ends with the stock client's ``last_chunk=True``
call and the next one starts by re-priming, as the stock client does), one device
random stream (HiFT's noise). What identifies it (``SessionSpec``) fixes every input,
so any arm can replay it and its PCM can be compared byte for byte with the same
session run alone on stock code.

Each session is the vendor's own object seen per session (``session_view``: a
shallow copy that shares the flow and HiFT modules — the weights — and owns its prompt
cache, stream cache and vocoder cache), driven by the vendor's own ``stream()``:
  * ``StockServer``: stock code, sessions in one process. The stock modules keep
    scratch in module attributes (the CFM and DiT caches), so concurrent calls would
    corrupt each other: calls take one lock, as moshi's server does per connection.
  * ``AdapterServer``: one binding of a contract, ``binding.sessions(lanes=K)``; every
    session steps through ``session.run``; a voice's primed state is kept once and
    restored at every turn start (``turn_key``).
  * ``solo_stock``: one session alone on a freshly built stock model: the reference.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bench.workloads import subseed
from bench.workloads import token2wav as W


@dataclass(frozen=True)
class SessionSpec:
    """Everything that fixes a session's inputs."""

    seed: int  # its device random stream, and the seed of its tokens
    voice: int  # the seed of its voice prompt (sessions may share a voice)
    turns: tuple[int, ...]  # chunks per turn (each turn ends with last_chunk=True)
    prompt_frames: int = W.PROMPT_FRAMES

    def tokens(self, turn: int) -> list[W.TokenChunk]:
        return W.token_stream(subseed(self.seed, 4 + turn), self.turns[turn])


def session_view(t2w: Any, spec: SessionSpec) -> Any:
    """The vendor object as one session sees it: the model's modules (weights) shared,
    its own prompt; ``stream_cache`` is set by ``prime``."""
    obj = copy.copy(t2w)
    obj.cache = W.make_prompt(spec.voice, spec.prompt_frames, t2w.bench.device)
    obj.stream_cache = None
    obj.hift_cache_dict = {}
    obj.bench = dataclasses.replace(t2w.bench, prompt_frames=spec.prompt_frames)
    return obj


def prime(obj: Any) -> None:
    """What the stock client does at the start of every turn (``set_stream_cache``)."""
    obj.stream_cache, obj.hift_cache_dict = W.set_stream_cache(obj)


def seed_device_rng(seed: int, device: torch.device) -> None:
    torch.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def pcm_bytes(pcm: np.ndarray) -> bytes:
    return np.ascontiguousarray(pcm, dtype=np.float32).tobytes()


def solo_stock(spec: SessionSpec, model_seed: int, device: Any) -> str:
    """SHA-256 of the session's float32 PCM, run alone on a freshly built stock model."""
    t2w = W.build_token2wav(seed=model_seed, device=device)
    obj = session_view(t2w, spec)
    digest = hashlib.sha256()
    with torch.inference_mode():
        seed_device_rng(spec.seed, torch.device(device))
        for turn in range(len(spec.turns)):
            prime(obj)
            for chunk in spec.tokens(turn):
                digest.update(pcm_bytes(W.stream_chunk(obj, chunk.tokens, chunk.last_chunk)))
    return digest.hexdigest()


class _Handle:
    def __init__(self, spec: SessionSpec, obj: Any, session: Any = None) -> None:
        self.spec = spec
        self.obj = obj
        self.session = session
        self.turn = -1
        self.digest = hashlib.sha256()

    def sha256(self) -> str:
        return self.digest.hexdigest()


class StockServer:
    """Stock sessions in one process: shared weights, one call at a time."""

    def __init__(self, model_seed: int, device: Any) -> None:
        self.device = torch.device(device)
        self.t2w = W.build_token2wav(seed=model_seed, device=device)
        self._lock = threading.Lock()
        self._rng: dict[int, torch.Tensor] = {}

    def open(self, spec: SessionSpec) -> _Handle:
        return _Handle(spec, session_view(self.t2w, spec))

    def start_turn(self, h: _Handle) -> None:
        h.turn += 1
        with self._lock:
            prime(h.obj)

    def chunk(self, h: _Handle, index: int) -> np.ndarray:
        c = h.spec.tokens(h.turn)[index]
        with self._lock, torch.inference_mode():
            # the session's own device random stream: the process has one generator
            gen = _device_generator(self.device)
            gen.set_state(self._rng.get(id(h), _seeded_state(h.spec.seed, self.device)))
            pcm = W.stream_chunk(h.obj, c.tokens, c.last_chunk)
            self._rng[id(h)] = gen.get_state()
        h.digest.update(pcm_bytes(pcm))
        return pcm

    def close(self, h: _Handle) -> None:
        self._rng.pop(id(h), None)


class AdapterServer:
    """Sessions on one binding of ``contract`` served by ``lanes`` replay lanes."""

    def __init__(
        self,
        model_seed: int,
        device: Any,
        lanes: int = 1,
        contract: str = "stepaudio2_token2wav",
        progress: bool = False,
    ) -> None:
        adapter = importlib.import_module(f"duplexcadence.generated.{contract}")
        self.device = torch.device(device)
        held: list = []
        self.t2w = W.build_token2wav(
            seed=model_seed,
            device=device,
            before_priming=lambda t: held.append(
                adapter.bind(t, device=device, capture=False, progress=progress)
            ),
        )
        self.binding = held[0]
        self.binding.capture(progress=progress)
        self.pool = self.binding.sessions(lanes=lanes, progress=progress)

    def open(self, spec: SessionSpec) -> _Handle:
        obj = session_view(self.t2w, spec)
        key = ("voice", spec.voice, spec.prompt_frames)
        session = self.pool.open(obj, seed=spec.seed, state=("hift_cache_dict",), turn_key=key)
        if not self.pool.has_turn_start(key):
            with torch.inference_mode():
                session.prime(prime, obj)
            session.mark_turn_start()
        return _Handle(spec, obj, session)

    def start_turn(self, h: _Handle) -> None:
        h.turn += 1
        if h.turn > 0:
            h.session.reset()

    def chunk(self, h: _Handle, index: int) -> np.ndarray:
        c = h.spec.tokens(h.turn)[index]
        with torch.inference_mode():
            pcm = h.session.run(W.stream_chunk, h.obj, c.tokens, c.last_chunk)
        h.digest.update(pcm_bytes(pcm))
        return pcm

    def close(self, h: _Handle) -> None:
        h.session.close()


def _device_generator(device: torch.device) -> torch.Generator:
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index or torch.cuda.current_device()]
    return torch.default_generator


def _seeded_state(seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device=device) if device.type == "cuda" else torch.Generator()
    g.manual_seed(seed)
    return g.get_state()
