"""AS2D (seeds/001: audio speculative decoding) over transformers 4.57.6 Whisper, and the
loops it is measured against, written over the vendor's own forwards (issue 25).

Everything here drives ``bench.workloads.transformers_whisper``'s ``Request`` (one
utterance on a model's static cache: encode, prefill, ``decode(tokens, position)``): the
target at large-v3's shape and a drafter at ``SHAPES["draft"]`` (its own encoder over the
same audio, large-v3's vocabulary). A request commits ``n`` token IDs, the first from the
prefill; three ways of getting the rest, one loop (``decode_request``):

* ``Alone``: the target only, one width-1 call per token (greedy decoding).
* ``Serial``: speculative decoding as the vendor's ``generate(assistant_model=...)`` does
  it: each round the drafter catches up on the tokens the target committed (one call of
  width a + 1) and drafts ``budget`` tokens one call each, then the target verifies them
  (width budget + 1). Drafting waits for verification and verification for drafting.
* ``Decoupled`` (AS2D): a producer thread runs the drafter on its own CUDA stream from
  the audio and its own history only, never the target's, and publishes batches of 8
  into an append-only ``Channel`` (a batch is ready when its copy's CUDA event has
  completed: events, no locks); each round the target verifies the ready candidates at
  the cursor (up to ``budget``; none ready: a width-1 step) and the cursor follows the
  committed tokens through the drafter's sequence (``Decoupled.observe``).

Whatever the candidates, the target commits its own argmax at every position (greedy
verification: the matching prefix and its correction; a rejected entry of the static
cache is past the committed end, masked, and overwritten by the next round: the cut-back
is the position counter). A round's width depends on readiness, i.e. on timing; a
``Transcript`` records it per round (``schedule``: the channel's), and a channel opened
with ``replay=schedule`` replays a recorded run without a thread: the exactness check runs
a live graphed request and its eager replay on the same schedule and compares every byte
(tokens, accepted counts, the drafter's published tokens, both caches at the committed
positions).

How many ready candidates a round verifies (``Budget``): ``fixed``, all of them up to
``budget`` (the paper's rule); ``cost``, the number k that maximises the expected
committed tokens per millisecond, (1 + a + ... + a^k) / cost_ms[k + 1], with ``cost_ms``
the bound target's measured call time at each width and ``a`` the per-candidate
acceptance rate estimated from the request's rounds so far. A verify call's cost is not
monotone in its width (cuBLAS picks a kernel per shape), and a drafter that never agrees
should not be verified at all. The decoupled verifier observes acceptance even in a
round that verifies nothing: the candidate at the cursor is compared with the token the
target committed there. Decisions depend on the data only (acceptance, readiness), so a
replay on the recorded schedule makes the same ones.

Candidate sources (``Source``): with random weights a drafter almost never agrees with
the target, so what the drafter publishes at index j is chosen by the run while the
drafter's forwards (the cost) always run: ``"drafter"`` its own argmax (acceptance ~ 0);
``"oracle"`` the target's own greedy token at j (computed before the request, width-1
calls), replaced with probability ``epsilon`` by a random token (seeded per index, so
a token does not depend on when it was drafted): the mean accepted length of a full
budget of 8 is sum_k (1 - e)^k, 3.06 at e = 0.22 (the paper's ~3 of 8). The drafter's
next input is what it published.
"""

from __future__ import annotations

import threading
from contextlib import nullcontext
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.workloads import subseed
from bench.workloads import transformers_whisper as W
from duplexcadence.generated.whisper_decoder.contract import DECLARED as WHISPER_DECODER
from duplexcadence.runtime import Channel

# the verifier's contract declares the channel the drafter publishes into (8 a batch, the
# paper's; runtime/state/channel.py): the shipped contract, every shape's positions alike
CANDIDATES = WHISPER_DECODER.channel("candidates")
BATCH = CANDIDATES.batch


