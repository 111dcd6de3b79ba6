"""`@frozen`: a record frozen for the type checker, plain slots at run time.

A frozen dataclass writes each field through `object.__setattr__` on construction: 4.5 us
for a 29-field `ListedPolicy`, 0.8 us plain (bench/RESULTS.md, "Frozen records at their
cost"), and the round makes one per Policy listed, 1,000,000 a round at 10,000 x 100. Records
made that often are declared with `@frozen` instead: mypy (strict, in CI) refuses any write
to them as it does to a frozen dataclass, and at run time they are built as fast as a plain
one. They are not hashable (their fields hold dicts anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def frozen(cls: type[T]) -> type[T]:
    """`cls` as a slotted dataclass, frozen to the type checker only."""
    return dataclass(slots=True)(cls)
