"""CPU probe of the stock streaming Token2Wav (minicpmo-utils 1.0.6, random weights).

Prints set-up and per-chunk times, the carries' shapes / data_ptr after every chunk, the
shapes every chunk hands to ``flow.inference_chunk`` and ``hift.forward``, and checks
(1) two fresh builds with one seed give torch.equal PCM, (2) the proxied vendor
``stream()`` equals a line-by-line transcription of token2wav.py:173-240 run on CPU.

    python -m bench.token2wav_cpu_probe --threads 2 --chunks 6
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.workloads import token2wav as W


def _transcribed_stream(self, generated_speech_tokens, last_chunk=False):
    """token2wav.py:173-240 (return_waveform=True), device='cuda' -> the object's device."""
    m = W.import_stepaudio2()
    dev = self.bench.device
    prompt_speech_tokens, prompt_speech_tokens_lens, spk_emb, prompt_mels, prompt_mels_lens = (
        self.cache
    )
    generated_speech_tokens = torch.tensor([generated_speech_tokens], dtype=torch.int32, device=dev)
    chunk_mel, self.stream_cache = self.flow.inference_chunk(
        token=generated_speech_tokens,
        spk=spk_emb,
        cache=self.stream_cache,
        last_chunk=last_chunk,
        n_timesteps=self.n_timesteps,
    )
    if self.stream_cache["estimator_att_cache"].shape[4] > (prompt_mels.shape[1] + 100):
        self.stream_cache["estimator_att_cache"] = torch.cat(
            [
                self.stream_cache["estimator_att_cache"][:, :, :, :, : prompt_mels.shape[1]],
                self.stream_cache["estimator_att_cache"][:, :, :, :, -100:],
            ],
            dim=4,
        )
    if self.stream_cache["conformer_att_cache"].shape[3] > (prompt_mels.shape[1] + 100):
        self.stream_cache["conformer_att_cache"] = torch.cat(
            [
                self.stream_cache["conformer_att_cache"][:, :, :, : prompt_mels.shape[1], :],
                self.stream_cache["conformer_att_cache"][:, :, :, -100:, :],
            ],
            dim=3,
        )
    hift_cache_mel = self.hift_cache_dict["mel"]
    hift_cache_source = self.hift_cache_dict["source"]
    hift_cache_speech = self.hift_cache_dict["speech"]
    mel = torch.concat([hift_cache_mel, chunk_mel], dim=2)
    speech, source = self.hift(mel, hift_cache_source)
    if hift_cache_speech.shape[-1] > 0:
        speech = m.token2wav.fade_in_out(speech, hift_cache_speech, self.speech_window)
    is_first_chunk = hift_cache_speech.shape[-1] == 0
    self.hift_cache_dict = dict(
        mel=mel[..., -self.mel_cache_len :].clone().detach(),
        source=source[:, :, -self.source_cache_len :].clone().detach(),
        speech=speech[:, -self.source_cache_len :].clone().detach(),
    )
    if not last_chunk:
        if is_first_chunk:
            silence_padding = torch.zeros(1, self.source_cache_len, device=speech.device)
            speech = torch.cat([silence_padding, speech[:, : -self.source_cache_len]], dim=1)
        else:
            speech = speech[:, : -self.source_cache_len]
    return speech.cpu().numpy().reshape(-1)


def _shape(x):
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)}:{str(x.dtype).replace('torch.', '')}"
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items()}
    return repr(x)


