"""duplexcadence.runtime — the model-agnostic exact-replay runtime.

Generated adapters import only this package (and torch). It names no model,
decoder or operator and never imports the compiler. Layers, one concept each:

  regions      RegionSpec, Region: one allocation, one address, views by extent
  retention    HeadTail, Window, Ring: integer plans + stock references
  carry        CarryRegion: retention by in-place writeback, audit, snapshot/restore
  cow          CopyOnWrite: shared immutable state, private copy on first write
  audit        bitwise comparison and divergence records
  signature    signature_of, CatalogDispatch, Miss and the miss reasons
  classes      CaptureClass, TensorSpec, RegionView (catalog entries by example),
               CatalogDecl, OneOf (a catalog as rows)
  effects      Effect, host RNG snapshot/compare
  backend      CudaGraphBackend, FakeGraphBackend (the only CUDA-graph code)
  host_program what a graph freezes of a call's host side; simulate checks it
  outputs      the output rule (regions as-is, everything else cloned)
  replay       ExactShapeReplay: capture_all, admission, replay, counters
  capture_state CaptureSnapshot: what capture saves and puts back (transparency)
  counters     HostCounter: host ints a stock body advances, kept by the engine
  pins         pin_at: one tensor at a site the stock code rebinds every call
  controls     disable switch, strict mode, ReplayMiss
  ambient      the torch settings a replay keys on (autocast, backend flags, modes)
  determinism  apply/restore/pin the contract's determinism settings
  telemetry    the "duplexcadence" logger, format_report
  declared     ContractDecl and its parts: what generated code declares (data only)
  params       session parameters: a value's catalog, ParamError, graphs per value
  lane         Lane: one set of regions, engines, pool, stream and generator
  binding      Binding: what bind() installed; the eager section
  binder       bind_contract, Dispatcher (what the model calls)
  sessions     SessionPool, Session: many exact streams on one binding
  undeclared   model tensors a contract leaves out, found before a second lane
  trees        tensor leaves of containers; state kept in a model's shared objects
  site_reads   SiteReads: many sites read per call, path rules checked once per chain
  streams      StreamSpec: build a stock model, drive its loop (verify, draft)
  calls        CallConvention: a caller's arguments in the contract's declared form
  verify       verify_stream: a bound copy beside a stock copy, first divergence named
"""

from .audit import AuditRecord, bitwise_equal, first_difference
from .backend import CudaGraphBackend, FakeGraphBackend, GraphBackend
from .carry import CarryRegion
from .classes import (
    CaptureClass,
    CatalogDecl,
    OneOf,
    RegionView,
    TensorSpec,
    materialize,
    staging_bytes,
)
from .counters import HostCounter
from .controls import (
    ReplayMiss,
    replay_enabled,
    replay_switch,
    set_replay_enabled,
    set_strict,
    strict,
    strict_mode,
)
from .cow import CopyOnWrite
from .ambient import Autocast
from .determinism import (
    KNOWN_SETTINGS,
    apply_settings,
    determinism_settings,
    pin_determinism,
    restore_settings,
)
from .effects import Effect
from .outputs import OutputPlan
from .regions import Region, RegionSpec
from .replay import ExactShapeReplay
from .retention import HeadTail, Retention, Ring, Segment, Window
from .signature import CatalogDispatch, Miss, signature_and_leaves, signature_of
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
from .binding import Binding, infer_device  # noqa: E402
from .binder import Dispatcher, bind_contract  # noqa: E402
from .declared import (  # noqa: E402
    Aliased,
    CallableDecl,
    ConstantDecl,
    ContractDecl,
    Counter,
    FoldDecl,
    RegionDecl,
    RegionTable,
    Retains,
)
from .folds import FoldError  # noqa: E402
from .lane import Lane, LaneError  # noqa: E402
from .params import ParamDecl, ParamError  # noqa: E402
from .pins import pin_at  # noqa: E402
from .sessions import (  # noqa: E402
    NoLaneAvailable,
    Session,
    SessionBusy,
    SessionError,
    SessionPool,
    SessionRequired,
)
from .sites import (
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
    "ParamDecl",
    "ParamError",
    "Aliased",
    "CallableDecl",
    "ConstantDecl",
    "ContractDecl",
    "Counter",
    "FoldDecl",
    "FoldError",
    "Dispatcher",
    "Lane",
    "LaneError",
    "NoLaneAvailable",
    "RegionDecl",
    "RegionTable",
    "Retains",
    "Session",
    "SessionBusy",
    "SessionError",
    "SessionPool",
    "SessionRequired",
    "bind_contract",
    "HostCounter",
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
