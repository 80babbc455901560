"""Validation of channels: a producer's append-only buffer that another call reads.

`channel candidates { dtype int64  dims [448]  batch 8  clock round }` declares AS2D's
candidate buffer: the drafter publishes its tokens 8 at a time on its own stream, the
verifier reads the entries whose copy completed, and which entries were ready is recorded
per tick of `round`, so a replayed run reads the same ones (runtime/state/channel.py).
What the contract fixes is what the runtime allocates once (N entries of the dtype, host
memory the producer's copies land in) and checks at every publish: a batch is at most B
entries and never runs past N. A mixin of the validator (validate.py); ``Checked.channels``
holds each channel's capacity and batch.
"""

from __future__ import annotations

from duplexcadence.dsl import ir


class ChannelRules:
    def check_channel(self, ch: ir.Channel) -> None:
        where, spans = f"channel '{ch.name}'", ch.prop_spans
        missing = [
            what
            for what, value in (
                ("dtype", ch.dtype),
                ("dims [N]", ch.dims),
                ("batch B", ch.publish),
                ("clock", ch.clock),
            )
            if value is None
        ]
        if missing:
            self.err(
                "CLK107",
                f"{where} lacks {', '.join(f'`{m}`' for m in missing)}: a channel declares "
                "its entries' dtype, its capacity, the entries one publish appends and the "
                "clock its readiness is recorded at",
                ch.span,
            )
            return
        if ch.clock not in self.clocks:
            self.err(
                "CLK011", f"{where} names unknown clock '{ch.clock}'", spans.get("clock", ch.span)
            )
            return
        if len(ch.dims) != 1:
            self.err(
                "CLK107",
                f"{where} has {len(ch.dims)} dims: a channel is one axis of entries, `dims [N]`",
                spans.get("dims", ch.span),
            )
            return
        capacity, batch = self.eval(ch.dims[0]), self.eval(ch.publish)
        if capacity is None or batch is None:
            return
        if capacity.value < 1:
            self.err(
                "CLK107",
                f"{where} holds {capacity.show()} entries: a channel holds at least one",
                spans.get("dims", ch.span),
            )
        elif not 1 <= batch.value <= capacity.value:
            self.err(
                "CLK107",
                f"{where} publishes {batch.show()} entries at a time: between 1 and its "
                f"capacity ({capacity.show()})",
                spans.get("publish", ch.span),
            )
        else:
            self.out.channels[ch.name] = (capacity.value, batch.value)
