"""The replay engine: one callable, its catalog, one graph per exact signature.

Contract of this layer. ``ExactShapeReplay`` (replay, with its capture in
replay_capture and its counters in replay_telemetry) captures each catalog class once
and admits a call fail closed, from integers and enums only: the signature
(signature), the classes as generated code writes them (classes), the torch settings a
replay keys on (ambient, determinism), the random streams a callable draws from
(effects), host constants moved to the constant clock (hoist, host_program), what a
capture must leave as it found it (capture_state), the output rule (outputs) and a
caller's arguments in the declared form (calls), the ops a batched call runs one
row at a time (per_row) and declared counters traced through capture, read live by
the graphs where staged (staging, staged_int). ``backend`` is the only code that
touches CUDA graphs. It builds on state and the leaf modules and knows nothing of
lanes, sessions or contracts as a whole.
"""
