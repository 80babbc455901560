"""``bind_contract``: install a generated contract declaration on a model.

Contract of this layer. Given a model object and the ``ContractDecl`` clockc wrote
(declared.py), ``bind_contract`` checks every binding site first (a wrong model fails
with one error and is left untouched), pins the contract's determinism settings,
builds lane 0 (its regions installed at their sites, carries adopting the live
stock state, one replay engine per capturable callable), moves host constants to the
device, and puts a ``Dispatcher`` at every callable's site. Declared folds (folds.py)
are applied first, before anything is built, read or captured. On CUDA it captures
every catalog before traffic unless told ``capture=False``.

``batch=W`` binds the lockstep declaration of ``W`` sessions (``ContractDecl.at_width``):
every batched callable is called with ``W`` sessions stacked on its batch axis and every
slotted region holds ``W`` sessions' state, one per slot, at one stable address; the ops
a callable names in ``rows`` run one session at a time inside each call (engine/
per_row.py), in eager calls, warm-up and capture alike, so its graphs replay them so.

A ``Dispatcher`` is what the model's code calls instead of the stock callable. Inside
a session's ``run`` it calls the session's lane (sessions.py). Without a session it
calls lane 0, one caller at a time (``Binding.plain_lock``: a binding is one stream,
and any number of threads may use it without crashing or hanging); once the binding
serves a session pool, a call outside every session is refused with a clear error,
since its state would collide with the sessions'.
"""

from __future__ import annotations

from typing import Any

import torch

from ..engine.backend import FakeGraphBackend
from .binding import Binding, infer_device
from .declared import ContractDecl
from ..engine.per_row import RowSetup
from .lockstep_proof import admit
from ..engine.determinism import apply_settings
from ..state.folds import apply_folds, plan_folds
from .lane import Lane
from .params import resolve
from .session import SessionRequired, current_run
from ..state.sites import get_at, require_sites, set_at


class Dispatcher:
    """The callable bind() installs at a hot callable's site."""

    def __init__(self, binding: Binding, name: str) -> None:
        self.binding = binding
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = current_run()
        if run is not None and run.binding is self.binding:
            return run.lane.call(self.name, args, kwargs, run.session)
        b = self.binding
        if b.pool is not None:
            raise SessionRequired(
                f"{b.contract}.{self.name} was called outside every session, but this "
                "binding serves a session pool: call it inside session.run(...)"
            )
        with b.plain_lock:
            return b.lanes[0].call(self.name, args, kwargs, None)

    def __repr__(self) -> str:
        return f"<duplexcadence replay of {self.binding.contract}.{self.name}>"


