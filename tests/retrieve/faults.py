"""Fault injection over a real store: named operations raise, everything else is the real thing."""

from __future__ import annotations

from typing import Any, Callable


class InjectedFault(RuntimeError):
    pass


class FaultyStore:
    """Wraps a store; ``faults[name](*args, **kwargs)`` returning True makes that call raise."""

    def __init__(self, store: Any, faults: dict[str, Callable[..., bool]]) -> None:
        self._store = store
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._store, name)
        check = self._faults.get(name)
        if check is None or not callable(target):
            return target

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if check(*args, **kwargs):
                raise InjectedFault(f"injected failure in {name}")
            return target(*args, **kwargs)

        return wrapped


def always(*_: Any, **__: Any) -> bool:
    return True


def kind_is(kind: str, parents: bool | None = None) -> Callable[..., bool]:
    """Match calls whose first argument is ``kind`` (and, if given, whether ``parents`` was passed)."""

    def check(*args: Any, **kwargs: Any) -> bool:
        if not args or args[0] != kind:
            return False
        return parents is None or (kwargs.get("parents") is not None) == parents

    return check
