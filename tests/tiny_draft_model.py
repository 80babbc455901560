"""A tiny streaming model as a new user writes one, outside any contract (issue 13).

A causal conv whose left context is kept between chunks (returned as a strided view of
the conv's padded input, as such code usually does), then two attention layers whose
KV grows by ``torch.cat`` inside the call and is trimmed to the newest ``KEEP`` frames
by the driver after it. The state lives on the model object (``model.state``), the
hot call is ``model.step(x, ctx, kv0, kv1)`` with positional arguments, and ``stream()``
is the ``StreamSpec`` that ``clockc draft --stream tiny_draft_model:stream`` traces.

``CONTRACT`` is the contract written by hand for it (what a careful user writes from
the README); the draft tests compare against it and the check/bind tests mutate it.
"""

from __future__ import annotations

import torch

from duplexcadence.runtime.tools.streams import StreamSpec

C, H, DH, F, KEEP, K = 8, 2, 4, 4, 16, 3  # channels, heads, head dim, frames/chunk, kept, kernel
LEFT = K - 1  # conv left context


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(C, 3 * C)
        self.out = torch.nn.Linear(C, C)

    def forward(self, h: torch.Tensor, kv: torch.Tensor):
        # h [1, F, C]; kv [1, 2, H, T, DH] -> new kv [1, 2, H, T + F, DH]
        q, k, v = self.qkv(h).view(1, -1, 3, H, DH).permute(2, 0, 3, 1, 4)
        kv = torch.cat([kv, torch.stack([k, v], dim=1)], dim=3)
        att = torch.softmax(q @ kv[:, 0].transpose(-1, -2) / DH**0.5, dim=-1)
        y = (att @ kv[:, 1]).transpose(1, 2).reshape(1, -1, C)
        return h + self.out(y), kv


class TinyStreamer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(C, C, K)
        self.layers = torch.nn.ModuleList([Attention(), Attention()])
        self.reset()

    def reset(self) -> None:
        self.state = {
            "ctx": torch.zeros(1, C, LEFT),
            "kv0": torch.zeros(1, 2, H, 0, DH),
            "kv1": torch.zeros(1, 2, H, 0, DH),
        }

    def step(self, x: torch.Tensor, ctx: torch.Tensor, kv0: torch.Tensor, kv1: torch.Tensor):
        xc = torch.cat([ctx, x], dim=2)  # [1, C, LEFT + F]
        h = self.conv(xc).transpose(1, 2)  # [1, F, C]
        h, kv0 = self.layers[0](h, kv0)
        h, kv1 = self.layers[1](h, kv1)
        return h, xc[:, :, -LEFT:], kv0, kv1


def build() -> TinyStreamer:
    torch.manual_seed(0)
    return TinyStreamer().eval()


def chunk_input(i: int, frames: int = F) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(1, C, frames, generator=g)


def drive(model: TinyStreamer, chunks: int):
    """The user's streaming loop: one call per chunk, the driver trims the KV."""
    with torch.no_grad():
        for i in range(chunks):
            s = model.state
            y, ctx, kv0, kv1 = model.step(chunk_input(i), s["ctx"], s["kv0"], s["kv1"])
            model.state = {"ctx": ctx, "kv0": kv0[:, :, :, -KEEP:], "kv1": kv1[:, :, :, -KEEP:]}
            yield y


def stream() -> StreamSpec:
    return StreamSpec(build=build, drive=drive)


CONTRACT = """\
contract tiny_streamer

clock chunk = 1 per call
clock frame = 4 per chunk

const keep = 16 frame

region kv0 {
  dtype float32
  dims [1, 2, 2, frame, 4]
  lifetime turn
  retention window(keep)
  attended from 0 frame by 4 frame until keep
  site state["kv0"]
}

region kv1 {
  dtype float32
  dims [1, 2, 2, frame, 4]
  lifetime turn
  retention window(keep)
  attended from 0 frame by 4 frame until keep
  site state["kv1"]
}

callable step {
  site step
  per chunk
  arg x: float32 [1, 8, 4]
  arg ctx: float32 [1, 8, 2] strides [s0, s1, 1] offset off
  arg kv0: region kv0
  arg kv1: region kv1
  config (s0, s1, off) in {(16, 2, 0), (48, 6, 4)}
  aliased kv0, kv1
  retains kv0 from result[2]
  retains kv1 from result[3]
}
"""
