"""The tiny streaming model of issue 13, as a new user would write it, and its contract.

A causal conv that keeps a left context of ``LEFT`` frames (its cache output is a
*strided view* of the conv's input, as a stock conv cache usually is), then two
attention layers whose KV grows by ``torch.cat`` inside the call and is trimmed to
the newest ``KEEP`` frames by the driver (``TinyStreamer.push``) after it. The state
lives on the model object (``model.cache``), so a contract can name its sites.

``stream(...)`` returns the ``StreamSpec`` (runtime/tools/streams.py) ``verify`` takes;
``CONTRACT`` is a correct contract for it and ``contract(**edits)`` a variant with
the mistakes of the issue's table; ``adapter(text)`` compiles contract text in
process and imports its generated package (``clockc verify`` takes a .clock path).
"""

from __future__ import annotations

import math

import torch

from duplexcadence.runtime.tools.streams import StreamSpec

CHANNELS, LEFT, KEEP, CHUNK, WIDTH = 32, 2, 16, 4, 32
SHORT_AT, SHORT = 10, 3  # the short chunk of the short-chunk stream: index, frames


class Attention(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, h: torch.Tensor, cache: torch.Tensor):
        q, k, v = self.qkv(h).split(self.d, dim=-1)
        kv = torch.cat([cache, torch.cat([k, v], dim=-1)], dim=1)  # grown by cat
        keys, values = kv.split(self.d, dim=-1)
        weights = torch.softmax(q @ keys.transpose(1, 2) / math.sqrt(self.d), dim=-1)
        return h + self.out(weights @ values), kv


class TinyStreamer(torch.nn.Module):
    """``step`` is the hot callable; ``push`` is the user's per-chunk driver."""

    def __init__(self, keywords: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(CHANNELS, WIDTH, LEFT + 1)
        self.layers = torch.nn.ModuleList([Attention(WIDTH), Attention(WIDTH)])
        self.keywords = keywords  # the caller passes the declared `arg`s by keyword
        self.cache = {
            "conv": torch.zeros(1, CHANNELS, LEFT),
            "kv": {"l0": torch.zeros(1, 0, 2 * WIDTH), "l1": torch.zeros(1, 0, 2 * WIDTH)},
        }

    def step(self, x: torch.Tensor, conv_cache: torch.Tensor, kv: dict):
        xx = torch.cat([conv_cache, x], dim=2)
        h = self.conv(xx).transpose(1, 2)
        new_kv = {}
        for name, layer in zip(("l0", "l1"), self.layers):
            h, new_kv[name] = layer(h, kv[name])
        return h, xx[:, :, -LEFT:], new_kv  # the conv cache: a strided view of xx

    @torch.no_grad()
    def push(self, x: torch.Tensor) -> torch.Tensor:
        c = self.cache
        if self.keywords:
            y, conv, kv = self.step(x=x, conv_cache=c["conv"], kv=c["kv"])
        else:
            y, conv, kv = self.step(x, c["conv"], c["kv"])
        # the stock trim, after the call: the newest KEEP frames
        self.cache = {"conv": conv, "kv": {n: t[:, -KEEP:] for n, t in kv.items()}}
        return y


def chunk_frames(index: int, short: bool) -> int:
    return SHORT if short and index == SHORT_AT else CHUNK


def stream(short: bool = False, keywords: bool = False, device: str = "cpu") -> StreamSpec:
    """Seeded traffic: chunk i is the same tensor on every call of ``drive``."""

    def build() -> TinyStreamer:
        model = TinyStreamer(keywords=keywords).to(device)
        model.cache = {
            "conv": model.cache["conv"].to(device),
            "kv": {n: t.to(device) for n, t in model.cache["kv"].items()},
        }
        return model

    def drive(model: TinyStreamer, chunks: int):
        for i in range(chunks):
            g = torch.Generator().manual_seed(1000 + i)
            x = torch.randn(1, CHANNELS, chunk_frames(i, short), generator=g)
            yield model.push(x.to(device))

    return StreamSpec(build=build, drive=drive, device=device)


def short_chunk_stream() -> StreamSpec:
    return stream(short=True)


def keyword_stream() -> StreamSpec:
    return stream(keywords=True)


CONTRACT = """\
contract tiny_stream

clock chunk = 1 per call
clock frame = 4 per chunk

const f_keep = 16 frame
const f_chunk = 4 frame

region kv0 {
  dtype float32
  dims [1, frame, 64]
  lifetime turn
  mutability mutable
  retention window(f_keep)
  attended from 0 frame by f_chunk until f_keep
  site cache["kv"]["l0"]
}

region kv1 {
  dtype float32
  dims [1, frame, 64]
  lifetime turn
  mutability mutable
  retention window(f_keep)
  attended from 0 frame by f_chunk until f_keep
  site cache["kv"]["l1"]
}

callable step {
  site step
  per chunk
  arg x: float32 [1, 32, 4]
  # the conv cache is a view of the conv's input: its row stride is that input's width
  # (2 kept frames + the chunk): 2 on the first chunk (the driver's zeros), 6 after a
  # 4-frame chunk, 5 after a 3-frame one
  arg conv_cache: float32 [1, 32, 2] strides [32 * w, w, 1] offset w - 2
  arg kv["l0"]: region kv0
  arg kv["l1"]: region kv1
  config w in {2, 5, 6}
  aliased kv0, kv1
  retains kv0 from result[2]["l0"]
  retains kv1 from result[2]["l1"]
  effects none
}
"""


def contract(**edits: str) -> str:
    """``CONTRACT`` with each ``old=new`` text replacement applied (it must occur)."""
    text = CONTRACT
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def adapter(text: str = CONTRACT):
    """The generated package of ``text`` (it must compile), imported under a fresh name."""
    from duplexcadence.compiler.driver import compile_source
    from duplexcadence.compiler.loader import import_generated

    result = compile_source(text, "tiny_stream.clock")
    assert result.ok, [d.message for d in result.diagnostics]
    return import_generated(result.files, prefix="tiny_stream")