class Source:
    """What the drafter publishes at index j (module docstring): ``kind`` "drafter" or
    "oracle" (``trajectory``: the target's greedy tokens of the request)."""

    def __init__(
        self,
        kind: str,
        request_seed: int,
        device: Any,
        trajectory: list[int] | None = None,
        epsilon: float = 0.0,
    ) -> None:
        assert kind in ("drafter", "oracle"), kind
        self.kind, self.planned = kind, None
        if kind == "oracle":
            assert trajectory is not None
            g = torch.Generator().manual_seed(subseed(request_seed, 16))
            n = len(trajectory)
            random = torch.randint(0, W.VOCAB, (n,), generator=g)
            keep = torch.rand(n, generator=g) >= epsilon
            self.planned = torch.where(keep, torch.tensor(trajectory), random).to(device)

    def token(self, j: int, drafted: torch.Tensor) -> torch.Tensor:
        """The ``[1, 1]`` token published at index ``j`` (``drafted``: the drafter's)."""
        if self.planned is None or j >= len(self.planned):
            return drafted
        # a copy: a view at offset j is not aligned as the captured input was
        return self.planned[j : j + 1][None].clone()


class Producer:
    """The decoupled drafter: encode its audio, prefill, then draft and publish ``limit``
    tokens in batches of ``BATCH``, until the channel closes. ``start()`` runs it on its
    own thread and CUDA stream; ``run()`` inline (a replay)."""

    def __init__(self, state: Any, request_seed: int, source: Source, channel: Channel) -> None:
        self.state, self.seed, self.source, self.channel = state, request_seed, source, channel
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def run(self, limit: int) -> None:
        request = W.Request(self.state, self.seed)
        token = self.source.token(0, request.prefill().argmax(-1)[:, None])
        pending = [token]
        for j in range(1, limit + 1):
            if len(pending) == BATCH or j == limit:
                self.channel.publish(torch.cat(pending, dim=1)[0])
                pending = []
            if j == limit or self.channel.closed:
                return
            logits = request.decode(token, len(W.PROMPT) + j - 1)[:, -1]
            token = self.source.token(j, logits.argmax(-1)[:, None])
            pending.append(token)

    def start(self, limit: int, device: torch.device) -> None:
        # a high-priority stream: the drafter's small kernels are dispatched before the
        # verifier's queued ones. On the H100 in float32 the drafter fell behind (half the
        # rounds found nothing ready at the paper's acceptance, bench/results/as2d_h100.md)
        # while in bfloat16 it kept up: the suspect is a float32 verify's GEMMs (~10 ms at
        # width 9, 4.6 in bfloat16) holding the GPU (measured next: lead_mean per request)
        stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        if stream is not None:  # the source's tokens were made on the caller's stream
            stream.wait_stream(torch.cuda.current_stream(device))

        def body() -> None:
            try:
                with torch.no_grad(), torch.cuda.stream(stream) if stream else nullcontext():
                    self.run(limit)
            except BaseException as e:  # noqa: BLE001 (re-raised by join)
                self.error = e

        self.thread = threading.Thread(target=body, name="as2d-producer", daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.channel.close()
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error


class Budget:
    """How many of ``available`` ready candidates a round verifies (module docstring).
    ``cost_ms``: width -> a call's milliseconds (``None``: the fixed rule). The acceptance
    rate is a geometric model's estimate from decayed counts of candidates compared
    (``observe``): matches over comparisons, each run of matches ending at its first
    mismatch; a prior of one match in two comparisons starts it."""

    DECAY = 0.9  # per round: the estimate follows a request whose acceptance changes

    def __init__(self, budget: int, cost_ms: dict[int, float] | None = None) -> None:
        self.budget, self.cost_ms = budget, cost_ms
        self.matches, self.compared = 1.0, 2.0

    @property
    def rate(self) -> float:
        return self.matches / self.compared

    def choose(self, available: int) -> int:
        k_max = min(available, self.budget)
        if self.cost_ms is None:
            return k_max
        a, best, best_k, expected = self.rate, 0.0, 0, 1.0
        for k in range(k_max + 1):
            if k:
                expected += a**k
            value = expected / self.cost_ms[k + 1]
            if value > best:
                best, best_k = value, k
        return best_k

    def observe(self, candidates: list[int], committed: list[int]) -> None:
        """``candidates`` (verified or not) against the tokens the target committed at
        their positions: the leading matches, and the mismatch that ends them if seen."""
        n = min(len(candidates), len(committed))
        if not n:
            return
        matches = 0
        while matches < n and candidates[matches] == committed[matches]:
            matches += 1
        self.matches = self.DECAY * self.matches + matches
        self.compared = self.DECAY * self.compared + matches + (matches < n)


@dataclass
class Transcript:
    """One request: the committed ``tokens``, and per round (ready entries, width,
    accepted): ``schedule``, ``widths``, ``accepted``; ``decode_s``: after the prefill."""

    tokens: list[int] = field(default_factory=list)
    schedule: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    decode_s: float = 0.0
    published: list[int] = field(default_factory=list)


class Alone:
    """No candidates: the target's greedy loop (``decode_request`` runs it without a
    host synchronisation per token)."""


class Serial:
    """Speculative decoding's drafter, synchronous with the target (module docstring)."""

    def __init__(self, state: Any, request_seed: int, source: Source, budget: int) -> None:
        self.request = W.Request(state, request_seed)
        self.logits = self.request.prefill()
        self.source, self.budget, self.fed = source, budget, 0
        self.ready = 0  # nothing is drafted ahead: each round drafts its own

    def candidates(self, committed: list[int], room: int) -> list[int]:
        new = committed[self.fed :]  # catch up on what the target committed: one call
        device = self.request.device
        if new:
            tokens = torch.tensor([new], device=device)
            self.logits = self.request.decode(tokens, len(W.PROMPT) + self.fed)[:, -1]
            self.fed = len(committed)
        drafts, j = [], len(committed)
        token = self.source.token(j, self.logits.argmax(-1)[:, None])
        for i in range(min(room, self.budget)):
            drafts.append(token)
            if i + 1 < min(room, self.budget):
                logits = self.request.decode(token, len(W.PROMPT) + j + i)[:, -1]
                token = self.source.token(j + i + 1, logits.argmax(-1)[:, None])
        return torch.cat(drafts, dim=1)[0].tolist() if drafts else []

    def observe(self, new: list[int]) -> None: ...


class Decoupled:
    """AS2D's verifier side of the channel: the ready candidates at the cursor, and the
    cursor's alignment after each round. A channel opened with ``replay=`` (a recorded
    run's schedule) gives the recorded ready counts instead of live readiness."""

    def __init__(self, channel: Channel, budget: Budget) -> None:
        self.channel, self.budget = channel, budget
        self.cursor = self.ready = 0
        self.available: list[int] = []  # this round's ready candidates, verified or not

    def candidates(self, committed: list[int], room: int) -> list[int]:
        self.ready = self.channel.ready()  # one tick of the channel's clock: a round
        n = max(0, min(room, self.budget.budget, self.ready - self.cursor))
        self.available = self.channel.read(self.cursor, self.cursor + n)
        return self.available[: self.budget.choose(n)]

    def observe(self, new: list[int]) -> None:
        self.budget.observe(self.available, new)
        self.available = []
        # positional alignment: the drafter's index j is the target's (both decode from
        # the same prompt), so the cursor moves with every committed token; a drafted
        # token the target rejected is a substitution. The paper also re-anchors by
        # searching the committed token among the next candidates (a drafter that
        # inserted or dropped a word); left out: random weights repeat tokens, and the
        # search jumps along the repetition and loses the aligned candidates.
        self.cursor += len(new)


def decode_request(request: Any, n: int, proposer: Any, budget: int = 8) -> Transcript:
    """Commit ``n`` tokens of ``request`` (prefilled here) with ``proposer``'s candidates
    (``Alone``, ``Serial``, ``Decoupled``), verifying greedily."""
    out = Transcript()
    first = request.prefill().argmax(-1)[:, None]  # [1, 1]
    out.tokens.append(int(first))
    t0 = time.perf_counter()
    position, last = len(W.PROMPT), first
    if isinstance(proposer, Alone):  # no per-token host synchronisation
        tokens = []
        for i in range(n - 1):
            last = request.decode(last, position + i)[:, -1].argmax(-1)[:, None]
            tokens.append(last)
        out.tokens += torch.cat(tokens, dim=1)[0].tolist() if tokens else []
        out.widths = [1] * (n - 1)
        out.decode_s = time.perf_counter() - t0
        return out
    proposer.observe(out.tokens)
    while len(out.tokens) < n:
        room = min(budget, n - len(out.tokens) - 1, W.POSITIONS - position - 1)
        drafts = proposer.candidates(out.tokens, room)
        tokens = last
        if drafts:
            tokens = torch.cat([last, torch.tensor([drafts], device=last.device)], dim=1)
        target = request.decode(tokens, position)[0].argmax(-1)  # [w]
        if target.is_cuda:  # wait with the GIL released: the producer thread drafts meanwhile
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
        got = target.tolist()
        a = 0
        while a < len(drafts) and drafts[a] == got[a]:
            a += 1
        out.tokens += got[: a + 1]
        position += a + 1
        last = target[a : a + 1][None].clone()  # aligned (a graph's input)
        proposer.observe(got[: a + 1])
        out.schedule.append(proposer.ready)
        out.widths.append(len(drafts) + 1)
        out.accepted.append(a)
    out.decode_s = time.perf_counter() - t0
    return out


def trajectory(state: Any, request_seed: int, n: int) -> list[int]:
    """The target's greedy tokens of a request (the oracle source's), width-1 calls."""
    return decode_request(W.Request(state, request_seed), n, Alone()).tokens


@dataclass
class Arm:
    """How a request is decoded: ``loop`` "alone", "serial" or "decoupled"; the drafter's
    state for the last two; the source ("drafter" or "oracle", ``epsilon``)."""

    loop: str
    target: Any
    drafter: Any = None
    source: str = "drafter"
    epsilon: float = 0.0
    budget: int = 8
    cost_ms: dict[int, float] | None = None  # decoupled: Budget's cost rule (else fixed)

    def run(
        self,
        request_seed: int,
        n: int,
        oracle: list[int] | None = None,
        schedule: list[int] | None = None,
    ) -> Transcript:
        """Decode one request (``schedule``: a decoupled run's, replayed inline)."""
        request = W.Request(self.target, request_seed)
        device = request.device
        if self.loop == "alone":
            return decode_request(request, n, Alone())
        source = Source(self.source, request_seed, device, oracle, self.epsilon)
        if self.loop == "serial":
            serial = Serial(self.drafter, request_seed, source, self.budget)
            return decode_request(request, n, serial, self.budget)
        assert self.loop == "decoupled", self.loop
        channel = Channel(CANDIDATES, device, replay=schedule)
        producer = Producer(self.drafter, request_seed, source, channel)
        if schedule is not None:
            producer.run(n)
        else:
            producer.start(n, device)
        try:
            verifier = Decoupled(channel, Budget(self.budget, self.cost_ms))
            out = decode_request(request, n, verifier, self.budget)
        finally:
            producer.join()
        out.published = channel.contents()
        return out


def committed_cache(state: Any, n: int) -> list[torch.Tensor]:
    """The cache entries a request of ``n`` tokens committed: self-attention keys and
    values at positions 0 .. prompt + n - 2 (the last token is never fed), every
    cross-attention entry (a rejected draft's entries lie past them, masked)."""
    end = len(W.PROMPT) + n - 1
    out = []
    for layer in state.cache.self_attention_cache.layers:
        out += [layer.keys[:, :, :end], layer.values[:, :, :end]]
    for layer in state.cache.cross_attention_cache.layers:
        out += [layer.keys, layer.values]
    return out