def _instrument(t2w, log):
    flow = t2w.flow
    orig_chunk = flow.inference_chunk

    def inference_chunk(**kw):
        log.append(("flow.inference_chunk", {k: _shape(v) for k, v in kw.items()}))
        feat, cache = orig_chunk(**kw)
        log.append(("  -> feat", _shape(feat)))
        return feat, cache

    flow.inference_chunk = inference_chunk

    def est_pre(_mod, args, kwargs):
        att = kwargs.get("att_cache")
        log.append(("  decoder.forward_chunk att_cache in", _shape(att)))

    flow.decoder.register_forward_pre_hook(est_pre, with_kwargs=True)

    def hift_pre(_mod, args, kwargs):
        log.append(("hift.forward", [_shape(a) for a in args] + [_shape(kwargs)]))

    t2w.hift.register_forward_pre_hook(hift_pre, with_kwargs=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-transcription", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, {W.DIST_NAME} "
        f"{W.installed_version()}"
    )
    chunks = W.token_stream(args.seed, args.chunks)

    t0 = time.perf_counter()
    W.import_stepaudio2()
    t1 = time.perf_counter()
    flow, _ = W.build_flow(args.seed)
    hift, _ = W.build_hift(args.seed)
    t2 = time.perf_counter()
    del flow, hift
    a = W.build_token2wav(args.seed)
    t3 = time.perf_counter()
    print(
        f"import {t1 - t0:.2f}s; weights (flow+hift) {t2 - t1:.2f}s; "
        f"build_token2wav incl. setup_cache {t3 - t2:.2f}s"
    )
    print("refilled all-zero params:", {k: len(v) for k, v in a.bench.refilled_params.items()})
    sc = a.stream_cache
    buf = a.flow.decoder.att_cache_buffer
    print(
        "CFM att_cache_buffer",
        _shape(buf),
        hex(buf.data_ptr()),
        "cnn_cache_buffer",
        _shape(a.flow.decoder.cnn_cache_buffer),
        hex(a.flow.decoder.cnn_cache_buffer.data_ptr()),
        "rand_noise",
        _shape(a.flow.decoder.rand_noise),
    )
    print(
        "DiT att_cache_buffer",
        _shape(a.flow.decoder.estimator.att_cache_buffer),
        "DiT cnn_cache_buffer",
        _shape(a.flow.decoder.estimator.cnn_cache_buffer),
    )
    print(
        "after setup:",
        {k: (_shape(v), hex(v.data_ptr())) for k, v in sc.items()},
        "hift:",
        _shape(a.hift_cache_dict),
    )

    log: list = []
    _instrument(a, log)
    pcm_a, times = [], []
    for i, c in enumerate(chunks):
        log.clear()
        t = time.perf_counter()
        pcm_a.append(W.stream_chunk(a, c.tokens, c.last_chunk))
        times.append(time.perf_counter() - t)
        sc = a.stream_cache
        print(
            f"chunk {i}: {len(c.tokens)} tokens last={c.last_chunk} -> {pcm_a[-1].shape[0]} "
            f"samples in {times[-1]:.2f}s; carries {W.carry_lengths(a)}"
        )
        for k in (
            "estimator_att_cache",
            "conformer_att_cache",
            "estimator_cnn_cache",
            "conformer_cnn_cache",
        ):
            v = sc[k]
            print(
                f"   {k} {_shape(v)} ptr {hex(v.data_ptr())}"
                f"{' (= CFM buffer)' if v.data_ptr() == buf.data_ptr() else ''}"
            )
        print("   hift_cache_dict", _shape(a.hift_cache_dict))
        for name, what in log:
            print("   ", name, what)
    print("per-chunk s:", [round(x, 2) for x in times])

    b = W.build_token2wav(args.seed)
    pcm_b = [W.stream_chunk(b, c.tokens, c.last_chunk) for c in chunks]
    same = [torch.equal(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(pcm_a, pcm_b)]
    print("fresh rebuild, same seed, torch.equal per chunk:", same)

    if not args.skip_transcription:
        c_ = W.build_token2wav(args.seed)
        pcm_c = [_transcribed_stream(c_, c.tokens, c.last_chunk) for c in chunks]
        same = [torch.equal(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(pcm_a, pcm_c)]
        print("proxied vendor stream() vs line-by-line transcription, torch.equal:", same)
    print(
        "pcm stats: std",
        float(np.concatenate(pcm_a).std()),
        "max|x|",
        float(np.abs(np.concatenate(pcm_a)).max()),
    )


if __name__ == "__main__":
    main()
