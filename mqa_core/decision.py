"""The result of selection: one :class:`Candidate` per provider, the choice, and how to print it.

A failure message is this same rendering, so ``mqa explain`` and a ``ProviderUnavailableError``
always tell the same story.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .spec import Problem

#: Rejection codes, in the order selection tests them.
CODES = ("broken", "blocked", "op", "arch", "dtype", "shape", "check", "import", "preference")


@dataclass(frozen=True)
class Candidate:
    """One provider's outcome: accepted, or rejected with a code from :data:`CODES` and a reason."""

    name: str
    accepted: bool
    code: str = ""
    reason: str = ""
    priority: int | None = None
    distribution: str = ""
    version: str = ""

    @property
    def origin(self) -> str:
        return f"{self.distribution}=={self.version}" if self.distribution else ""


@dataclass(frozen=True)
class Decision:
    """Which provider serves (arch, op, dtype, problem), and why every other one does not."""

    arch: str
    op: str
    dtype: str | None
    problem: Problem | None
    candidates: tuple[Candidate, ...]
    chosen: str | None
    why: str

    @property
    def accepted(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.accepted)

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["problem"] = None if self.problem is None else asdict(self.problem)
        return d

    def __str__(self) -> str:
        head = f"fp8 MQA provider decision for arch={self.arch} op={self.op}"
        if self.dtype:
            head += f" dtype={self.dtype}"
        if self.problem is not None:
            head += f" shape {self.problem}"
        rows = [("", "provider", "from", "priority", "status")]
        for c in self.candidates:
            mark = "*" if c.name == self.chosen else ""
            status = "accepted" if c.accepted else f"rejected [{c.code}] {c.reason}"
            prio = "" if c.priority is None else str(c.priority)
            rows.append((mark, c.name, c.origin, prio, status))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [head]
        for r in rows:
            lines.append("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4])
        lines.append(f"chosen: {self.chosen or 'none'}: {self.why}")
        return "\n".join(lines)
