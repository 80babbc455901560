"""Moshi served as many sessions in one process (``python -m bench.cadence --workload
bench.sessions_moshi``); the vendor's server serves one connection at a time.

Moshi keeps a stream's state inside its modules (every streaming module's
``_streaming_state``: the LM and Mimi ring KV caches, conv states, the LMGen delay
cache, host step counters), so a session's state is that set of objects, swapped in
place around every step (``runtime/trees.SharedState``) on one replay lane — the
modules are one set. A session is a client of the server's loop: a connection starts
with ``mimi.reset_streaming(); lm_gen.reset_streaming()`` and then sends one 80 ms frame
at a time (``step_frame``, the loop body). Its input frames come from its seed
(``pcm_stream``); its token IDs and float32 PCM are compared with the same session run
alone on the unbound stock model (``stock_solo``: one process, the sessions one after
another, each from a fresh connection). Full 7B LM in bf16 + Mimi fp32, seeded random
weights, greedy, ``NO_TORCH_COMPILE=1`` and the vendor's graphs off in every worker.

The ``moshi_batch<W>`` arms serve up to W sessions in lockstep instead
(``LockstepSessions``): one batched call per tick for all of them, on the adapter bound
at ``batch=W`` (contracts/moshi.clock's lockstep), each session's bytes still compared
with its solo stock run.
"""

from __future__ import annotations

import copy
import types
from typing import Any

import torch

from bench.cadence import Arm, Chunk, SessionSpec, SessionWorkload
from bench.harness import Stream, replay
from bench.workloads import moshi as W

MODEL_SEED = 0
FRAME_S = W.FRAME_SAMPLES / 24_000  # Moshi's frame: 80 ms of 24 kHz audio
PROOF_FRAMES = 2  # frames a proven arm proves its rows over at set-up (prove_at_width)


def connect(mimi: Any, lm_gen: Any) -> None:
    """What the server does for each new connection: reset every streaming state."""
    mimi.reset_streaming()
    lm_gen.reset_streaming()


def state_roots(mimi: Any, lm_gen: Any):
    """The objects that hold one stream's state: the streaming state of every module
    (``LMGen.get_streaming_state()`` does not reach the LM's own transformer states,
    which LMGen enters through its exit stack, so every submodule is asked)."""

    def roots() -> list:
        return [
            m._streaming_state
            for top in (mimi, lm_gen)
            for m in top.modules()
            if getattr(m, "_streaming_state", None) is not None
        ]

    return roots


def frame_outputs(tokens: list, pcm: list) -> dict:
    if not tokens:  # before the codebook delay: no output yet
        return {"tokens": None, "pcm": None}
    return {"tokens": tokens[0][0, :, 0].cpu(), "pcm": pcm[0].float().cpu()}


class _Session:
    def __init__(self, spec: SessionSpec) -> None:
        self.spec = spec
        self.frames = W.pcm_stream(spec.seed, len(spec.chunks))
        self.pool_session: Any = None


class StockSolo:
    """The unbound stock model serving one connection at a time (the reference)."""

    def __init__(self, arm: Arm, device: torch.device, lm_kwargs: dict | None = None) -> None:
        self.mimi, self.lm_gen = W.build_moshi(
            MODEL_SEED, device, lm_kwargs=lm_kwargs or W.FULL_7B, greedy=True
        )

    def open(self, spec: SessionSpec) -> _Session:
        connect(self.mimi, self.lm_gen)
        return _Session(spec)

    def submit(self, s: _Session, chunk: Chunk) -> dict:
        return frame_outputs(*W.step_frame(self.mimi, self.lm_gen, s.frames[chunk.seq]))

    def reset(self, s: _Session) -> None:
        """Moshi is full duplex: a turn does not restart the stream."""

    def close(self, s: _Session) -> None:
        s.frames = []


