"""Stock Whisper (``transformers`` 4.57.6) decoding over a static cache, seeded random weights.

The workload is the released code of PyPI ``transformers==4.57.6`` (Apache-2.0),
``models/whisper``, imported from the installed distribution; nothing of it is copied
here. It needs what bench/workloads/transformers_mimi.py needs (the same release and its
import-time dependencies: ``bench/requirements-qwen3-code2wav.txt``).

What this module adds around the vendor code, and nothing more:

* ``build_whisper(shape)``: ``WhisperForConditionalGeneration(WhisperConfig(...))`` under
  a fixed seed, eval, with ``attn_implementation="eager"``: on a static cache the SDPA
  path skips the causal mask for a single query (transformers' ``_ignore_causal_mask_sdpa``)
  and would attend all 448 positions, the unwritten ones too; eager attention always
  masks by ``cache_position``. ``SHAPES["large-v3"]`` is openai/whisper-large-v3's
  architecture; ``SHAPES["tiny"]`` keeps its 32 decoder layers, vocabulary and positions
  with 4 heads of 8 (the CPU tests' shape: ``contract_text`` writes its constants into
  contracts/whisper_decoder.clock).
* ``new_state(model)``: ``SimpleNamespace(whisper, cache)``, the cache the vendor's
  ``generate`` makes for ``cache_implementation="static"``: an ``EncoderDecoderCache`` of
  a ``StaticCache`` over the 448 decoder positions and one over the 1500 encoder frames,
  initialized up front (``early_initialization``: the vendor otherwise allocates each
  layer on its first update, after bind).
* ``Request``: one utterance's seeded log-mel features, encoded by the vendor's encoder;
  ``prefill`` resets the cache (the vendor's ``reset``: zeros, ``is_updated`` False) and
  runs the 4-token start-of-transcript prompt, the call that fills the cross-attention
  cache; ``decode(tokens, position)`` is one decoder call of any width over the cache,
  ``decoder(input_ids, encoder_hidden_states, past_key_values, cache_position,
  use_cache=True, return_dict=False)`` then ``proj_out``: the logits of every position.
  Greedy decoding calls it with one token; verifying w drafted tokens with w + 1.

Seeding (``subseed(seed, k)``): weights <- ``torch.manual_seed(subseed(seed, 0))``, drawn
on the device the model is built on (the same seed gives other weights on a GPU than on
the CPU; every cell of a run builds on one device);
features <- a private CPU generator at ``subseed(request_seed, 1)``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from bench.workloads import subseed

# the same transformers release as Mimi's workload, and what it needs
from bench.workloads.transformers_mimi import (  # noqa: F401 (the workload's interface)
    DIST_NAME,
    DIST_VERSION,
    REQUIREMENTS,
    installed_version,
    unavailable_reason,
)

SHAPES = {
    # openai/whisper-large-v3's architecture
    "large-v3": dict(d_model=1280, heads=20, encoder_layers=32, decoder_layers=32, ffn=5120),
    # the CPU tests' shape: the same decoder depth, vocabulary and positions, tiny widths
    "tiny": dict(d_model=32, heads=4, encoder_layers=2, decoder_layers=32, ffn=64),
    # AS2D's drafter (bench/workloads/whisper_as2d.py): whisper-tiny's widths and depth
    # with large-v3's vocabulary, mel bins and positions
    "draft": dict(d_model=384, heads=6, encoder_layers=4, decoder_layers=4, ffn=1536),
    # the drafter at the CPU tests' widths
    "draft-tiny": dict(d_model=16, heads=2, encoder_layers=1, decoder_layers=4, ffn=32),
}
# the contract each shape is written for: another shape of the same depth compiles it with
# its own widths (contract_text)
CONTRACTS = {"large-v3": "whisper_decoder", "draft": "whisper_drafter"}
VOCAB = 51866
MEL_BINS = 128
POSITIONS = 448  # max_target_positions
FRAMES = 1500  # max_source_positions (3000 mel frames, 30 s)
# <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|> in large-v3's vocabulary
PROMPT = (50258, 50259, 50360, 50364)


def config(shape: str) -> Any:
    from transformers import WhisperConfig

    s = SHAPES[shape]
    return WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=MEL_BINS,
        d_model=s["d_model"],
        encoder_layers=s["encoder_layers"],
        decoder_layers=s["decoder_layers"],
        encoder_attention_heads=s["heads"],
        decoder_attention_heads=s["heads"],
        encoder_ffn_dim=s["ffn"],
        decoder_ffn_dim=s["ffn"],
        max_source_positions=FRAMES,
        max_target_positions=POSITIONS,
        decoder_start_token_id=PROMPT[0],
        attn_implementation="eager",
    )


def build_whisper(
    shape: str = "large-v3", seed: int = 0, device: Any = "cpu", dtype: Any = torch.float32
) -> Any:
    """The released WhisperForConditionalGeneration at ``shape``, seeded, eval; drawn in
    float32, then cast to ``dtype`` (bfloat16: the same weights, rounded)."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(subseed(seed, 0))
    # initialized where it runs: large-v3's 1.5 B parameters take minutes on a CPU
    with torch.device(device):
        return WhisperForConditionalGeneration(config(shape)).eval().to(dtype)


