"""DiffuPlex's rolling wakes (seeds/002, issue 26) over moshi 0.2.13's own ``LMModel``.

The interaction keeps Moshi's 80 ms frame; the temporal backbone wakes only when the
frames it drafted run out or a revision discards them. One wake feeds the ``c`` frames
realized since the last one (the assistant's played tokens and the user's arrived ones,
gathered from a delay cache exactly as ``LMGen._step`` gathers its one position) and
``W - 1`` masked future positions, in one ``transformer`` call of query length ``c + W -
1``: the last realized position's output is the next frame (h = 1, the autoregressive
prediction), masked position h - 1 the frame h. A prefix of ``r`` frames is retained
(the schedule's decision, below): each one's text token is sampled from its logits as
``LMGen`` samples and written into the delay cache ahead of playback; their 8 audio
codebooks come from one call of the vendor's ``LMGen.depformer_step`` over the ``r``
retained positions as a batch of ``r`` rows (autoregressive over the codebooks within
each frame, parallel in time: the paper's "the depth transformer stays autoregressive
within each frame, only in time one pass produces several positions"), so a wake costs
one backbone call and one depformer call whatever it retains; the audio of a draft a
revision discards is dropped with its text. Then the ring KV is rewound by
``W - 1``: the masked entries lie past the
committed end and the next wake overwrites them (``Rewind``: every ``RingKVCache``'s
``end_offset``, each attention's ``offset``/``offset_cpu``, each layer's
``offset_cpu`` and the transformer's ``offsets``; no copy). Frames are played one per
tick; played frames are never rewritten (the next wake writes past the current tick).
A wake writes up to 2W - 1 positions at once, and the vendor's rings hold exactly its
context: the last entries of such a write wrap onto keys its first queries still attend,
so the loop widens every ring by 2W - 2 at the stream's start (``widen_rings``; the
attention masks keep the vendor's context).

Masked positions: an assistant stream is masked at every h >= 2 (it is the draft); a
user stream at position q is masked unless the frame it carries there (q minus its
delay) has arrived, which is the paper's staircase (user cb0 from h >= 2 here, with its
delay 0; cb1..7, delay 1, from h >= 3). A masked stream contributes a per-stream mask
vector instead of its token embedding. The paper's gated LoRA is built from
``moshi.modules.lora.LoRALinear`` on every linear of the backbone (``add_gated_lora``):
its delta is taken only at masked positions (``torch.where``), so realized positions,
and every position of W = 1, run the original path. Mask vectors and LoRA factors are
seeded random (random weights: what they compute does not matter, that they run does);
the depformer keeps its own weights at every h.

W = 1 is one wake a tick with ``c = 1`` and nothing masked: the same vendor calls in the
same order as ``LMGen.step`` (``forward_text`` on one position, ``sample_token``,
``depformer_step``, each through the vendor's ``CUDAGraphed`` as ``LMGen`` wraps them,
so they graph when the vendor's graphs are on and run eager when ``NO_CUDA_GRAPH=1``), so
its token IDs equal the vendor loop's bit for bit, greedy or sampled with the same seed
(tests/test_moshi_wake.py; bench/diffuplex.py on the GPU).

Decisions (``Schedule``): with random weights a confidence is meaningless, so how many
frames a wake retains and after how many played frames a revision comes are drawn from
a seeded schedule calibrated to the paper, per wake, recorded (``Wake``); every arm of a
comparison replays the same list. ``ConfidenceRule`` applies the paper's retention rule
to the wake's own text (a sanity arm, threshold lowered).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

LORA_RANK = 8
LORA_SCALING = 2.0
INIT_STD = 0.02  # mask vectors and LoRA factors: seeded N(0, INIT_STD)


class Gate:
    """Which positions of the current backbone call take the LoRA delta: ``mask`` [B, T]
    bool (the masked ones), or None (none: the original path, as at W = 1)."""

    mask: torch.Tensor | None = None


class GatedLoRA(torch.nn.Module):
    """The vendor's ``LoRALinear`` around a backbone linear, its delta gated per position."""

    def __init__(self, base: torch.nn.Linear, gate: Gate, generator: torch.Generator) -> None:
        from moshi.modules.lora import LoRALinear

        super().__init__()
        w = base.weight
        self.lora = LoRALinear(
            base.in_features,
            base.out_features,
            LORA_RANK,
            LORA_SCALING,
            device=w.device,
            dtype=w.dtype,
        )
        self.lora.frozen_W = base
        with torch.no_grad():
            for p in (self.lora.lora_A.weight, self.lora.lora_B.weight):
                p.copy_(torch.randn(p.shape, generator=generator) * INIT_STD)
        self.gate = gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = self.lora.frozen_W(x)
        if self.gate.mask is None:
            return base
        delta = self.lora.scaling * self.lora.lora_B(self.lora.lora_A(x))
        return torch.where(self.gate.mask[:, :, None], base + delta, base)