class AdapterSessions(StockSolo):
    """Sessions on the generated adapter (contracts/moshi.clock), one lane."""

    def __init__(self, arm: Arm, device: torch.device, lm_kwargs: dict | None = None) -> None:
        super().__init__(arm, device, lm_kwargs)
        self.binding = W.bind_adapter(self.mimi, self.lm_gen, device)  # NO_CUDA_GRAPH=1
        self.pool = self.binding.sessions(lanes=1, progress=False)
        self.roots = state_roots(self.mimi, self.lm_gen)

    def open(self, spec: SessionSpec) -> _Session:
        s = _Session(spec)
        s.pool_session = self.pool.open(None, seed=spec.seed, shared=self.roots)
        s.pool_session.run(connect, self.mimi, self.lm_gen)
        return s

    def submit(self, s: _Session, chunk: Chunk) -> dict:
        out = s.pool_session.run(W.step_frame, self.mimi, self.lm_gen, s.frames[chunk.seq])
        return frame_outputs(*out)

    def close(self, s: _Session) -> None:
        s.pool_session.close()

    def stats(self) -> dict:
        return replay.sessions_record(self.binding)


class BatchedMoshi:
    """The stock pair streaming at ``width`` rows, one per session, with what a tick
    needs: the vendor's own batched streaming state (``streaming(width)``), a session
    opening resets its row (``reset_streaming(mask)``), a tick that leaves a session out
    holds its row (``set_exec_mask``), and ``support_out_of_sync`` lets rows run at
    their own frame counts. One thing is wired around it: a row's first ``max_delay``
    frames give no output alone (``LMGen.step`` returns None and the server decodes
    nothing), so each tick the Mimi decoder runs only the rows that have output (one
    exec mask shared by the decoder's streaming states, set from the LM's own per-row
    offsets) and the other rows decode zeros that their held state never sees."""

    def __init__(self, mimi: Any, lm_gen: Any, width: int) -> None:
        self.mimi, self.lm_gen, self.width = mimi, lm_gen, width
        W.start_streaming(mimi, lm_gen, width)
        lm_gen.support_out_of_sync = True
        self.device = next(mimi.parameters()).device
        # one exec mask tensor for the rows a tick runs (every streaming state but the
        # decoder's: holding rows is one copy, where the vendor's set_exec_mask copies
        # into each module's own mask, ~20 ms a call), and one for the decoder's rows
        self.run_rows = torch.ones(width, dtype=torch.bool, device=self.device)
        self.decode_rows = torch.ones(width, dtype=torch.bool, device=self.device)
        _share_exec_mask((mimi, lm_gen), self.run_rows)
        _share_exec_mask((mimi.decoder, mimi.decoder_transformer, mimi.upsample), self.decode_rows)
        self.stage_ms: list[tuple[float, float, float]] | None = None  # bench.lockstep_ticks

    def tick(self, pcm: torch.Tensor) -> dict:
        """One frame of every slot: encode, LM step, decode the rows with output. The
        sessions hand their frames in on the host and the tick copies them to the device
        at once: one copy a tick from the ticker's thread, not one per session from its
        client's thread between the tick's launches."""
        from moshi.utils.compile import no_compile

        state = self.lm_gen._streaming_state
        marks = self._marks()
        pcm = pcm.to(self.device)
        with torch.no_grad(), no_compile():
            marks[0].record()
            codes = self.mimi.encode(pcm)
            marks[1].record()
            tokens = self.lm_gen.step(codes[:, :, 0:1])
            marks[2].record()
            ready = (state.offsets > self.lm_gen.max_delay) & state.exec_mask
            self.decode_rows.copy_(ready)
            safe = torch.where(ready[:, None, None], tokens, torch.zeros_like(tokens))
            out = self.mimi.decode(safe[:, 1:])
            marks[3].record()
        result = {"ready": ready.cpu(), "tokens": tokens.cpu(), "pcm": out.float().cpu()}
        if self.stage_ms is not None and self.device.type == "cuda":  # events completed
            self.stage_ms.append(tuple(a.elapsed_time(b) for a, b in zip(marks, marks[1:])))
        return result

    def _marks(self) -> list:
        """CUDA events around the three graphs while ``stage_ms`` records; else no-ops."""
        if self.stage_ms is None or self.device.type != "cuda":
            return [types.SimpleNamespace(record=lambda: None)] * 4
        return [torch.cuda.Event(enable_timing=True) for _ in range(4)]

    def reset_rows(self, mask: torch.Tensor) -> None:
        """A session opens on the rows in ``mask``: the server's per-connection reset,
        those rows only."""
        state = self.lm_gen._streaming_state
        ticks = state.offset_cpu
        with torch.no_grad():
            self._sync()
            self.mimi.reset_streaming(mask)
            self.lm_gen.reset_streaming(mask)
            self._sync()
        # LMGen's reset zeroes its host step count for every row; with rows out of sync
        # it only counts ticks (never read per row), and at 0 the next LM step would run
        # eager (the contract's counter starts at 1) for every session of that tick
        state.offset_cpu = ticks

    def hold_rows(self, mask: torch.Tensor) -> None:
        """The rows in ``mask`` run this tick; the others keep their state (what the
        vendor's ``set_exec_mask`` does, in one copy: the states share ``run_rows``)."""
        self.run_rows.copy_(mask)
        self.decode_rows.copy_(mask)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class LockstepSessions(BatchedMoshi):
    """Sessions in lockstep on the adapter bound at ``batch=W`` (``arm.options["width"]``)
    over a ``BatchedMoshi`` of W rows: each tick one call of each graph for every
    session (runtime/serving/lockstep.py). With ``prove_frames`` the binding admits the
    proof of its rows made at set-up; with ``audit_every`` the pool audits live ticks
    against a batch-1 shadow (``shadow_audit``)."""

    def __init__(self, arm: Arm, device: torch.device, lm_kwargs: dict | None = None) -> None:
        width = arm.options["width"]
        mimi, lm_gen = W.build_moshi(
            MODEL_SEED, device, lm_kwargs=lm_kwargs or W.FULL_7B, greedy=True, start=False
        )
        frames = arm.options.get("prove_frames")
        proof = prove_at_width(mimi, lm_gen, width, frames) if frames else None
        every = arm.options.get("audit_every")
        audit = shadow_audit(mimi, lm_gen, every) if every else None  # before it streams
        super().__init__(mimi, lm_gen, width)
        self.binding = W.bind_adapter(mimi, lm_gen, device, batch=width, proof=proof)
        # the LM step's first call after bind runs eager (its counter starts at 1): made
        # here, every row held, so no session's tick pays for it
        self.hold_rows(torch.zeros(width, dtype=torch.bool))
        self.tick(torch.zeros(width, 1, W.FRAME_SAMPLES, device=self.device))
        # ticks on Moshi's own clock, one per frame period (or earlier once every
        # session is in): sessions' frames arrive at their own phases, each waits at
        # most a period and is served within a period plus one tick
        self.pool = self.binding.lockstep(
            self.tick, reset=self.reset_rows, hold=self.hold_rows, period_s=FRAME_S, audit=audit
        )

    def open(self, spec: SessionSpec) -> _Session:
        s = _Session(spec)
        s.pool_session = self.pool.open()
        return s

    def submit(self, s: _Session, chunk: Chunk) -> dict:
        return self.receive(self.send(s, chunk))[0]

    def send(self, s: _Session, chunk: Chunk) -> Any:
        """Hand in a frame without waiting for its output (a full-duplex client's audio
        keeps coming): frames queue per session, served in order (lockstep.py)."""
        return s.pool_session.submit(s.frames[chunk.seq])  # on the host: one copy a tick

    def receive(self, frame: Any) -> tuple[dict, float]:
        """A sent frame's outputs (as ``frame_outputs``) and when its tick ended."""
        out = frame.result()
        if not bool(out["ready"]):
            return {"tokens": None, "pcm": None}, frame.done_at
        return {"tokens": out["tokens"][0, :, 0], "pcm": out["pcm"]}, frame.done_at

    def reset(self, s: _Session) -> None:
        """Moshi is full duplex: a turn does not restart the stream."""

    def close(self, s: _Session) -> None:
        s.pool_session.close()

    def stats(self) -> dict:
        if self.pool.auditor is not None:
            self.pool.auditor.drain()  # its checks of the frames so far (stats say "behind")
        return {
            **replay.sessions_record(self.binding),
            "lockstep": self.pool.stats(),
            "lockstep_timeline": self.pool.timeline,
            "lockstep_proof": (
                None
                if self.binding.lockstep_proof is None
                else self.binding.lockstep_proof.summary()
            ),
        }