def bind_contract(
    model: Any,
    decl: ContractDecl,
    *,
    device: Any = None,
    audit: bool = False,
    capture: bool = True,
    progress: bool = True,
    backend: Any = None,
    params: dict | None = None,
    ambient: Any = None,
    batch: int | None = None,
    proof: Any = None,
) -> Binding:
    """Install ``decl`` on ``model`` and return the Binding (see module docstring).

    ``backend``: ``None`` or ``"cuda"`` for CUDA graphs where available (elsewhere
    every call runs eager, by design); ``"simulate"`` for the fake graph backend
    (backend.py) on any device, so the real admission and signature policy runs, and
    is reported, on a CPU before a GPU is at hand: it captures at bind (unless
    ``capture=False``) and each "replay" calls the callable on the captured inputs;
    or a ``GraphBackend`` object (tests). ``ambient``: the autocast states (labels:
    "off", "float32", "float16", ...) this deployment calls its callables under; a
    callable that declares several captures only these (a float32 deployment never
    meets float16: half the catalog, half the capture time), its calls under another
    state run eager (``ambient_state``). None: every declared state. ``batch``: the
    number of sessions in lockstep (module docstring), one of the declared widths;
    None or 1: one session per call. ``proof``: a ``prove_lockstep`` proof of that width
    (tools/lockstep_proof.py), admitted by serving/lockstep_proof.py before anything is installed.
    """
    backend, simulated = _backend(backend)
    width = _batch_width(batch)
    decl = decl.at_width(width)  # ValueError for a width the contract does not declare
    if proof is not None:
        if width == 1:
            raise ValueError("proof= is for a batched binding (bind with batch=W)")
        proof = admit(proof, decl, width)  # LockstepNotProven: nothing installed yet
    served_ambient = _served_ambient(decl, ambient)
    # a carry's site holds the primed stock state; binding before priming
    # (capture=False) may precede it, so capture() checks those sites instead
    require_sites(model, decl.sites_to_check(carries=capture))
    # session parameters: the value this binding serves (ParamError outside the
    # domain, before anything is installed) and, below, the values captured at bind
    key = resolve(decl.params, params)
    # the modules each fold changes, found before anything changes (FoldError if none)
    fold_plan = plan_folds(model, decl.folds)
    device = torch.device(device) if device is not None else infer_device(model)
    binding = Binding(
        decl.name,
        device,
        determinism=apply_settings(decl.determinism),
        model=model,
        decl=decl,
        audit=audit,
        backend=backend,
    )
    binding.served_ambient = served_ambient
    binding.batch, binding.lockstep_proof = width, proof
    if width > 1:
        rows = [op for k in decl.callables if k.batch is not None for op in k.batch.rows]
        binding.rows = RowSetup.for_model(model, rows, device)
    try:
        # weights folded first: every lane, read and capture below sees the folded module
        binding.folds = apply_folds(fold_plan)
        binding.params_key = key
        binding.capture_keys = [
            resolve(decl.params, {p.name: v}) for p in decl.params for v in p.capture
        ]
        for r in decl.regions.values():
            if r.install == "declared":
                binding.declared[r.name] = "declared only: no site and no callable uses it"
        binding.stock_callables = {k.name: get_at(model, k.site) for k in decl.callables}
        binding.lanes.append(Lane(binding, 0, owns_sites=True))
        for c in decl.constants:
            binding.constants[c.name] = _install_constant(binding, c)
        for k in decl.callables:
            if not k.replay:
                binding.eager[k.name] = k.eager_reason
            binding.remember(model, k.site, binding.stock_callables[k.name])
            set_at(model, k.site, Dispatcher(binding, k.name))
        if capture and (device.type == "cuda" or simulated):
            binding.capture(progress=progress)
    except BaseException:
        # put back what was installed so far (callables, constants, folded weights,
        # settings): a model whose bind failed is not left half-bound with no Binding
        # to unbind it by
        binding.unbind()
        raise
    return binding


def _served_ambient(decl: ContractDecl, ambient: Any) -> frozenset[str] | None:
    """The autocast labels a deployment serves (None: all), checked against the
    contract: a label no callable declares is a mistake, not an empty set."""
    if ambient is None:
        return None
    if isinstance(ambient, str) or not all(isinstance(a, str) for a in ambient):
        raise TypeError(f"ambient must be a collection of autocast labels, got {ambient!r}")
    declared = sorted({a.label for k in decl.callables for a in k.ambient})
    unknown = sorted(set(ambient) - set(declared))
    if unknown or not ambient:
        raise ValueError(
            f"ambient {sorted(ambient)}: the contract declares the autocast states "
            f"{declared} (unknown: {unknown or 'none given'})"
        )
    return frozenset(ambient)


def _batch_width(batch: Any) -> int:
    """``batch`` as a width: an int (not a bool), 1 for None."""
    if batch is None:
        return 1
    if type(batch) is not int:
        raise TypeError(f"batch must be an int (sessions per call), got {batch!r}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    return batch


BACKENDS = ("cuda", "simulate")


def _backend(backend: Any) -> tuple[Any, bool]:
    """(the backend object or None, whether it is the simulated one bind named)."""
    if backend is None or not isinstance(backend, str):
        return backend, False
    if backend == "cuda":
        return None, False
    if backend == "simulate":
        return FakeGraphBackend(), True
    raise ValueError(
        f"backend {backend!r}: expected one of {', '.join(BACKENDS)} or a GraphBackend"
    )


def _install_constant(binding: Binding, c: Any) -> str:
    if c.install == "hoisted":
        # rebuilt on the host inside a callable: the engine serves it from a device
        # buffer keyed by its exact bytes while it warms up and captures (hoist.py)
        return "hoisted at capture"
    if c.install == "left_eager" or c.site is None:
        return "left eager"
    stock = get_at(binding.model, c.site)
    if not isinstance(stock, torch.Tensor):
        return "site is not a tensor: left as is"
    binding.remember(binding.model, c.site, stock)
    set_at(binding.model, c.site, stock.to(binding.device))
    return "device buffer"
