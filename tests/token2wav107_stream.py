"""Stock vs bound Token2Wav 1.0.7 on CPU, in a process of its own (1.0.7 never shares one
with 1.0.6): run by ``tests/test_token2wav107_adapter.py``, which asserts on the JSON this
prints as its last line.

Stock ``Token2wav.stream()`` (seeded random weights) over ``N_CHUNKS`` chunks, then the same
turn, re-primed, with ``stepaudio2_token2wav107`` bound on the ``FakeGraphBackend``: every class is "captured" and "replayed" on the CPU through the engine's
staging, admission and output rules, so a call the catalog does not admit, or a replay whose
staged copy is wrong, shows up here as a miss or a changed byte.
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

SEED = 0
N_CHUNKS = 4  # 3 steady chunks (the stock trims fire on the third) + the final one


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _stream(W, t2w, observe=None) -> dict:
    mels, inner = [], t2w.flow.inference_chunk

    def recording(*args, **kwargs):
        feat, cache = inner(*args, **kwargs)
        mels.append(_digest(feat.detach()))
        return feat, cache

    t2w.flow.inference_chunk = recording
    pcm = []
    for chunk in W.token_stream(SEED, N_CHUNKS):
        pcm.append(_digest(torch.from_numpy(W.stream_chunk(t2w, chunk.tokens, chunk.last_chunk))))
        if observe is not None:
            observe(t2w)
    return {"mels": mels, "pcm": pcm}


def main() -> int:
    from bench.workloads import token2wav107 as W

    reason = W.unavailable_reason()
    if reason is not None:
        print(json.dumps({"unavailable": reason}))
        return 0
    from duplexcadence.generated import stepaudio2_token2wav107 as adapter
    from duplexcadence.runtime.engine.backend import FakeGraphBackend

    # One build (minutes on a shared CPU): the stock turn, then the same turn again with
    # the adapter bound, re-primed and captured in the order bench SRc does it (bind, the
    # vendor's own set_stream_cache, the global seed, capture).
    t2w = W.build_token2wav(SEED)
    out = {"stock": _stream(W, t2w)}
    del t2w.flow.inference_chunk  # the recording wrapper: the class method again
    backend = FakeGraphBackend()
    binding = adapter.bind(t2w, device="cpu", capture=False, progress=False, backend=backend)
    t2w.set_stream_cache(W.PROMPT_KEY)
    torch.manual_seed(SEED)
    binding.capture(progress=False)
    carry = binding.regions["estimator_carry"]
    seen = {"carry_ptrs": set(), "lengths": []}

    def observe(m):
        est = m.stream_cache["estimator_att_cache"]
        seen["carry_ptrs"].add(est.data_ptr())
        seen["lengths"].append(int(est.shape[4]))

    out["bound"] = _stream(W, t2w, observe)
    stats = binding.stats()
    out["callables"] = {
        name: {k: c.get(k) for k in ("hits", "misses", "classes")}
        for name, c in stats["callables"].items()
    }
    out["carry_at_one_address"] = seen["carry_ptrs"] == {carry.data_ptr()}
    out["carry_lengths"] = seen["lengths"]
    out["constants"] = stats.get("constants")
    out["sine_waves_device"] = str(t2w.hift.m_source.l_sin_gen.sine_waves.device)
    out["solver_workspace"] = list(t2w.flow.decoder.att_cache_buffer.shape)
    out["fake_replays"] = backend.replays
    binding.unbind()
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
