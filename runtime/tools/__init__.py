"""Tools: a bound model checked against its stock self, and contracts drafted.

Contract of this layer. A user's stream (streams: build an unmodified model, drive
its loop) is streamed twice: ``verify_stream`` (verify) beside a bound copy, first
divergence named; ``reproduce_stream`` (reproduce, op_trace) beside a second stock
copy, to show the reference is a function of its input; both pair their copies the
same way (paired_streams). ``trace_draft`` and ``draft_findings`` record a stock run
and say what a contract would declare. ``batch_rows`` proves, op by op, which kernels
give a row the same bits in a batch as alone, and runs named ops per row (``PerRow``).
They use serving as a user does and are used only by the compiler's CLI, the benchmarks
and people.
"""
