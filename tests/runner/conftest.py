"""Helpers for the durable agent run tests: a counting scripted model, crash signals."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from stepstone.providers import ModelRequest
from stepstone.testing import FunctionModel


class Crash(BaseException):
    """Stands for the process dying at this point (nothing of ours catches it)."""


@dataclasses.dataclass
class Script:
    """A model whose reply depends only on the turn, counting how often each turn is asked."""

    replies: dict[int, Any]
    asked: list[int] = dataclasses.field(default_factory=list)
    crash_at: set[int] = dataclasses.field(default_factory=set)
    before: Callable[[int], None] | None = None

    def __call__(self, request: ModelRequest) -> Any:
        self.asked.append(request.turn)
        if request.turn in self.crash_at:
            self.crash_at.discard(request.turn)
            raise Crash(f"died while the model was answering turn {request.turn}")
        if self.before is not None:
            self.before(request.turn)
        return self.replies[request.turn]

    def model(self) -> FunctionModel:
        return FunctionModel(self)
