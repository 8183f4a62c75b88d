"""Patch attributes and undo every patch: the bookkeeping of transparent mode.

A :class:`PatchSet` records each change it makes (the original attribute, or its absence) and
undoes them in reverse order in :meth:`PatchSet.restore`, which never stops half-way: it runs every
undo step and raises the first error afterwards.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

_MISSING = object()


def defining_class(cls: type, name: str) -> type:
    """Return the class in ``cls.__mro__`` whose own ``__dict__`` defines ``name``.

    Raises:
        AttributeError: no class in the MRO defines ``name``.
    """
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass
    raise AttributeError(f"{cls.__qualname__} has no attribute {name!r} to patch")


def bind(original: Callable, self: Any, args: tuple, kwargs: dict) -> inspect.BoundArguments:
    """Bind a patched method's call to the signature of the ``original`` it wraps, defaults
    filled in, so a wrapper can read or change an argument however it was passed."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    return bound


class PatchSet:
    """A reversible set of patches, plus a label per feature for the start-up summary."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self.labels: list[str] = []

    def attr(self, owner: Any, name: str, value: Any) -> Any:
        """Set ``owner.name = value`` and remember how to undo it; return the original value.

        ``owner`` is a class or a module. An attribute that ``owner`` inherited (not in its own
        ``__dict__``) is deleted again on restore rather than copied down.
        """
        original = vars(owner).get(name, _MISSING)
        setattr(owner, name, value)

        def undo() -> None:
            if original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)

        self._undo.append(undo)
        return getattr(owner, name) if original is _MISSING else original

    def on_restore(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the patch set is restored (in reverse order of registration)."""
        self._undo.append(undo)

    def label(self, text: str) -> None:
        """Name a feature that was patched, for the start-up summary."""
        self.labels.append(text)

    def restore(self) -> None:
        """Undo every patch, newest first. Raises the first failure after trying them all."""
        errors: list[BaseException] = []
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as exc:  # noqa: BLE001 - keep restoring, re-raise below
                errors.append(exc)
        if errors:
            raise errors[0]

