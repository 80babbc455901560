"""What a client of the served application is told when a session cannot go on.

Contract of this layer: every refusal a client can meet is one of these types, raised
by the ingress (app.py) with a message that names the session and the reason, so a
client catches them by type (Ray re-raises an exception from a deployment as an
instance of its own type). They pickle (one message argument) and import without ray.
"""

from __future__ import annotations


class ServeError(RuntimeError):
    """Base of the serving errors a client can catch."""


class Overloaded(ServeError):
    """A session was refused at open: every replica is at its session capacity (or
    none is up). Refusing here keeps the sessions already open at their cadence."""


class SessionUnknown(ServeError):
    """A request named a session that was never opened here or is closed."""


class SessionLost(ServeError):
    """The replica holding the session died: its state is gone, the session is over
    (open a new one). Other sessions are unaffected."""


def plain(e: ServeError) -> ServeError:
    """A refusal as it was raised, without the Ray traceback around it (Ray re-raises a
    deployment's exception as a subclass of its type that carries it as ``cause``)."""
    cause = getattr(e, "cause", e)
    return type(cause)(*cause.args)


__all__ = ["Overloaded", "ServeError", "SessionLost", "SessionUnknown", "plain"]
