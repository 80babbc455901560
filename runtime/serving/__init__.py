"""Serving: a contract bound to a model, its lanes, its sessions and their values.

Contract of this layer. ``bind_contract`` (binder) reads what generated code declares
(declared) and installs a ``Binding`` (binding): regions at the model's sites, one
engine per callable on each ``Lane`` (lane; a lane at a session parameter's value:
lane_values, params). A ``SessionPool`` (sessions) serves many exact streams on K
lanes: a session's state is its own (session_state), a ``LaneScheduler``
(lane_scheduler) gives a step a lane that holds its value and runs captures between
steps, eager sections share one lock (eager_lock), and tensors a contract leaves out
are found before a second lane exists (undeclared). Built on the engine and state;
the tools and Ray ``serve`` build on it.
"""
