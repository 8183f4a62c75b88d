"""Per-thread state that transparent mode's patches share: where the calling thread is now.

Two regions, each marked with a ``with`` block on the thread that runs it (other threads, such as
a ``tf.data`` worker, are not inside it):

- :func:`keras_loop`: inside a patched ``fit``/``evaluate``/``predict``. Calls Keras makes from
  there pass straight through (``fit`` runs ``evaluate`` for validation), a ``tf.data`` dataset is
  not sharded again when iterated, and saves and loads are rank 0's callbacks, alone.
- :func:`local_only`: variables created here keep their local value (rank 0 saving or loading
  alone; the variable patch broadcasting the ``tf.Variable`` it wraps only once).

Besides, :func:`validating` holds this rank's share of the running ``fit``'s ``validation_data``,
for the ``evaluate`` that Keras runs at each epoch's end (:mod:`.training`).

:mod:`.training` enters :func:`keras_loop`, :mod:`.initial_values` and :mod:`.rank_zero` enter
:func:`local_only`; :mod:`.training`, :mod:`.iteration`, :mod:`.rank_zero` and
:mod:`.initial_values` read them. Nothing here is patched, so nothing needs restoring.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ContextManager, Iterator


class ThreadRegion:
    """A per-thread, nestable region: ``with region.enter(): ...`` marks it; :attr:`active` says
    whether the calling thread is inside one (another thread's regions do not count)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def active(self) -> bool:
        """True while this thread is inside at least one :meth:`enter`."""
        return getattr(self._local, "depth", 0) > 0

    @contextlib.contextmanager
    def enter(self) -> Iterator[None]:
        """Mark the body as inside the region (nesting allowed)."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1


_keras_loop = ThreadRegion()
_local_creation = ThreadRegion()


def keras_loop() -> ContextManager[None]:
    """Mark the body as a patched ``fit``/``evaluate``/``predict`` running on this thread."""
    return _keras_loop.enter()


def in_keras_loop() -> bool:
    """Return True while a patched ``fit``/``evaluate``/``predict`` runs on this thread."""
    return _keras_loop.active


def local_only() -> ContextManager[None]:
    """Create variables without broadcasting them, e.g. while rank 0 alone saves a model."""
    return _local_creation.enter()


def creating_locally() -> bool:
    """Return True inside :func:`local_only` on this thread."""
    return _local_creation.active


_validation = threading.local()


@contextlib.contextmanager
def validating(share: Any) -> Iterator[None]:
    """Mark the body as a ``fit`` whose validation input is ``share`` on this rank."""
    previous = getattr(_validation, "share", None)
    _validation.share = share
    try:
        yield
    finally:
        _validation.share = previous


def validation_share() -> Any:
    """Return the share set by the innermost :func:`validating` on this thread, or None."""
    return getattr(_validation, "share", None)
