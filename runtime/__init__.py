"""duplexcadence.runtime — the model-agnostic exact-replay runtime.

Generated adapters import only this package (and torch). It names no model,
decoder or operator and never imports the compiler. Its public names are the ones
re-exported here (and ``duplexcadence.runtime.serve``, Ray, imported on demand); the
modules behind them are laid out by concept, each folder's ``__init__`` saying what
its layer guarantees, imports going one way only (tests/test_runtime_layers.py):

  telemetry, controls, progress, audit   leaves: the logger and reports, the replay
                                         switch and strict mode, progress bars,
                                         bitwise comparison; they import no runtime
  state/    where persistent tensors live: regions, retention, carry, cow, counters,
            pins, folds, sites and site_reads, trees, layouts
  engine/   one callable, one graph per exact signature: replay (+ replay_capture,
            replay_telemetry, replay_entry), signature, classes, backend (the only
            CUDA-graph code), host_program, hoist, effects, ambient, determinism,
            capture_state, outputs, calls, per_row, staging, staged_int
  serving/  a contract bound to a model: declared, binder, binding (+ binding_report,
            capture_section), lane (+ lane_engines, lane_values), params, sessions
            (the pool) and session, session_state, lane_scheduler, eager_lock,
            undeclared
  tools/    a bound model against its stock self: streams, verify, reproduce (+
            reproduce_records, op_trace), paired_streams, trace_draft, draft_findings
  serve/    Ray Serve: replicas per GPU, an ingress with session affinity
"""

from .audit import AuditRecord, bitwise_equal, first_difference
from .engine.backend import CudaGraphBackend, FakeGraphBackend, GraphBackend
from .state.carry import CarryRegion
from .engine.classes import (
    CaptureClass,
    CatalogDecl,
    OneOf,
    RegionViews,
    RegionView,
    TensorSpec,
    materialize,
    staging_bytes,
)
from .state.counters import Advance, HostCounter, Tracks
from .controls import (
    ReplayMiss,
    replay_enabled,
    replay_switch,
    set_replay_enabled,
    set_strict,
    strict,
    strict_mode,
)
from .state.cow import CopyOnWrite
from .engine.ambient import Autocast
from .engine.determinism import (
    KNOWN_SETTINGS,
    apply_settings,
    determinism_settings,
    pin_determinism,
    restore_settings,
)
from .engine.effects import Effect
from .engine.outputs import OutputPlan
from .state.regions import Region, RegionSpec
from .engine.replay import ExactShapeReplay
from .state.retention import HeadTail, Retention, Ring, Segment, Window
from .engine.signature import CatalogDispatch, Miss, signature_and_leaves, signature_of
from .telemetry import LOGGER, format_report

__all__ = [
    "AuditRecord",
    "bitwise_equal",
    "first_difference",
    "CudaGraphBackend",
    "FakeGraphBackend",
    "GraphBackend",
    "CarryRegion",
    "CaptureClass",
    "CatalogDecl",
    "OneOf",
    "RegionViews",
    "RegionView",
    "TensorSpec",
    "materialize",
    "staging_bytes",
    "ReplayMiss",
    "replay_enabled",
    "replay_switch",
    "set_replay_enabled",
    "set_strict",
    "strict",
    "strict_mode",
    "CopyOnWrite",
    "Autocast",
    "KNOWN_SETTINGS",
    "apply_settings",
    "determinism_settings",
    "pin_determinism",
    "restore_settings",
    "Effect",
    "OutputPlan",
    "Region",
    "RegionSpec",
    "ExactShapeReplay",
    "HeadTail",
    "Retention",
    "Ring",
    "Segment",
    "Window",
    "CatalogDispatch",
    "Miss",
    "signature_and_leaves",
    "signature_of",
    "LOGGER",
    "format_report",
]

# Binding sites, the binder generated bind() functions call, lanes and sessions.
from .serving.binding import Binding, infer_device  # noqa: E402
from .serving.binder import Dispatcher, bind_contract  # noqa: E402
from .serving.declared import (  # noqa: E402
    Aliased,
    BatchDecl,
    CallableDecl,
    ConstantDecl,
    ContractDecl,
    Control,
    Counter,
    FoldDecl,
    Guard,
    RegionDecl,
    RegionTable,
    Retains,
    StateObject,
)
from .state.channel import Channel, ChannelDecl, ChannelError  # noqa: E402
from .state.control_outputs import ControlError  # noqa: E402
from .state.folds import FoldError  # noqa: E402
from .serving.lane import Lane, LaneError  # noqa: E402
from .serving.params import ParamDecl, ParamError  # noqa: E402
from .state.pins import pin_at  # noqa: E402
from .serving.lockstep_audit import ShadowAudit  # noqa: E402
from .serving.lockstep_proof import LockstepNotProven, LockstepProof  # noqa: E402
from .tools.lockstep_proof import prove_lockstep  # noqa: E402
from .serving.sessions import (  # noqa: E402
    NoLaneAvailable,
    Session,
    SessionBusy,
    SessionError,
    SessionPool,
    SessionRequired,
)
from .state.sites import (
    SiteError,
    get_at,
    has_site,
    parse_path,
    replace_at,
    require_sites,
    set_at,
    update_at,
)  # noqa: E402

__all__ += [
    "Channel",
    "ChannelDecl",
    "ChannelError",
    "LockstepNotProven",
    "LockstepProof",
    "prove_lockstep",
    "ShadowAudit",
    "ParamDecl",
    "ParamError",
    "Aliased",
    "BatchDecl",
    "CallableDecl",
    "ConstantDecl",
    "ContractDecl",
    "Control",
    "ControlError",
    "Counter",
    "Guard",
    "FoldDecl",
    "FoldError",
    "Dispatcher",
    "Lane",
    "LaneError",
    "NoLaneAvailable",
    "RegionDecl",
    "RegionTable",
    "Retains",
    "StateObject",
    "Session",
    "SessionBusy",
    "SessionError",
    "SessionPool",
    "SessionRequired",
    "bind_contract",
    "Advance",
    "HostCounter",
    "Tracks",
    "pin_at",
    "Binding",
    "infer_device",
    "SiteError",
    "get_at",
    "has_site",
    "parse_path",
    "replace_at",
    "require_sites",
    "set_at",
    "update_at",
]