def _share_exec_mask(roots: tuple, mask: torch.Tensor) -> None:
    """Every streaming state under ``roots`` reads its exec mask from ``mask`` (set
    before binding: the graphs capture the mask's address)."""
    for top in roots:
        for m in top.modules():
            state = getattr(m, "_streaming_state", None)
            if state is not None:
                if state.exec_mask.shape != mask.shape:  # CFG doubles the LM's rows
                    raise ValueError(f"{type(m).__name__}: exec mask {state.exec_mask.shape}")
                state.exec_mask = mask


def shadow_audit(mimi: Any, lm_gen: Any, every: int) -> Any:
    """The pool's run-time audit (runtime/serving/lockstep_audit.py): a batch-1 shadow of
    the tick on a copy of the pair that shares its weights (read only; buffers and
    streaming state are its own), made before the pair streams or is bound, so the
    shadow runs the stock eager code. It follows every ``every``-th session opened and
    compares what the session receives (``LockstepSessions.receive``)."""
    from duplexcadence.runtime import ShadowAudit

    weights = {id(p): p for top in (mimi, lm_gen) for p in top.parameters()}
    shadow = BatchedMoshi(*copy.deepcopy((mimi, lm_gen), weights), width=1)
    new_session = torch.ones(1, dtype=torch.bool, device=shadow.device)
    return ShadowAudit(
        shadow.tick, lambda: shadow.reset_rows(new_session), every=every, view=received
    )


