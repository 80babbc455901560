"""Channels (runtime/state/channel.py): a producer's append-only buffer that another
call reads, its readiness recorded per tick and replayed (issue 25)."""

from __future__ import annotations

import importlib
import threading
import types

import pytest
import torch

from duplexcadence.compiler.driver import compile_source
from duplexcadence.compiler.loader import forget, import_generated
from duplexcadence.runtime import Channel, ChannelDecl, ChannelError

DECL = ChannelDecl("candidates", "int64", capacity=12, batch=4, clock="round")


def test_published_entries_are_read_once_ready_and_each_tick_is_recorded():
    ch = Channel(DECL, "cpu")
    assert ch.ready() == 0 and ch.read(0, 0) == []
    ch.publish(torch.tensor([5, 6, 7]))
    ch.publish(torch.tensor([8]))
    assert ch.ready() == 4 and ch.read(1, 4) == [6, 7, 8]
    assert ch.read(9, 9) == []  # a reader's cursor past what is ready reads nothing
    assert ch.schedule == [0, 4] and ch.contents() == [5, 6, 7, 8]


def test_bad_publishes_and_reads_fail_before_anything_is_copied():
    ch = Channel(DECL, "cpu")
    with pytest.raises(ValueError, match="1..4 entries, got 5"):
        ch.publish(torch.arange(5))
    with pytest.raises(ValueError, match="got 0"):
        ch.publish(torch.tensor([], dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.int32, declared int64"):
        ch.publish(torch.tensor([1], dtype=torch.int32))
    with pytest.raises(TypeError, match="takes a tensor"):
        ch.publish([1, 2])
    for _ in range(3):
        ch.publish(torch.arange(4))
    with pytest.raises(ChannelError, match="past its capacity 12"):
        ch.publish(torch.tensor([1]))
    assert ch.published == 12 and ch.ready() == 12
    with pytest.raises(ChannelError, match="read 10..13 outside the 12 entries ready"):
        ch.read(10, 13)


def test_a_declaration_is_checked_where_it_is_made():
    with pytest.raises(ValueError, match="batch 5 must be in 1..capacity 4"):
        ChannelDecl("c", "int64", capacity=4, batch=5, clock="round")
    with pytest.raises(ValueError, match="dtype 'complex64'"):
        ChannelDecl("c", "complex64", capacity=4, batch=1, clock="round")
    with pytest.raises(TypeError, match="capacity must be an int"):
        ChannelDecl("c", "int64", capacity=4.0, batch=1, clock="round")


def test_a_replay_reads_what_the_recorded_run_had_ready_and_no_more():
    live = Channel(DECL, "cpu")
    live.publish(torch.tensor([1, 2]))
    live.ready()
    live.publish(torch.tensor([3, 4, 5]))
    live.ready()
    replay = Channel(DECL, "cpu", replay=[0, *live.schedule])
    replay.publish(torch.tensor([1, 2]))
    replay.publish(torch.tensor([3, 4, 5]))
    assert [replay.ready() for _ in range(3)] == [0, 2, 5] and replay.read(0, 5) == [1, 2, 3, 4, 5]
    with pytest.raises(ChannelError, match="tick 3 is past the 3 ticks"):
        replay.ready()
    short = Channel(DECL, "cpu", replay=[6])
    short.publish(torch.tensor([1, 2]))
    with pytest.raises(ChannelError, match="6 entries ready at tick 0, only 2 were published"):
        short.ready()


def test_a_producer_thread_and_a_reader_lose_nothing_and_readiness_never_goes_back():
    decl = ChannelDecl("c", "int64", capacity=4000, batch=8, clock="round")
    ch = Channel(decl, "cpu")

    def produce():
        for start in range(0, 4000, 8):
            ch.publish(torch.arange(start, start + 8))

    producer = threading.Thread(target=produce)
    producer.start()
    seen = []
    while not seen or seen[-1] < 4000:
        seen.append(ch.ready())
    producer.join()
    assert all(a <= b for a, b in zip(seen, seen[1:])) and ch.schedule == seen
    assert ch.read(0, 4000) == list(range(4000))


def test_a_contract_declares_its_channel_and_the_generated_contract_carries_it():
    text = """contract chan
clock round = 1 per call
const positions = 448
callable step {
  site model.step
  per round
  arg x: float32 [1, 4]
}
channel candidates {
  dtype int64
  dims [positions]
  batch 8
  clock round
}
"""
    result = compile_source(text, "chan.clock")
    assert result.ok, result.diagnostics
    assert "CHANNELS = (" in result.files["contract.py"]
    package = import_generated(result.files, prefix="chanpkg")
    try:
        declared = importlib.import_module(f"{package.__name__}.contract").DECLARED
        assert declared.channel("candidates") == ChannelDecl(
            "candidates", "int64", capacity=448, batch=8, clock="round"
        )
        with pytest.raises(KeyError, match="no channel 'drafts' \\(it has: candidates\\)"):
            declared.channel("drafts")
        adapter = importlib.import_module(f"{package.__name__}.adapter")
        model = types.SimpleNamespace(model=types.SimpleNamespace(step=lambda x: x + 1))
        binding = adapter.bind(model, device="cpu", progress=False)
        assert (
            "channel candidates: 448 x int64, published up to 8 at a time, readiness "
            "recorded per round" in binding.report()
        )
        binding.unbind()
    finally:
        forget(package)


@pytest.mark.cuda
def test_on_cuda_an_entry_is_ready_once_its_copy_completed():
    ch = Channel(DECL, "cuda")
    side = torch.cuda.Stream()
    # first uses synchronise (kernel modules load lazily, the host allocator starts):
    # a throwaway channel publishes once so the timed publish below is what a producer's is
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        Channel(DECL, "cuda").publish(torch.arange(4, device="cuda"))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the copy waits behind ~tens of ms of work
        ch.publish(torch.arange(4, device="cuda"))
    assert ch.ready() == 0  # the event has not completed
    side.synchronize()
    assert ch.ready() == 4 and ch.read(0, 4) == [0, 1, 2, 3]


def test_producers_on_several_threads_append_whole_batches_and_lose_none():
    decl = ChannelDecl("c", "int64", capacity=4 * 400, batch=4, clock="round")
    ch = Channel(decl, "cpu")

    def produce(p: int) -> None:
        for b in range(100):
            ch.publish(torch.full((4,), p * 1000 + b))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ch.ready() == 1600
    entries = ch.read(0, 1600)
    batches = [entries[i : i + 4] for i in range(0, 1600, 4)]
    assert all(len(set(b)) == 1 for b in batches)  # no batch interleaved with another
    assert sorted(b[0] for b in batches) == sorted(
        p * 1000 + b for p in range(4) for b in range(100)
    )
