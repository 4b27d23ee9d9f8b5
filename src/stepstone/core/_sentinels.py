"""Sentinels that tell a Step where its task or context comes from."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

__all__ = [
    "Sentinel",
    "from_parallel",
    "from_parallel_all",
    "from_prev",
    "from_start",
    "from_step",
]

SentinelKind = Literal["prev", "start", "step", "parallel", "parallel_all"]


@dataclasses.dataclass(frozen=True, slots=True)
class Sentinel:
    """A reference to another envelope of the same run, resolved when the step runs.

    Use the module-level constructors, not this class: ``from_prev``, ``from_start``,
    ``from_step("name")``, ``from_parallel("name")``, ``from_parallel_all("name")``.
    """

    kind: SentinelKind
    name: str | None = None

    def __repr__(self) -> str:
        if self.name is None:
            return f"from_{self.kind}"
        return f"from_{self.kind}({self.name!r})"

    def to_dict(self) -> dict[str, Any]:
        """JSON form used by ``Plan.to_dict``."""
        return {"sentinel": self.kind, "name": self.name}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sentinel:
        """Rebuild from :meth:`to_dict` output."""
        kind = data["sentinel"]
        if kind not in ("prev", "start", "step", "parallel", "parallel_all"):
            raise ValueError(f"unknown sentinel kind {kind!r} in {data!r}")
        return cls(kind, data.get("name"))


#: The previous step's output (the start envelope for the first step; after a parallel
#: band, the band's outputs together, as ``from_parallel_all`` gives them).
from_prev = Sentinel("prev")

#: The envelope the run started with.
from_start = Sentinel("start")


def from_step(name: str) -> Sentinel:
    """The latest output of the step called ``name``."""
    return Sentinel("step", _check_name(name, "from_step"))


def from_parallel(name: str) -> Sentinel:
    """The output of one branch (``name``) of a parallel band."""
    return Sentinel("parallel", _check_name(name, "from_parallel"))


def from_parallel_all(name: str) -> Sentinel:
    """Every output of the parallel band that contains step ``name``.

    The payload is a ``{step_name: payload}`` dict in band order; the text joins each
    branch as ``[name]`` followed by its text, separated by blank lines.
    """
    return Sentinel("parallel_all", _check_name(name, "from_parallel_all"))


def _check_name(name: object, fn: str) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError(f"{fn}() takes a step name (a non-empty str), got {name!r}")
    return name