def _widths(shape: str) -> dict[str, int]:
    """The constants of contracts/whisper_decoder.clock that depend on the shape."""
    s = SHAPES[shape]
    return {"heads": s["heads"], "head_dim": s["d_model"] // s["heads"], "d_model": s["d_model"]}


def contract_text(shape: str, base: str | None = None, dtype: str = "float32") -> str:
    """The contract written for ``base`` (``CONTRACTS``, shipped with the package) with
    ``shape``'s widths as its constants (the tiny shapes differ from theirs in these only)
    and ``dtype`` for its float32 tensors (the caches, the encoder output)."""
    from importlib import resources

    base = base or base_shape(shape)
    assert SHAPES[shape]["decoder_layers"] == SHAPES[base]["decoder_layers"], (shape, base)
    name = f"{CONTRACTS[base]}.clock"
    text = resources.files("duplexcadence.contracts").joinpath(name).read_text()
    for (name, large), value in zip(_widths(base).items(), _widths(shape).values()):
        old = f"const {name} = {large}"
        assert old in text, old
        text = text.replace(old, f"const {name} = {value}")
    for old in ("dtype float32", "encoder_hidden_states: float32"):
        assert old in text, old
        text = text.replace(old, old.replace("float32", dtype))
    return text


def new_state(model: Any) -> SimpleNamespace:
    """``SimpleNamespace(whisper=model, cache)``: the static encoder-decoder cache,
    initialized (module docstring)."""
    from transformers.cache_utils import EncoderDecoderCache, StaticCache

    cfg = model.config
    p = next(model.parameters())
    head_dim = cfg.d_model // cfg.decoder_attention_heads
    caches = []
    for length in (POSITIONS, FRAMES):
        cache = StaticCache(config=cfg, max_cache_len=length)
        cache.early_initialization(1, cfg.decoder_attention_heads, head_dim, p.dtype, p.device)
        caches.append(cache)
    return SimpleNamespace(whisper=model, cache=EncoderDecoderCache(*caches))


def features(request_seed: int, device: Any = "cpu") -> torch.Tensor:
    """Seeded log-mel-like features ``[1, 128, 3000]`` (30 s), float32."""
    g = torch.Generator().manual_seed(subseed(request_seed, 1))
    return torch.randn(1, MEL_BINS, 2 * FRAMES, generator=g).to(device)


class Request:
    """One utterance on ``state``'s cache: encode, prefill the prompt, decode."""

    def __init__(self, state: SimpleNamespace, request_seed: int) -> None:
        self.state = state
        model = state.whisper
        self.device = next(model.parameters()).device
        with torch.no_grad():
            self.encoded = model.model.encoder(
                features(request_seed, self.device).to(next(model.parameters()).dtype),
                return_dict=False,
            )[0]

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """One decoder call: ``tokens`` ``[1, w]`` at positions ``position ..
        position + w - 1``; the logits ``[1, w, vocab]``."""
        s = self.state
        w = tokens.shape[1]
        hidden, _ = s.whisper.model.decoder(
            input_ids=tokens,
            encoder_hidden_states=self.encoded,
            past_key_values=s.cache,
            cache_position=torch.arange(position, position + w, device=self.device),
            use_cache=True,
            return_dict=False,
        )
        return s.whisper.proj_out(hidden)

    def prefill(self) -> torch.Tensor:
        """Reset the cache and run the prompt: the next token's logits ``[1, vocab]``."""
        self.state.cache.reset()
        prompt = torch.tensor([PROMPT], device=self.device)
        return self.decode(prompt, 0)[:, -1]

    def greedy(self, n: int) -> list[int]:
        """The target alone: ``n`` tokens, one call each (no EOS stop: random weights)."""
        token = self.prefill().argmax(-1)
        out = []
        for i in range(n):
            out.append(int(token))
            token = self.decode(token[:, None], len(PROMPT) + i)[:, -1].argmax(-1)
        return out


@torch.no_grad()
def vendor_greedy(model: Any, request_seed: int, n: int, assistant: Any = None) -> list[int]:
    """The vendor's own loop: ``generate()`` greedy from the same prompt, ``n`` new tokens
    (its cache a DynamicCache it makes; the suppress lists cleared: no loop here applies
    logits processors). ``assistant``: a drafter
    model, ``generate(assistant_model=...)`` (the vendor's serial speculative decoding)."""
    device = next(model.parameters()).device
    for m in (model, assistant):
        if m is not None:
            m.generation_config.begin_suppress_tokens = None
            m.generation_config.suppress_tokens = None
            # no end of text: n tokens every time (a minimum length is refused beside an
            # assistant; random weights need no EOS)
            m.generation_config.eos_token_id = None
    # the prompt as the vendor's forced start tokens: generate() refuses
    # decoder_input_ids beside an assistant model
    model.generation_config.forced_decoder_ids = [[i, t] for i, t in enumerate(PROMPT) if i]
    out = model.generate(
        features(request_seed, device).to(model.dtype),
        max_new_tokens=n,
        do_sample=False,
        num_beams=1,
        **({"assistant_model": assistant} if assistant is not None else {}),
    )
    return out[0, -n:].tolist()


class GreedyStream:
    """The target alone: one greedy token per ``step()`` (a width-1 decoder call), the
    token IDs ``[1, 1]`` int64; a new request (its prefill: eager, the guard) when the
    448 positions are full. Request k's features are seeded ``subseed(seed, 2 + k)``."""

    def __init__(self, state: SimpleNamespace, seed: int, n_steps: int = 0) -> None:
        self.state, self.seed, self.requests = state, seed, 0
        self._next_request()

    def _next_request(self) -> None:
        self.request = Request(self.state, subseed(self.seed, 2 + self.requests))
        self.requests += 1
        self.token = self.request.prefill().argmax(-1)[:, None]
        self.position = len(PROMPT)

    def _room(self, w: int) -> None:
        if self.position + w > POSITIONS:
            self._next_request()

    def step(self) -> torch.Tensor:
        self._room(1)
        logits = self.request.decode(self.token, self.position)
        self.position += 1
        self.token = logits[:, -1].argmax(-1)[:, None]
        return self.token.clone()


class VerifyStream(GreedyStream):
    """Verify rounds (speculative decoding's target side): round k verifies ``w - 1``
    drafted tokens at width ``w = widths[k % len(widths)]`` — the last committed token
    and the drafts in one call — and commits the drafts that match the target's argmax
    plus the target's own next token; a step returns the committed tokens ``[1, a + 1]``
    int64 (a: the drafts accepted). The drafts, seeded (``subseed(seed, 15)``):

    * ``epsilon`` None: random tokens (a random drafter: almost nothing is accepted);
    * ``epsilon`` e: the target's own greedy tokens at those positions (computed at the
      request's start with width-1 calls, before any cell binds), each replaced by a
      random token with probability e — a drafter whose acceptance the run controls
      (0: self-drafting, every draft accepted unless width-w rounding flips an argmax).
    """

    def __init__(
        self,
        state: SimpleNamespace,
        seed: int,
        n_steps: int = 0,
        widths=tuple(range(1, 10)),
        epsilon: float | None = None,
    ) -> None:
        self.widths, self.epsilon, self.rounds = tuple(widths), epsilon, 0
        self.drafts = torch.Generator().manual_seed(subseed(seed, 15))
        super().__init__(state, seed, n_steps)

    def _next_request(self) -> None:
        super()._next_request()
        self.trajectory = None
        if self.epsilon is not None:  # the greedy tokens at positions 4.., then back
            first = self.token
            self.trajectory = torch.cat([first[0], torch.tensor(self.greedy_after(first))])
            self.request.prefill()

    def greedy_after(self, token: torch.Tensor) -> list[int]:
        out = []
        for p in range(len(PROMPT), POSITIONS - 1):
            token = self.request.decode(token, p)[:, -1].argmax(-1)[:, None]
            out.append(int(token))
        return out

    def _draft(self, w: int) -> torch.Tensor:
        random = torch.randint(0, VOCAB, (w - 1,), generator=self.drafts)
        if self.trajectory is None:
            return random
        at = self.position - len(PROMPT) + 1  # the trajectory's token at position + 1
        oracle = self.trajectory[at : at + w - 1]
        oracle = torch.cat([oracle, random[len(oracle) :]])  # past the request's end
        keep = torch.rand(w - 1, generator=self.drafts) >= self.epsilon
        return torch.where(keep, oracle, random)

    def step(self) -> torch.Tensor:
        w = self.widths[self.rounds % len(self.widths)]
        self.rounds += 1
        self._room(w)
        drafts = self._draft(w).to(self.token.device)[None]
        tokens = torch.cat([self.token, drafts], dim=1)
        target = self.request.decode(tokens, self.position).argmax(-1)  # [1, w]
        accepted = int((target[0, : w - 1] == drafts[0]).int().cumprod(0).sum())
        self.position += accepted + 1
        self.token = target[:, accepted : accepted + 1]
        return target[:, : accepted + 1]


def base_shape(shape: str) -> str:
    """The shape whose contract ``shape`` is bound by (``CONTRACTS``): the one of its depth."""
    depth = SHAPES[shape]["decoder_layers"]
    return next(b for b in CONTRACTS if SHAPES[b]["decoder_layers"] == depth)


def adapter_module(shape: str, dtype: str = "float32") -> Any:
    """The generated adapter module for ``shape`` and ``dtype``: the shipped package for a
    contract's own shape in float32, else its contract compiled with ``shape``'s widths
    and ``dtype`` (``contract_text``)."""
    import importlib

    base = base_shape(shape)
    if shape == base and dtype == "float32":
        return importlib.import_module(f"duplexcadence.generated.{CONTRACTS[base]}.adapter")
    from duplexcadence.compiler.driver import compile_source
    from duplexcadence.compiler.loader import import_generated

    result = compile_source(contract_text(shape, base, dtype), f"{CONTRACTS[base]}.clock")
    assert result.ok, result.diagnostics
    package = import_generated(result.files, prefix=f"whisper_{shape.replace('-', '_')}_{dtype}")
    return importlib.import_module(f"{package.__name__}.adapter")


def bind_adapter(
    state: SimpleNamespace,
    device: Any = None,
    *,
    capture: bool = True,
    backend: Any = None,
    shape: str = "large-v3",
) -> Any:
    """Bind ``shape``'s generated adapter (``adapter_module``: the target's
    contracts/whisper_decoder.clock or the drafter's contracts/whisper_drafter.clock) in
    the dtype of ``state``'s model."""
    dtype = str(next(state.whisper.parameters()).dtype).removeprefix("torch.")
    return adapter_module(shape, dtype).bind(
        state, device=device, capture=capture, progress=False, backend=backend
    )
