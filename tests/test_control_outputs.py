"""Control outputs (`control NAME: DTYPE in LO..HI from result...`): an integer a call
returns that drives the host. The compiler counts a commit over one as the expression's
values over the declared range (a property over random ranges and expressions), and a
bound contract reads them from a call's result as host ints, refusing, by name, one that
is missing, of another dtype or shape, or out of its range."""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from duplexcadence.compiler.driver import check_source, compile_source
from duplexcadence.compiler.extents import AmountSet
from duplexcadence.compiler.loader import import_generated
from duplexcadence.runtime import ControlError

VERIFY = """contract control_verify
catalog budget 1000
clock round = 1 per call
clock commit = 1..{top} per round
region kv {{ dtype float32  dims [1, commit, 4]  retention window(128 commit)
            attended from 0 commit by commit  speculative {top} commit }}
callable verify {{
  site model.verify
  per round
  kwarg tokens: int64 [1, 4]
  kwarg kv: region kv
  control accepted: int64 in {lo}..{hi} from result[1]
  commits kv by {amount}
}}
"""


@settings(max_examples=40, deadline=None)
@given(
    lo=st.integers(0, 10),
    span=st.integers(0, 10),
    scale=st.integers(1, 3),
    shift=st.integers(1, 3),
)
def test_a_commit_over_a_control_moves_by_its_values_over_the_range(lo, span, scale, shift):
    hi = lo + span
    amount = f"accepted * {scale} + {shift}"
    text = VERIFY.format(top=hi * scale + shift, lo=lo, hi=hi, amount=amount)
    result = check_source(text, "c.clock")
    assert result.ok, result.diagnostics
    (verify,) = result.analysis.callables
    want = AmountSet.of({v * scale + shift for v in range(lo, hi + 1)})
    assert verify.commits == (("kv", want.shown()),)
    assert verify.controls == (("accepted", "int64", f"{lo}..{hi}"),)


def test_a_commit_by_a_control_below_one_is_refused_at_its_first_value():
    text = VERIFY.format(top=9, lo=0, hi=8, amount="accepted")
    result = check_source(text, "c.clock")
    (error,) = [d for d in result.diagnostics if d.severity.name == "ERROR"]
    assert error.code == "CLK053" and "by 0 at accepted = 0" in error.message


class Verifier(torch.nn.Module):
    """A stand-in verify call: its logits and the count its argmax agrees with the drafts."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = torch.zeros(1, 8, 4)
        self.dtype = torch.int64

    def verify(self, tokens: torch.Tensor, kv: torch.Tensor) -> tuple:
        accepted = (tokens[0, 1:] == tokens[0, :-1]).sum().reshape(1)
        return tokens.float(), accepted.to(self.dtype)


def bound(lo: int = 0, hi: int = 3):
    text = VERIFY.format(top=hi + 1, lo=lo, hi=hi, amount="accepted + 1")
    text = text.replace("kwarg kv: region kv", "kwarg kv: float32 [1, 8, 4]")
    text = text.replace("site model.verify", "site verify")
    text = text.replace("region kv {", "region unused {").replace("commits kv", "# commits kv")
    compiled = compile_source(text, "c.clock")
    assert compiled.ok, compiled.diagnostics
    package = import_generated(compiled.files, prefix="control_verify")
    adapter = importlib.import_module(f"{package.__name__}.adapter")
    model = Verifier()
    return model, adapter.bind(model, device="cpu", progress=False)


def test_a_bound_call_s_controls_read_as_host_ints_and_fail_loudly():
    model, binding = bound()
    kv = torch.zeros(1, 8, 4)
    result = model.verify(tokens=torch.tensor([[5, 5, 5, 7]]), kv=kv)
    assert binding.controls("verify", result) == {"accepted": 2}
    with pytest.raises(ControlError, match=r"'accepted' at result\[1\]: expected int64"):
        binding.controls("verify", (result[0], result[1].int()))
    with pytest.raises(ControlError, match="outside the declared 0..3"):
        binding.controls("verify", (result[0], torch.tensor([4])))
    with pytest.raises(ControlError, match="one-element tensor, got \\(2,\\)"):
        binding.controls("verify", (result[0], torch.tensor([1, 2])))
    with pytest.raises(ControlError, match="the result has no such entry"):
        binding.controls("verify", (result[0],))
    with pytest.raises(KeyError, match="no callable 'decode'"):
        binding.controls("decode", result)