def received(out: dict) -> dict:
    """What a session receives of its row of a tick: nothing before the codebook delay
    (the rows without output decode zeros nobody gets)."""
    return out if bool(out["ready"]) else {"ready": out["ready"]}


def prove_at_width(mimi: Any, lm_gen: Any, width: int, frames: int) -> Any:
    """The proof of contracts/moshi.clock's rows at ``width`` (runtime/tools/
    lockstep_proof.py) on this pair before it streams for serving: ``frames`` seeded
    frames at batch 1 (session 0), then at ``width`` (session r in row r), each through
    the vendor's loop (bench.batch_rows.stream)."""
    from bench.batch_rows import frames_at, stream
    from duplexcadence.generated.moshi.contract import DECLARED
    from duplexcadence.runtime import prove_lockstep

    model = types.SimpleNamespace(mimi=mimi, lm_gen=lm_gen)
    one, many = frames_at(1, frames), frames_at(width, frames)
    return prove_lockstep(
        model,
        DECLARED,
        width,
        lambda: stream(model, 1, one),
        lambda: stream(model, width, many),
        inputs=f"{frames} frames of seeded PCM, session r in row r",
    )


def server(arm: Arm, device: Any) -> Any:
    if "width" in arm.options:
        return LockstepSessions(arm, device)
    return (AdapterSessions if arm.options.get("adapter") else StockSolo)(arm, device)


SESSIONS = SessionWorkload(
    name="moshi",
    arms=(
        Arm("stock_solo", "procs", "the unbound stock model, one connection at a time (reference)"),
        Arm(
            "moshi_adapter",
            "inproc",
            "the generated adapter, sessions on one lane, state swapped in place",
            options={"adapter": True},
            needs_cuda=True,
        ),
        *(
            Arm(
                f"moshi_batch{w}",
                "inproc",
                f"the generated adapter bound at batch={w}: sessions in lockstep, one "
                "batch row each, one batched call of each graph per tick",
                options={"width": w},
                needs_cuda=True,
            )
            for w in (8, 16, 24, 32)
        ),
        *(
            Arm(
                f"moshi_batch{w}_proven",
                "inproc",
                f"moshi_batch{w}, bound with the proof of its rows at width {w} made at "
                f"set-up (prove_lockstep over {PROOF_FRAMES} frames: each callable's row 0 "
                "against batch 1, op by op); refused unless it proves",
                options={"width": w, "prove_frames": PROOF_FRAMES},
                needs_cuda=True,
            )
            for w in (8, 16, 24, 32)
        ),
        *(
            Arm(
                f"moshi_batch{w}_audited",
                "inproc",
                f"moshi_batch{w}_proven, its live ticks audited: a batch-1 eager shadow "
                "(a copy of the pair sharing its weights) follows one session at a time "
                "and compares each of its frames bit for bit (ShadowAudit)",
                options={"width": w, "prove_frames": PROOF_FRAMES, "audit_every": 1},
                needs_cuda=True,
            )
            for w in (8, 16, 24, 32)
        ),
    ),
    reference="stock_solo",
    streams=(
        Stream("tokens", "int64", key="tokens_sha256", step_key="chunk_tokens_sha256"),
        Stream("pcm", "float32", key="pcm_sha256", step_key="chunk_pcm_sha256"),
    ),
    server=server,
    base_env={"NO_TORCH_COMPILE": "1", "NO_CUDA_GRAPH": "1"},
    determinism=W.DETERMINISM,  # the stock reference reproduces itself only so
)