def add_gated_lora(module: torch.nn.Module, seed: int) -> Gate:
    """Every ``nn.Linear`` under ``module`` wrapped in a ``GatedLoRA`` sharing one gate."""
    gate, g = Gate(), torch.Generator().manual_seed(seed)

    def wrap(parent: torch.nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name, GatedLoRA(child, gate, g))
            else:
                wrap(child)

    wrap(module)
    return gate


def widen_rings(transformer: Any, extra: int) -> int:
    """Give every ``RingKVCache`` of a freshly started stream ``extra`` more slots than
    its attention's context. A call of q positions writes q entries; with the vendor's
    capacity (= context) the last q - 1 of them wrap onto the oldest keys the call's first
    queries still attend (each query masks keys older than its context, not the slots a
    later position overwrote): lossless only with capacity >= context + q - 1. The masks
    stay the vendor's (``context``). Returns how many rings were widened."""
    from moshi.modules.transformer import RingKVCache

    widened = 0
    for module in transformer.modules():
        state = getattr(module, "_streaming_state", None)
        cache = getattr(state, "kv_cache", None)
        if not isinstance(cache, RingKVCache):
            continue
        if bool((cache.end_offset != 0).any()):
            raise ValueError("widen the rings before the stream's first call")
        _, batch, heads, capacity, dim = cache.cache.shape
        state.kv_cache = RingKVCache(
            batch,
            heads,
            dim,
            capacity + extra,
            cache.respect_exec_mask,
            device=cache.cache.device,
            dtype=cache.cache.dtype,
        )
        widened += 1
    return widened


class Rewind:
    """Moves the committed end of ``transformer``'s streaming state back by ``n``
    positions, to ``committed``: the entries a call wrote past it are overwritten by the
    next call. The device counters (the transformer's RoPE ``offsets``, each attention's
    ``offset``, each ``RingKVCache``'s ``end_offset``) move by ``n`` in one fused
    subtraction (a replayed call advanced them as the eager one did); the host ones
    (``offset_cpu``, which a replay does not run Python to advance, and which the
    backbone's computation does not read) are set to ``committed``. The counters are
    collected once per stream (a wake would otherwise walk every module) and again when
    the transformer's streaming state is replaced."""

    def __init__(self, transformer: Any) -> None:
        self.transformer, self.stream = transformer, None

    def _collect(self) -> None:
        from moshi.modules.transformer import RingKVCache

        self.device, self.host = [], []
        for module in self.transformer.modules():
            state = getattr(module, "_streaming_state", None)
            if state is None:
                continue
            if hasattr(state, "offsets"):  # _TransformerState: RoPE positions
                self.device.append(state.offsets)
            if isinstance(getattr(state, "offset", None), torch.Tensor):
                self.device.append(state.offset)  # _MHAState
            if hasattr(state, "offset_cpu"):
                self.host.append(state)  # _MHAState and _LayerState
            cache = getattr(state, "kv_cache", None)
            if isinstance(cache, RingKVCache):
                self.device.append(cache.end_offset)
        self.stream = self.transformer._streaming_state

    def __call__(self, n: int, committed: int) -> None:
        if self.stream is not self.transformer._streaming_state:  # a new stream
            self._collect()
        torch._foreach_sub_(self.device, n)
        for state in self.host:
            state.offset_cpu = committed


@dataclass(frozen=True)
class Wake:
    """One wake: the tick it ran at, frames realized since the last (``c``), frames
    retained (``r``), frames played before the next wake (``k``: ``k < r`` is a
    revision, the rest of the draft discarded)."""

    tick: int
    c: int
    r: int
    k: int


