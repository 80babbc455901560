"""Caller threads for the concurrency tests: each runs ``client(item)``; what they raised
and whether any hung."""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable


def run_clients(client: Callable[[Any], None], items: Iterable[Any], timeout_s: float) -> list:
    """Run ``client(item)`` on a thread per item; returns the exceptions they raised.
    Fails (AssertionError) if one is still running after ``timeout_s``."""
    errors: list[BaseException] = []

    def guarded(item: Any) -> None:
        try:
            client(item)
        except BaseException as exc:  # noqa: BLE001 - collected, the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    return errors
