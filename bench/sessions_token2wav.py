"""Token2Wav served as many real-time sessions (``python -m bench.cadence --workload
bench.sessions_token2wav``): stock, one process per session or all in one; the adapter
on one lane, on K replay lanes, or in P serving processes of K lanes each.

A session is a real-time client of the released streaming decoder
(``minicpmo-utils==1.0.6``, seeded random weights shared by every session): a voice
prompt (one of ``VOICES``, chosen by the session's seed), one 25-token chunk (+3
lookahead) per second while it speaks, ``last_chunk=True`` on a turn's final chunk, and
the stock client's re-priming at a new turn (``reset``). Its tokens come from its seed
and the chunk's position in the session, its device random stream (HiFT's noise)
from its seed, so its float32 PCM is a function of the session alone: every arm's bytes
are compared with the same session run alone on ``stock_procs`` in a fresh process.

Each session is the vendor's own object as one session sees it (``session_view``: a
shallow copy sharing the flow and HiFT modules, owning its prompt, stream and vocoder
caches), driven by the vendor's own ``Token2wav.stream()``:
  * ``StockServer`` — stock code. The stock modules keep scratch in module attributes
    (the CFM and DiT caches), so calls take one lock (moshi's server does the same per
    connection); the device generator is the session's for the call.
  * ``AdapterServer`` — one binding of the serving contract
    (``stepaudio2_token2wav``), ``binding.sessions(lanes=K)``; every chunk is one
    ``session.run``; a voice is primed once and its primed state restored at every turn
    start (``turn_key``), which is byte-identical to re-priming.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import random
import threading
from dataclasses import dataclass
from typing import Any

import torch

from duplexcadence.runtime.engine.backend import default_generator, generator_state

from bench.cadence import Arm, Chunk, SessionSpec, SessionWorkload
from bench.harness import Stream, replay
from bench.workloads import subseed
from bench.workloads import token2wav as W

MODEL_SEED = 0
VOICES = 4  # distinct voice prompts among the sessions (a voice primes once per process)
CONTRACT = "stepaudio2_token2wav"
# the trace's ``--voices five``: five voices of five prompt lengths (mel frames), the
# lengths a mixed-voice run first broke the pool with (issue 22)
FIVE_VOICES = (150, 222, 302, 388, 544)
# per lane, for the graphs of the values it holds (the adapter arms)
GRAPH_BUDGET_MIB = 1024
# the contract's session parameter ``f_prompt in 50..600`` (frames; even: 2 per token)
PROMPT_DOMAIN = (50, 600)


@dataclass(frozen=True)
class Voice:
    """A session's voice prompt: its seeded contents and its length in mel frames."""

    seed: int
    frames: int

    @property
    def params(self) -> dict:
        return {"f_prompt": self.frames}