class Schedule:
    """Seeded decisions per wake: ``r`` retained (1, else a run of ``min_run`` ..
    ``window`` frames with probability ``p_run``) and ``k`` played before the next wake (a
    revision after each played frame of the run with probability ``hazard``, else all
    ``r``). ``listen``/``speak``: calibrated at W = 16 to the paper's timing subset
    (frames per wake 1.98 / 2.26, frames played before a revision 4.24 / 3.79; its
    minimum runs 6 / 2). W = 1: always (1, 1)."""

    needs_texts = False
    # the paper's two policies, calibrated (class docstring)
    POLICIES = {
        "listen": dict(p_run=0.225, min_run=6, hazard=0.1525),
        "speak": dict(p_run=0.3575, min_run=2, hazard=0.16),
    }

    def __init__(self, seed: int, window: int, p_run: float, min_run: int, hazard: float) -> None:
        self.rng, self.window = random.Random(seed), window
        self.p_run, self.min_run, self.hazard = p_run, min(min_run, window), hazard

    @classmethod
    def listen(cls, seed: int, window: int) -> "Schedule":
        return Schedule(seed, window, **cls.POLICIES["listen"])

    @classmethod
    def speak(cls, seed: int, window: int) -> "Schedule":
        return Schedule(seed, window, **cls.POLICIES["speak"])

    def decide(self, texts: Any = None, confidences: Any = None) -> tuple[int, int]:
        if self.window == 1:
            return 1, 1
        r = 1
        if self.rng.random() < self.p_run:
            r = self.rng.randint(self.min_run, self.window)
        return r, self._played(r)

    def _played(self, r: int) -> int:
        for j in range(1, r):
            if self.rng.random() < self.hazard:
                return j
        return r


class ConfidenceRule(Schedule):
    """The paper's retention rule on the wake's own text (a sanity arm: with random
    weights a confidence is ~1 / vocabulary, so the threshold is lowered): h = 1 always;
    the run is the longest h = 2 .. W whose sampled text token has an allowed state
    (``listen``: PAD only; ``speak``: PAD, EPAD or a word) and a softmax probability
    before temperature and top-k of at least ``threshold``; kept when at least
    ``min_run`` long, else 1. Revision stays the schedule's (the rule needs the model's
    user predictions, which Moshi's 8-codebook depformer does not make)."""

    needs_texts = True

    def __init__(self, seed: int, window: int, policy: str, threshold: float, pad: int) -> None:
        super().__init__(seed, window, **self.POLICIES[policy])
        self.allowed = {pad} if policy == "listen" else None  # speak: every state
        self.threshold = threshold

    def decide(self, texts: Any = None, confidences: Any = None) -> tuple[int, int]:
        run = 1
        for h in range(2, self.window + 1):
            state_ok = self.allowed is None or texts[h - 1] in self.allowed
            if not state_ok or confidences[h - 1] < self.threshold:
                break
            run = h
        r = run if run >= self.min_run else 1
        return r, self._played(r)


