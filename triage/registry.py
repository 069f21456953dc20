"""Name → class registries (policies, routers): `register(name)` decorates a class."""
from __future__ import annotations

from typing import Callable, TypeVar

C = TypeVar("C", bound=type)


def make_registry(kind: str) -> tuple[dict[str, type], Callable[[str], Callable[[C], C]]]:
    table: dict[str, type] = {}

    def register(name: str) -> Callable[[C], C]:
        def deco(cls: C) -> C:
            if name in table:
                raise ValueError(f"{kind} {name!r} registered twice")
            cls.name = name
            table[name] = cls
            return cls

        return deco

    return table, register
