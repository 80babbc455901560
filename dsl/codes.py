"""The registry of diagnostic codes: every code clockc can report, with its meaning.

One table, read by `diagnostics.error`/`warning` (an unregistered code is a bug and
raises), by `clockc --explain CODE` and by the README's table of codes (a test keeps
that table equal to `markdown_table()`). Codes are grouped by hundreds and tens:

  CLK00x  reading and parsing: the file, its size, syntax, input limits
  CLK01x  names, units, numbers
  CLK02x  regions: dims, retention, attended extents, envelopes
  CLK03x  catalogs and memory: budget, scope, configuration spaces
  CLK04x  callables: arguments, aliasing, writes, retention, counters
  CLK05x  binding sites
  CLK06x  common syntax mistakes, recognised by example
  CLK07x  ambient states a callable is captured under
  CLK08x  session parameters: domains, and what may depend on them
  CLK09x  binding the model: what bind() found on it (clockc verify)
  CLK10x  lockstep: sessions in step sharing one batched call (`batch`, `slot`)
  CLK5xx  warnings: the contract is valid but something is likely unintended
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    code: str
    severity: str  # "error" | "warning"
    title: str
    explanation: str


_CODES = [
    # ---- reading and parsing
    Code(
        "CLK001",
        "error",
        "unexpected token",
        "The parser met a token that cannot continue the statement; the message lists what it expected.",
    ),
    Code(
        "CLK002",
        "error",
        "unexpected character",
        'A character outside the language (identifiers, integers, "strings" of a safe character set, punctuation).',
    ),
    Code(
        "CLK003",
        "error",
        "unexpected end of file",
        "The file ends inside a statement or block (often a missing `}`).",
    ),
    Code(
        "CLK004",
        "error",
        "missing contract header",
        "Every contract starts with `contract NAME`; the name becomes the generated package.",
    ),
    Code(
        "CLK005",
        "error",
        "cannot read contract",
        "The file does not exist, is not a regular file (a directory, a device, a pipe), cannot be opened, or is not UTF-8 text.",
    ),
    Code(
        "CLK006",
        "error",
        "contract file too large",
        "A contract is at most 1 MiB of text; clockc refuses larger inputs instead of reading without bound.",
    ),
    Code(
        "CLK007",
        "error",
        "integer literal too long",
        "Integers are at most 15 digits; every number in a contract is a size, count or index far below that.",
    ),
    Code(
        "CLK008",
        "error",
        "nested too deeply",
        "An expression is at most 32 operators deep (e.g. a chain of `+` or nested `max`: write it with constants); a path has at most 32 steps.",
    ),
    Code(
        "CLK009",
        "error",
        "block not closed",
        "A `region`, `callable`, `constant` or `fold` block opened with `{` has no closing `}` before the next statement or the end of the file; the diagnostic points at the block's opening line.",
    ),
    # ---- names, units, numbers
    Code(
        "CLK010",
        "error",
        "duplicate name",
        "A name (clock, const, region, callable, constant, fold, config variable or argument) is declared twice.",
    ),
    Code(
        "CLK011",
        "error",
        "unknown name",
        "A reference to a clock, constant, region or unit that is not declared.",
    ),
    Code(
        "CLK012",
        "error",
        "unit mismatch",
        "Units are clock names: `+`, `-` and `max` need equal units, `*` at most one, and an extent axis counts its own clock.",
    ),
    Code(
        "CLK013",
        "error",
        "bad clock structure",
        "Derived clocks form a cycle, or a product clock combines product clocks.",
    ),
    Code("CLK014", "error", "clock rate must be positive", "`clock X = N per Y` needs N >= 1."),
    Code(
        "CLK015",
        "error",
        "negative or zero size",
        "Dims must be positive; strides, offsets, tensor dims, attended starts and constants must not be negative.",
    ),
    Code(
        "CLK016",
        "error",
        "unknown determinism setting",
        "`determinism` names a setting the runtime pins (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, cuda.matmul.allow_tf32, and the attention backends cuda.cudnn_sdp, cuda.flash_sdp, cuda.mem_efficient_sdp) and takes true or false.",
    ),
    Code(
        "CLK017",
        "error",
        "name unusable in generated code",
        "A region, callable, constant or fold name is a Python keyword or shadows what the generated adapter defines or uses (including derived names: `_...`, `stock_...`, `..._body`, `..._engine`); or the contract name, which becomes a package, is a keyword or would shadow a standard-library or runtime package.",
    ),
    Code(
        "CLK018",
        "error",
        "number too large",
        "A value or an element count exceeds 2**53 (the largest integer every consumer, JSON included, represents exactly).",
    ),
    Code(
        "CLK019",
        "error",
        "bad stepped clock",
        "A stepped clock (`clock commit = 1..8 per round`, `= {1, 2, 4} per round`) advances by any amount of a non-empty set of distinct positive amounts; a listed set's smallest amount over the amounts' gcd is at most 4096 (its catalog is counted over that many residues). The regions one callable reads that grow all grow by the same clock.",
    ),
    # ---- regions
    Code(
        "CLK020",
        "error",
        "unbounded or empty retention",
        "A region with a clock-extent axis needs a retention policy or an envelope; ring/window sizes must be positive, head/tail non-negative with a positive sum.",
    ),
    Code(
        "CLK021",
        "error",
        "bad attended stride",
        "The attended stride must be positive and not exceed a window.",
    ),
    Code(
        "CLK022",
        "error",
        "attended limit disagrees with retention",
        "`until A` must equal the extent the retention keeps.",
    ),
    Code(
        "CLK023",
        "error",
        "extent out of order",
        "The attended start exceeds the retained extent, or the envelope is smaller than it.",
    ),
    Code(
        "CLK024", "error", "several extent axes", "A region has at most one dim that names a clock."
    ),
    Code(
        "CLK025",
        "error",
        "missing property",
        "A region needs dtype and dims; a callable and a bound constant need a site; `allocate stock` needs a site and stock dims; a fold needs a site and `by` (what it folds, e.g. `by weight_norm`).",
    ),
    Code(
        "CLK026", "error", "declared twice", "A property or a top-level header is declared twice."
    ),
    Code(
        "CLK028",
        "error",
        "rank mismatch",
        "Stock dims or strides must have as many entries as the dims they describe.",
    ),
    Code(
        "CLK029",
        "error",
        "config tuple size",
        "Each value of `config (a, b) in {...}` has as many fields as there are variables.",
    ),
    # ---- catalogs and memory
    Code(
        "CLK030",
        "error",
        "out of lossless scope",
        "A replayed callable's catalog width exceeds the budget (declare `mode eager`), or the budget is outside 1..1000.",
    ),
    Code(
        "CLK031",
        "error",
        "demand exceeds stock",
        "A region's demand size is larger than the stock constant it replaces.",
    ),
    Code(
        "CLK032",
        "error",
        "configuration space too large",
        "The product of a callable's config value counts exceeds 10,000; no catalog that size can be captured.",
    ),
    # ---- callables
    Code(
        "CLK040",
        "error",
        "aliased region is not an argument",
        "`aliased R` needs an argument of type `region R`.",
    ),
    Code(
        "CLK041",
        "error",
        "no retention to apply",
        "`retains R` needs a region with a retention policy, which `allocate stock` excludes.",
    ),
    Code(
        "CLK042",
        "error",
        "write to an immutable region",
        "`writes` or `retains` names an immutable region.",
    ),
    Code(
        "CLK043",
        "error",
        "retained history not from result",
        "`retains R from result[...]`: the history is read from the callable's output.",
    ),
    Code(
        "CLK044",
        "error",
        "scalar argument without config",
        "A bool/int/float argument needs `config NAME in {...}` so the catalog keys its values.",
    ),
    Code(
        "CLK045",
        "error",
        "slot index is not a config variable",
        "`region R[i]`: i must be a config variable of the callable.",
    ),
    Code(
        "CLK046",
        "error",
        "bad slot index",
        "`region R[i]` selects a slot of a fixed leading axis: R needs dims, its leading axis must not be the clock axis, and every value of i must be a slot.",
    ),
    Code(
        "CLK047",
        "error",
        "argument path not describable",
        'An argument path is NAME or NAME["key"]...: a capture class describes arguments as nested dicts of leaves; two argument paths must not overlap.',
    ),
    Code(
        "CLK048",
        "error",
        "bad pinned region",
        "A pinned region needs the site the stock code rebinds, and takes no retention or `allocate`.",
    ),
    Code(
        "CLK049",
        "error",
        "bad counter",
        "A counter is a model attribute that advances by at least 1 per call, an amount or an expression over one configuration variable the call's signature shows, with integer values (`advances w`: each class by its own amount; such a counter does not `tracks` a region); a counter that `tracks R` names a region argument of its callable with an attended extent (`attended from ... by ...`).",
    ),
    # ---- binding sites
    Code(
        "CLK050",
        "error",
        "forbidden site segment",
        "Sites are a closed language over the model object's own attributes: no segment may start with `__` or name an interpreter internal (func_globals, f_globals, gi_frame, ...).",
    ),
    Code(
        "CLK051",
        "error",
        "conflicting sites",
        "Two declarations are bound at one site, or a site lies inside another bound site (bind() never resolves through a tensor, a callable or a counter); or two folds name one module, or one inside the other, or a fold's site lies at or inside a bound site.",
    ),
    Code(
        "CLK052",
        "error",
        "bad speculative region",
        "`speculative S` says a call may write S entries past a region's committed end beyond its first (a verifier's drafted tokens, a wake's realized and masked frames) that the commit cuts back by moving the end, never by a copy: S is a positive extent in the region's clock-extent axis units; the envelope holds the retained extent and S; a `ring(N)` keeps N - S committed entries, and a region that attends more of its ring than that is refused (a speculative write overwrites the oldest entries the call's first queries still read: lossless only with a ring of at least the attended extent + S).",
    ),
    Code(
        "CLK053",
        "error",
        "bad commit",
        "`commits R by AMOUNT` says how far a call moves region R's committed end: by a stepped clock's amount (only the data decides which: a verifier's accepted count + 1), by an expression over one control of the callable (its values over the control's declared range, at most 65,536 of them, each evaluated), or by an expression over one configuration variable (each class its own amount); every amount at least 1; R is a `speculative` region the callable passes, writes or retains, committed once per callable.",
    ),
    Code(
        "CLK054",
        "error",
        "bad control",
        "`control NAME: DTYPE in LO..HI from result...` names an integer the call returns that drives the host (a verifier's accepted count, a wake's retained count): an integer dtype (int64, int32, int16, int8, uint8), a non-empty range LO..HI within 2**53, a path from `result` (what the call returns), and a name of its own (no argument or configuration variable of the callable, no other control).",
    ),
    Code(
        "CLK055",
        "error",
        "bad identity key",
        "`[id(path)]` keys a dict entry by the identity of a module of the model: its path starts at the model's root and takes attribute and index steps only (no keys, no nested `id`), and it may appear only in a region's site.",
    ),
    Code(
        "CLK056",
        "error",
        "bad initial state",
        '`initial zeros` says a region\'s site may be absent at bind (the stock code creates it on its first call, reading zeros while it is absent): the region needs a site whose last step is a dict key (`["k"]` or `[id(...)]`) and `address pinned`.',
    ),
    Code(
        "CLK057",
        "error",
        "documented region bound",
        "`allocate none` says a region only documents stock state (a vendor ring a session owns, counted by `clockc plan`) and bind() provides nothing for it: it takes no site, and no callable may read, write or retain it.",
    ),
    Code(
        "CLK058",
        "error",
        "bad object argument",
        "`kwarg NAME: site PATH` passes the object the model holds at PATH (a transformers `Cache`, a padding cache): it is a whole keyword argument (no steps after NAME; a caller may still pass it by position), and some region must have its site inside PATH (the object's tensors, which become the argument's members `NAME[\"R\"]`).",
    ),
    Code(
        "CLK059",
        "error",
        "bad host guard",
        "`guard PATH == VALUE` names a host value at a model site that picks the stock body's path (a flag its first call sets: transformers' `EncoderDecoderCache.is_updated`), not the call's result, and the one value (`==`) every class is captured with; a call while the site holds another value, or none, runs eager (miss `host_guard`).",
    ),
    # ---- common syntax mistakes
    Code(
        "CLK060",
        "error",
        "argument without ':'",
        "An argument is written `arg NAME: TYPE` (e.g. `kwarg x: float32 [1, 4]`).",
    ),
    Code(
        "CLK061",
        "error",
        "property with '=' or ':'",
        "Block properties are `KEYWORD value` with no `=` or `:` (e.g. `dtype float32`).",
    ),
    Code(
        "CLK062",
        "error",
        "dims without brackets",
        "Shapes are bracketed lists: `dims [2, frame, 16]`.",
    ),
    Code(
        "CLK063",
        "error",
        "head and tail without '++'",
        "A head/tail retention is written `head(P) ++ tail(R)`.",
    ),
    Code(
        "CLK064",
        "error",
        "config without 'in {...}'",
        "Configurations are written `config NAME in {v1, v2}` or `config (a, b) in {(1, 2)}`.",
    ),
    Code(
        "CLK065",
        "error",
        "rate clock without 'per'",
        "A derived clock is written `clock NAME = RATE per PARENT`.",
    ),
    Code(
        "CLK066",
        "error",
        "quoted site",
        'Sites are paths, not strings: `site flow.decoder["key"]`.',
    ),
    Code(
        "CLK067",
        "error",
        "retention without parentheses",
        "Retention sizes are parenthesised: `ring(3000 frame)`, `window(W)`, `head(P) ++ tail(R)`.",
    ),
    Code(
        "CLK068",
        "error",
        "malformed batch",
        "A lockstep batch is `batch widths {8, 16} axis 0 rows {aten.mean.dim}`: widths and rows are braced lists; `axis` and `rows` are optional.",
    ),
    # ---- ambient states
    Code(
        "CLK070",
        "error",
        "unknown ambient axis",
        "`ambient AXIS in {...}` declares the states of one ambient torch setting a callable is called under; the known axis is `autocast`.",
    ),
    Code(
        "CLK071",
        "error",
        "bad autocast state",
        '`ambient autocast in {...}` lists distinct states among off, float32, float16 and bfloat16 (float32 is what `torch.autocast("cuda", dtype=torch.float32)` turns on: it casts nothing but is a state of its own).',
    ),
    # ---- session parameters
    Code(
        "CLK080",
        "error",
        "bad parameter domain",
        "`param NAME in LO..HI UNIT` needs 0 <= LO <= HI, a clock as its unit, a `default` and `capture {...}` values inside the domain and `hold` at least 1.",
    ),
    Code(
        "CLK081",
        "error",
        "parameter used non-linearly",
        "A session parameter may be added, subtracted and multiplied by a number: never multiplied by another parameter nor inside `max(...)`, so every quantity is linear in it and its whole domain is decided at its two ends.",
    ),
    Code(
        "CLK082",
        "error",
        "catalog depends on a parameter",
        "A session parameter may move attended extents, retention sizes and region envelopes, not a catalog's width, a stride or a staged argument's shape: the catalog of each value must be the same classes shifted.",
    ),
    Code(
        "CLK083",
        "error",
        "stock tensor cannot hold every parameter value",
        "bind() puts a region at its site once, at its largest shape over every session parameter's domain, and reads the stock tensor there once: a region that is the stock tensor (`allocate stock`, `address pinned`) and a carry's dims off its extent axis cannot change shape with a parameter, and an allocated region with a site whose shape does declares `stock` dims that hold its largest shape at every value.",
    ),
    # ---- binding the model
    Code(
        "CLK090",
        "error",
        "the model refused the binding",
        "`clockc verify` bound the contract to the model and bind() refused it: a site the model does not have, a region whose shape or layout the stock tensor there contradicts, a value outside a domain. The diagnostic points at the declaration the message names (its `site` line where the message is about a site).",
    ),
    # ---- lockstep
    Code(
        "CLK100",
        "error",
        "bad batch widths",
        "`batch widths {...}` lists the numbers of sessions a batched binding serves in one call: each between 1 and 1024, none twice. Every width is its own set of graphs.",
    ),
    Code(
        "CLK101",
        "error",
        "argument cannot be batched",
        "Sessions stack on the batch axis of every staged tensor argument of a batched callable: the argument needs more dims than the axis and extent 1 there (per session, under every configuration); a strided argument stacks on axis 0 only (its strides are one session's), and a slot argument `region r[i]` cannot be stacked at all.",
    ),
    Code(
        "CLK102",
        "error",
        "batch on an eager callable",
        "`mode eager` runs the stock code for each session; only a replayed callable's graphs can serve several sessions in one call.",
    ),
    Code(
        "CLK103",
        "error",
        "not one lockstep",
        "A contract has one lockstep: every batched callable declares the same widths, and once one callable is batched every replayed callable is (a batched binding serves W sessions in every call).",
    ),
    Code(
        "CLK104",
        "error",
        "bad slot axis",
        "`slot N` names the axis a per-session region stacks its sessions on in a batched binding: N is a fixed axis of the region (not its clock-extent axis) of extent 1, and the region's lifetime is `session` or `turn`.",
    ),
    Code(
        "CLK105",
        "error",
        "per-session region without slot",
        "In a contract with a batched callable every region of lifetime `session` or `turn` declares `slot N`: where session i's copy lives in the batched region.",
    ),
    Code(
        "CLK106",
        "error",
        "bad per-row op name",
        "`rows {...}` names ATen ops as `aten.<op>` or `aten.<op>.<overload>` (e.g. `aten.mean.dim`): the ops the batched call runs one session at a time (`aten.mm.default by 8`: on blocks of 8 sessions, where N >= 1 divides every width; `aten.mm.default in gating`: only inside modules whose path holds `gating`), none listed twice; and `rows` with a batch axis other than 0 (a per-row op splits its tensors on the leading axis).",
    ),
    Code(
        "CLK107",
        "error",
        "malformed channel",
        "A channel is `channel NAME { dtype D  dims [N]  batch B  clock C }`: one axis of N >= 1 entries, published B at a time (1 <= B <= N), its readiness recorded per tick of a declared clock C.",
    ),
    # ---- warnings
    Code(
        "CLK501",
        "warning",
        "left eager",
        "A callable declared `mode eager` is out of lossless scope; it runs eagerly, as declared.",
    ),
    Code(
        "CLK502",
        "warning",
        "host randomness in replay",
        "A callable draws host randomness; replay rejects it at capture, so declare `mode eager`.",
    ),
    Code(
        "CLK503",
        "warning",
        "config variable reaches nothing",
        "A config variable appears in no argument and no `admit`: it does not change any signature.",
    ),
    Code(
        "CLK505",
        "warning",
        "pinned region never written",
        "No callable writes a pinned region, so nothing copies the stock code's new values into it.",
    ),
    Code(
        "CLK506",
        "warning",
        "attended stride off the clock",
        "A carry's attended stride differs from what the callable writing it appends per call (one that retains it, or is passed the object it is a member of) (its clock's rate per the callable's `per` clock): replay misses every extent the stream reaches off the declared stride.",
    ),
    Code(
        "CLK507",
        "warning",
        "growing carry without attended",
        "A region retained by writeback declares no `attended`: only its full extent is captured, so every call while it grows (and after a flush) runs eager.",
    ),
    Code(
        "CLK508",
        "warning",
        "regions bound to nothing",
        "Regions with no site that no callable reads, writes or retains, listed in one warning: bind() provides nothing for them (often a forgotten `site` or argument). A region that only documents stock state on purpose says so with `allocate none`.",
    ),
    Code(
        "CLK509",
        "warning",
        "contract without callables",
        "A contract declares no callable: its adapter binds and replays nothing.",
    ),
    Code(
        "CLK510",
        "warning",
        "parameter capture set larger than hold",
        "`capture {...}` lists more values than `hold` keeps, so capturing them all at bind evicts the first ones again.",
    ),
    Code(
        "CLK511",
        "warning",
        "parameter reaches nothing",
        "A session parameter appears in no constant, region or argument: binding different values changes nothing.",
    ),
    Code(
        "CLK512",
        "warning",
        "slot without a batch",
        "A region declares `slot N` but no callable of the contract is batched: nothing stacks sessions, so the slot says nothing yet (it is kept for when a callable declares `batch`).",
    ),
]

CODES: dict[str, Code] = {c.code: c for c in _CODES}
assert len(CODES) == len(_CODES), "a code is registered twice"


def explain(code: str) -> str | None:
    """The `--explain` text of one code, or None if it is not registered."""
    c = CODES.get(code.upper())
    if c is None:
        return None
    return f"{c.code} ({c.severity}): {c.title}\n\n{c.explanation}\n"


def markdown_table() -> str:
    """The README's table of codes."""
    rows = ["| code | severity | meaning |", "|---|---|---|"]
    rows += [f"| `{c.code}` | {c.severity} | {c.title}: {c.explanation} |" for c in _CODES]
    return "\n".join(rows) + "\n"