@dataclass
class RollingWakes:
    """The rolling loop (module docstring) over ``lm_gen``'s model, sampling as it does;
    ``lm_gen`` itself is not stepped. Call ``tick(user_codes)`` once per frame."""

    lm_gen: Any
    window: int
    schedule: Schedule
    seed: int = 0
    wakes: list[Wake] = field(default_factory=list)

    def __post_init__(self) -> None:
        lm = self.lm = self.lm_gen.lm_model
        self.delays = list(lm.delays)
        self.max_delay = max(self.delays)
        self.depth = lm.dep_q + 1  # text + the assistant's audio codebooks
        self.ring = self.window + self.max_delay + 2  # the delay cache's length
        device = lm.device
        self.delay_column = torch.tensor(self.delays, device=device)[:, None]  # [K, 1]
        self.cache = torch.full(
            (1, lm.num_codebooks, self.ring),
            lm.ungenerated_token_id,
            device=device,
            dtype=torch.long,
        )
        self.initial = lm._get_initial_token()
        self.gate = add_gated_lora(lm.transformer, self.seed) if self.window > 1 else Gate()
        self.rewind = Rewind(lm.transformer)
        if self.window == 1:  # LMGen's own wrappers (LMGen._init_streaming_state)
            from moshi.utils.compile import CUDAGraphed

            off = device.type != "cuda"
            self.forward_text = CUDAGraphed(lm.forward_text, disable=off)
            self.depformer_step = CUDAGraphed(self.lm_gen.depformer_step, disable=off)
        else:  # the plain calls: the wake's contract binds the depformer at its site
            self.forward_text, self.depformer_step = None, None
        if self.window > 1:  # a wake writes up to 2W - 1 positions (c <= W realized)
            widen_rings(lm.transformer, 2 * self.window - 2)
        g = torch.Generator().manual_seed(self.seed + 1)
        dim = lm.text_emb.weight.shape[1]
        self.mask_vectors = (torch.randn(lm.num_codebooks, dim, generator=g) * INIT_STD).to(
            device=device, dtype=lm.text_emb.weight.dtype
        )
        self.t = 0  # frames played (LMGen's offsets)
        self.fed = 0  # positions committed to the backbone's KV
        self.left = 0  # frames the last wake left to play before the next wake

    # ------------------------------------------------------------------ a frame
    @torch.no_grad()
    def tick(self, user: torch.Tensor) -> torch.Tensor | None:
        """One 80 ms frame: ``user`` [1, 8, 1] codes arrive; the frame played now,
        [1, 9, 1] text and audio IDs as ``LMGen.step`` returns them (None during its
        warm-up of ``max_delay`` frames)."""
        t, users = self.t, range(self.depth, self.lm.num_codebooks)
        for i, k in enumerate(users):  # LMGen._step's first scatter: at t + delay
            self.cache[:, k, (t + self.delays[k]) % self.ring] = user[:, i, 0]
        if self.left == 0:
            self._wake()
        self.left -= 1
        self.t += 1
        if self.t <= self.max_delay:
            return None
        gen = self.delay_column[: self.depth]
        index = ((self.t - self.max_delay + gen) % self.ring).view(1, -1, 1)
        return self.cache[:, : self.depth].gather(2, index)

    # ------------------------------------------------------------------- a wake
    def _wake(self) -> None:
        t, W = self.t, self.window
        c = t - self.fed + 1  # positions fed .. t are realized
        positions = list(range(self.fed, t + W))
        tokens, masked = self._inputs(positions, t)
        if masked is None:  # nothing masked (W = 1): the vendor's own call
            out, logits = self.forward_text(tokens)
        else:
            out, logits = self.backbone(tokens, masked)
        g = self.lm_gen
        at = lambda h: c - 1 + h - 1  # noqa: E731  (the output that predicts frame t + h)
        sample = lambda h: _sample(  # noqa: E731
            logits[:, :, at(h) : at(h) + 1], g.use_sampling, g.temp_text, g.top_k_text
        )
        if self.schedule.needs_texts:  # the rule reads every drafted text token first
            texts = [sample(h) for h in range(1, W + 1)]
            probs = [
                float(torch.softmax(logits[0, 0, at(h)].float(), -1)[int(x)])
                for h, x in enumerate(texts, start=1)
            ]
            r, k = self.schedule.decide([int(x) for x in texts], probs)
        else:
            r, k = self.schedule.decide()
            texts = [sample(h) for h in range(1, r + 1)]
        texts = torch.cat(texts[:r])  # [r]: the retained frames' text tokens
        # the retained positions' outputs as r rows of one step, contiguous as LMGen hands
        # its one (W = 1: the same [1, 1, D] values)
        outs = out[0, at(1) : at(r) + 1, None].contiguous()
        self._voice(t, texts, outs)
        if W > 1:
            self.rewind(W - 1, t + 1)
        self.fed, self.left = t + 1, k
        self.wakes.append(Wake(t, c, r, k))

    def _voice(self, t: int, texts: torch.Tensor, outs: torch.Tensor) -> None:
        """The retained frames t + 1 .. t + r: their text tokens [r] and audio codebooks
        (one depformer call over their outputs [r, 1, D], as ``LMGen`` runs it after
        ``forward_text``) written into the delay cache ahead of playback. A revision's
        next wake overwrites the ones left unplayed."""
        depformer = self.depformer_step or self.lm_gen.depformer_step
        audio = depformer(texts, outs)  # [r, dep_q]
        slots = torch.arange(t + 1, t + 1 + len(texts), device=self.cache.device) % self.ring
        streams = self.cache[0]  # [K, ring], a view
        streams[0, slots] = texts
        streams[1 : self.depth, slots] = audio.T

    def _inputs(self, positions: list[int], t: int) -> tuple[torch.Tensor, Any]:
        """Tokens [1, K, T] at ``positions`` (``initial`` where a stream has not started,
        as LMGen gives it), and the masked streams [1, K, T] (None when none are)."""
        K, delays = self.lm.num_codebooks, self.delay_column
        pos = torch.tensor(positions, device=self.cache.device)[None, :]
        gathered = self.cache.gather(2, (pos % self.ring).expand(K, -1)[None])
        is_init = pos <= delays  # [K, T]
        tokens = torch.where(is_init[None], self.initial, gathered)
        future = pos > t  # masked positions, h >= 2
        if not bool(future.any()):
            return tokens, None
        arrived = (pos - delays) <= t
        user = torch.arange(K, device=pos.device)[:, None] >= self.depth
        masked = future & ~(user & arrived)
        return tokens, masked[None]

    def backbone(self, tokens: torch.Tensor, masked: torch.Tensor) -> tuple[Any, Any]:
        """One wake's backbone call (the site a contract binds): ``forward_text`` with a
        mask vector for each masked stream entry [1, K, q] and the LoRA delta at the
        masked positions; (transformer output [1, q, D], text logits [1, 1, q, card])."""
        self.gate.mask = masked.any(dim=1)
        try:
            return self._forward(tokens, masked)
        finally:
            self.gate.mask = None

    def _forward(self, tokens: torch.Tensor, masked: torch.Tensor) -> tuple[Any, Any]:
        lm = self.lm
        safe = torch.where(masked, torch.zeros_like(tokens), tokens)

        def stream(emb: Any, k: int) -> torch.Tensor:
            e = emb(safe[:, k])
            return torch.where(masked[:, k, :, None], self.mask_vectors[k], e)

        x = None
        for cb in range(lm.num_audio_codebooks):
            e = stream(lm.emb[cb], cb + lm.audio_offset)
            x = e if x is None else x + e
        text = stream(lm.text_emb, 0)
        x = text if x is None else x + text
        out = lm.transformer(x)
        if lm.out_norm:
            out = lm.out_norm(out)
        return out, lm.text_linear(out)[:, None]