def voice_of(spec: SessionSpec) -> Voice:
    """The trace's voice policy (``SessionSpec.voices``): the default's 4 voices of the
    vendor's 302-frame prompt; ``clone``: every session its own prompt, of a length drawn
    uniformly from the contract's domain (even frames); ``five``: ``FIVE_VOICES``."""
    if spec.voices == "clone":
        lo, hi = PROMPT_DOMAIN
        return Voice(spec.seed, 2 * random.Random(f"voice:{spec.seed}").randint(lo // 2, hi // 2))
    if spec.voices == "five":
        i = spec.seed % len(FIVE_VOICES)
        return Voice(i, FIVE_VOICES[i])
    return Voice(spec.seed % VOICES, W.PROMPT_FRAMES)


def session_tokens(spec: SessionSpec) -> list[int]:
    """The session's token ids: chunk ``seq`` reads ``[25 seq, 25 seq + 28)`` (consecutive
    calls overlap by the 3 lookahead tokens, as the stock client's buffer does)."""
    g = torch.Generator().manual_seed(subseed(spec.seed, 3))
    n = len(spec.chunks) * W.CHUNK_TOKENS + W.PRE_LOOKAHEAD
    return torch.randint(0, W.VOCAB_SIZE, (n,), generator=g).tolist()


def chunk_tokens(tokens: list[int], chunk: Chunk) -> list[int]:
    start = chunk.seq * W.CHUNK_TOKENS
    return tokens[start : start + W.CHUNK_TOKENS + W.PRE_LOOKAHEAD]


def session_view(t2w: Any, voice: Voice) -> Any:
    """The vendor object as one session sees it: the modules (weights) shared, its own
    prompt; ``stream_cache`` is set by ``prime``."""
    obj = copy.copy(t2w)
    obj.cache = W.make_prompt(voice.seed, voice.frames, t2w.bench.device)
    obj.stream_cache = None
    obj.hift_cache_dict = {}
    obj.bench = dataclasses.replace(t2w.bench)
    return obj


def prime(obj: Any) -> None:
    """What the stock client does at the start of every turn (``set_stream_cache``)."""
    obj.stream_cache, obj.hift_cache_dict = W.set_stream_cache(obj)


class _Session:
    def __init__(self, spec: SessionSpec, obj: Any) -> None:
        self.spec, self.obj = spec, obj
        self.tokens = session_tokens(spec)
        self.pool_session: Any = None
        self.rng: torch.Tensor | None = None


class StockServer:
    """Stock sessions in one process: shared weights, one call at a time.

    The stock stream cache holds *views of module buffers* (the CFM's and the DiT's
    ``att_cache_buffer``/``cnn_cache_buffer``), which the next session's call overwrites:
    serving sessions in one process therefore needs each session's cache copied out
    after its call (``_own``). Measured without that copy (bench/results/sessions_h200,
    ``stock_inproc``) every interleaved session's bytes differed from its solo run."""

    def __init__(self, arm: Arm, device: torch.device) -> None:
        self.device = torch.device(device)
        self.t2w = W.build_token2wav(seed=MODEL_SEED, device=self.device)
        self.lock = threading.Lock()
        self.served = 0

    def open(self, spec: SessionSpec) -> _Session:
        s = _Session(spec, session_view(self.t2w, voice_of(spec)))
        s.rng = generator_state(self.device, spec.seed)
        with self.lock, torch.inference_mode():
            prime(s.obj)
            _own(s.obj)
        return s

    def reset(self, s: _Session) -> None:
        with self.lock, torch.inference_mode():
            prime(s.obj)
            _own(s.obj)

    def submit(self, s: _Session, chunk: Chunk) -> dict:
        tokens = chunk_tokens(s.tokens, chunk)
        gen = default_generator(self.device)
        with self.lock, torch.inference_mode():
            gen.set_state(s.rng)  # the process has one generator: the session's for the call
            pcm = W.stream_chunk(s.obj, tokens, chunk.last_in_turn)
            _own(s.obj)
            s.rng = gen.get_state()
            self.served += 1
        return {"pcm": pcm}

    def close(self, s: _Session) -> None:
        s.obj = None

    def stats(self) -> dict:
        return {"chunks_served": self.served}


class AdapterServer:
    """Sessions on one binding of the serving contract, ``lanes`` replay lanes."""

    def __init__(self, arm: Arm, device: torch.device) -> None:
        adapter = importlib.import_module(f"duplexcadence.generated.{CONTRACT}")
        self.device = torch.device(device)
        held: list = []
        self.t2w = W.build_token2wav(
            seed=MODEL_SEED,
            device=self.device,
            before_priming=lambda t: held.append(
                # a float32 deployment: the contract's float16 variants never meet a call
                adapter.bind(
                    t, device=self.device, capture=False, progress=False, ambient=("float32",)
                )
            ),
        )
        self.binding = held[0]
        # the pool lays its lanes out for the prompt domain and captures them there
        self.pool = self.binding.sessions(
            lanes=int(arm.options.get("lanes", 1)),
            state_on=arm.options.get("state_on"),
            progress=False,
            # lanes at the prompt domain's top unless the arm serves shorter prompts only
            params_up_to=arm.options.get("params_up_to"),
            graph_budget_mib=arm.options.get("graph_budget_mib"),
        )

    def open(self, spec: SessionSpec) -> _Session:
        s = _Session(spec, None)
        s.pool_session = open_pooled(self.pool, self.t2w, voice_of(spec), spec.seed)
        s.obj = s.pool_session.obj
        return s

    def reset(self, s: _Session) -> None:
        s.pool_session.reset()

    def submit(self, s: _Session, chunk: Chunk) -> dict:
        tokens = chunk_tokens(s.tokens, chunk)
        with torch.inference_mode():
            pcm = s.pool_session.run(W.stream_chunk, s.obj, tokens, chunk.last_in_turn)
        return {"pcm": pcm}

    def close(self, s: _Session) -> None:
        s.pool_session.close()

    def stats(self) -> dict:
        return replay.sessions_record(self.binding)


_VOICE_LOCK = threading.Lock()  # one priming per voice, whoever comes first


def open_pooled(pool: Any, t2w: Any, voice: Voice, seed: int) -> Any:
    """A session of ``voice`` on ``pool`` (the pool's Session; its ``obj`` is the
    session's view of ``t2w``), at its prompt length (the contract's ``f_prompt``): the
    first session of a voice primes it and keeps the primed state as the voice's turn
    start; later ones start from that state."""
    obj = session_view(t2w, voice)
    key = ("voice", voice.seed, voice.frames)
    session = pool.open(
        obj, seed=seed, state=("hift_cache_dict",), turn_key=key, params=voice.params
    )
    with _VOICE_LOCK:
        if not pool.has_turn_start(key):
            with torch.inference_mode():
                session.prime(prime, obj)
            session.mark_turn_start()
        else:  # the voice's primed state is kept: restored at the first step
            session.reset()
    return session


def _own(obj: Any) -> None:
    """The session's stream cache as its own tensors (see StockServer)."""
    obj.stream_cache = {k: v.clone() for k, v in obj.stream_cache.items()}


def server(arm: Arm, device: Any) -> Any:
    return (AdapterServer if arm.options.get("adapter") else StockServer)(arm, device)


def _replicas(name: str, processes: int) -> Arm:
    """The SRc adapter in ``processes`` serving processes on the GPU, 2 lanes each: every
    process its own GIL and eager lock, so a new voice's capture and its eager steps
    wait only for the voices of their own process."""
    return Arm(
        name,
        "inproc",
        f"SRc adapter, {processes} serving processes on the GPU (every {processes}th"
        " session each), 2 lanes each",
        options={"adapter": True, "lanes": 2, "graph_budget_mib": GRAPH_BUDGET_MIB},
        needs_cuda=True,
        processes=processes,
    )


SESSIONS = SessionWorkload(
    name="token2wav",
    arms=(
        Arm("stock_procs", "procs", "stock, one process per session (the reference)"),
        Arm(
            "stock_inproc",
            "inproc",
            "stock sessions in one process, one lock, each session's cache copied out",
        ),
        Arm(
            "adapter_1lane",
            "inproc",
            "SRc adapter, sessions time-multiplexed on one replay lane",
            options={"adapter": True, "lanes": 1},
            needs_cuda=True,
        ),
        Arm(
            "adapter_lanes",
            "inproc",
            "SRc adapter, 8 concurrent replay lanes",
            # a lane keeps every value its graph budget fits (a value's graphs: a few
            # MiB of graph memory; the regions are the lane's), not the contract's hold 4
            options={"adapter": True, "lanes": 8, "graph_budget_mib": GRAPH_BUDGET_MIB},
            needs_cuda=True,
        ),
        _replicas("adapter_replicas", 4),
        _replicas("adapter_replicas8", 8),
        Arm(
            "adapter_lanes_hoststate",
            "inproc",
            "SRc adapter, 8 lanes, sessions' state in pinned host memory between steps",
            options={"adapter": True, "lanes": 8, "state_on": "cpu"},
            needs_cuda=True,
        ),
    ),
    reference="stock_procs",
    streams=(Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_pcm_sha256"),),
    server=server,
)
