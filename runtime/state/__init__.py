"""State: where a contract's persistent tensors live and how much of them stays live.

Contract of this layer. It knows tensors, shapes and the paths that name them in a
model, never a callable or a graph: a ``Region`` is one allocation at one address
(regions), views by extent; a retention policy (retention) says which extent of a
growing history is live; a ``CarryRegion`` keeps it by in-place writeback (carry),
``CopyOnWrite`` shares an immutable one (cow); ``HostCounter`` (counters) and
``pin_at`` (pins) hold the host ints and rebound attributes a stock body keeps;
``fold`` weights are folded once (folds); sites (sites, site_reads) are the closed
path language into a model and its calls; trees and layouts map containers and move
views between a lane's and a session's layout. It imports only the runtime's leaf
modules (telemetry, audit); the engine and serving build on it.
"""