def _sample(logits: torch.Tensor, use_sampling: bool, temp: float, top_k: int) -> torch.Tensor:
    """LMGen's text sampling of one position: the token [B]."""
    from moshi.utils.sampling import sample_token

    token = sample_token(logits.float(), use_sampling, temp, top_k)
    return token[:, 0, 0]


@dataclass(frozen=True)
class WakeShape:
    """What a wake contract depends on: the backbone's depth, width and attention, its
    rings (``ring`` slots, ``context`` attended), the streams, the dtype and W."""

    dim: int
    layers: int
    heads: int
    head_dim: int
    ring: int
    context: int
    streams: int
    dtype: str
    window: int


# moshi 0.2.13's 7B LM (loaders._lm_kwargs) at W = 16, its rings widened by 2W - 2
SHAPE_7B = WakeShape(4096, 32, 32, 128, 3000 + 30, 3000, 17, "bfloat16", 16)


def wake_shape(loop: RollingWakes) -> WakeShape:
    """``loop``'s model's shape, read off its started stream."""
    layers = list(loop.lm.transformer.layers)
    cache = layers[0].self_attn._streaming_state.kv_cache.cache
    _, _, heads, ring, head_dim = cache.shape
    dtype = str(cache.dtype).removeprefix("torch.")
    context = layers[0].self_attn.context
    return WakeShape(
        loop.lm.dim,
        len(layers),
        heads,
        head_dim,
        ring,
        context,
        loop.lm.num_codebooks,
        dtype,
        loop.window,
    )


def contract_text(shape: WakeShape) -> str:
    """The ``.clock`` contract of a wake's backbone call at ``shape``: one class per
    query length q = W .. 2W - 1 (a wake after c = 1 .. W played frames, which it
    commits: `commits lm_kv by q - (W - 1)`); the rings attended in full under the
    vendor's position mask, so no extent varies, and documented as one speculative ring
    (`lm_kv`: clockc refuses it unless it holds the context and the 2W - 2 entries a wake
    writes past its first). Every tensor the call writes in place is a stock region,
    pointer-checked on every call: a ring replaced behind the graphs (a new stream) makes
    the call run eager, not write a stale buffer. The vendor's depformer step (one call
    per wake over its r = 1 .. W retained frames) is a second callable, one class per r.
    contracts/moshi_wake.clock is this text at ``SHAPE_7B``."""
    W, ring, dtype = shape.window, shape.ring, shape.dtype
    state = "lm.transformer.layers[{i}].self_attn._streaming_state"
    lines = [
        "# generated by bench/workloads/moshi_wake.py (contract_text): DiffuPlex's wake",
        "contract moshi_wake",
        'target "moshi==0.2.13"',
        "catalog budget 64",
        "determinism cudnn.deterministic = true",
        "determinism cudnn.benchmark = false",
        "determinism cuda.cudnn_sdp = false",
        "clock wake = 1 per call",
        f"clock frame = 1..{W} per wake  # the frames a wake commits (played since the last)",
        f"const dim = {shape.dim}",
        f"const layers = {shape.layers}",
        f"const heads = {shape.heads}",
        f"const head_dim = {shape.head_dim}",
        f"const capacity = {ring}",
        f"const streams = {shape.streams}",
    ]
    # the vendor's rings as one documented region: a wake writes up to 2W - 1 positions,
    # 2W - 2 past its first, so the ring keeps its context only when widened by that
    lines += [
        "region lm_kv {",
        f"  dtype {dtype}",
        "  dims [layers, 2, 1, heads, frame, head_dim]",
        f"  retention ring({ring} frame)",
        f"  attended from 0 frame by frame until {shape.context} frame",
        f"  speculative {2 * W - 2} frame",
        "  allocate none",
        "}",
    ]
    written = []
    for i in range(shape.layers):
        at = state.format(i=i)
        lines += [
            f"region kv{i} {{ dtype {dtype}  dims [2, 1, heads, capacity, head_dim]  stock [2, 1, "
            f"heads, capacity, head_dim]  allocate stock  site {at}.kv_cache.cache }}",
            f"region end{i} {{ dtype int64  dims [1]  stock [1]  allocate stock  "
            f"site {at}.kv_cache.end_offset }}",
            f"region pos{i} {{ dtype int64  dims [1]  stock [1]  allocate stock  site {at}.offset }}",
        ]
        written += [f"kv{i}", f"end{i}", f"pos{i}"]
    lines += [
        "region rope { dtype int64  dims [1]  stock [1]  allocate stock  "
        "site lm.transformer._streaming_state.offsets }",
        "callable backbone {",
        "  site backbone",
        "  per wake",
        "  arg tokens: int64 [1, streams, q]",
        "  arg masked: bool8 [1, streams, q]",
        "  config q in {" + ", ".join(str(q) for q in range(W, 2 * W)) + "}",
        "  writes " + ", ".join(written + ["rope"]),
        f"  commits lm_kv by q - {W - 1}",
        "  effects none",
        "}",
        # the vendor's own depformer step over a wake's r retained frames as r rows (LMGen
        # graphs it too, as graphed_depth): its streaming state lives inside the call, so
        # it writes nothing
        "callable depformer {",
        "  site lm_gen.depformer_step",
        "  per wake",
        "  arg text_token: int64 [r]",
        f"  arg transformer_out: {dtype} [r, 1, dim]",
        "  config r in {" + ", ".join(str(r) for r in range(1, W + 1)) + "}",
        "  effects none",
        "}",
    ]
    return "\n".join(lines) + "\n"


def bind_adapter(loop: RollingWakes, device: Any = None, backend: Any = None) -> Any:
    """Bind the wake contract at ``loop``'s shape to ``loop`` (its backbone and depformer
    graphed), on a stream started but not yet stepped: the
    shipped generated adapter at ``SHAPE_7B``, else ``contract_text`` compiled here."""
    import importlib

    shape = wake_shape(loop)
    if shape == SHAPE_7B:
        adapter = importlib.import_module("duplexcadence.generated.moshi_wake.adapter")
    else:
        from duplexcadence.compiler.driver import compile_source
        from duplexcadence.compiler.loader import import_generated

        result = compile_source(contract_text(shape), "moshi_wake.clock")
        if not result.ok:
            raise ValueError("\n".join(str(d) for d in result.diagnostics))
        package = import_generated(result.files, prefix=f"moshi_wake_w{loop.window}")
        adapter = importlib.import_module(f"{package.__name__}.adapter")
    # capture runs the callables on scratch inputs, which advances the backbone's rings:
    # reset them in place after (as bench.workloads.moshi.bind_adapter does per connection)
    binding = adapter.bind(loop, device=device, capture=False, progress=False, backend=backend)
    if binding.device.type == "cuda" or backend is not None:  # what bind() would capture
        binding.capture(progress=False)
        loop.lm.reset_streaming()
    return binding
