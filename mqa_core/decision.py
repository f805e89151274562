"""The result of selection: one :class:`Candidate` per provider, the choice, and how to print it.

A failure message is this same rendering, so ``mqa explain`` and a ``ProviderUnavailableError``
always tell the same story.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .names import names_provider, printable, provider_id
from .spec import Problem

#: Rejection codes, in the order selection tests them.
CODES = ("broken", "blocked", "ambiguous", "op", "arch", "dtype", "claims", "shape", "check", "import", "preference")


#: How ``explain`` abbreviates a claim in its table.
_CLAIM_SHORT = {"deterministic": "det", "batch_invariant": "batch-inv"}


def _short(dtype: str) -> str:
    return dtype.removeprefix("float8_e4m3")


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
    #: The (q dtype, k dtype) pairs it declares on the decision's arch.
    pairs: tuple[tuple[str, str], ...] = ()
    #: Seconds its plugin's import took (None when unknown).
    import_seconds: float | None = None
    #: What it claims of its results (``deterministic``, ``batch_invariant``), sorted.
    claims: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """``distribution:name``, what ``MQA_PROVIDER`` accepts to pick this one."""
        return provider_id(self.distribution, self.name)

    @property
    def origin(self) -> str:
        return f"{self.distribution}=={self.version}" if self.distribution else ""


@dataclass(frozen=True)
class Decision:
    """Which provider serves (arch, op, dtype, problem), and why every other one does not."""

    arch: str
    op: str
    #: The (q dtype, k dtype) pair asked for; None when any.
    dtype: tuple[str, str] | None
    problem: Problem | None
    candidates: tuple[Candidate, ...]
    #: The chosen provider's name (see ``chosen_distribution`` for which one, names can collide).
    chosen: str | None
    why: str
    chosen_distribution: str = ""

    @property
    def accepted(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.accepted)

    @property
    def chosen_candidate(self) -> Candidate | None:
        """The chosen provider's row (the one ``__str__`` marks with ``*``); None when none is chosen."""
        for c in self.candidates:
            if c.accepted and c.name == self.chosen and c.distribution == self.chosen_distribution:
                return c
        return None

    def candidate(self, ref: str) -> Candidate:
        """The candidate named ``ref`` (``name`` or ``distribution:name``); KeyError when none is, or
        when two distributions claim the name (then pass ``distribution:name``)."""
        found = [c for c in self.candidates if c.code != "broken" and names_provider(ref, c.distribution, c.name)]
        if not found:  # a broken plugin, by its entry-point name
            found = [c for c in self.candidates if c.code == "broken" and c.name == ref]
        if len(found) > 1:
            raise KeyError(f"{ref!r} is claimed by {', '.join(c.id for c in found)}: pass distribution:name")
        if not found:
            raise KeyError(ref)
        return found[0]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["problem"] = None if self.problem is None else asdict(self.problem)
        return d

    def __str__(self) -> str:
        head = f"fp8 MQA provider decision for arch={self.arch} op={self.op}"
        if self.dtype:
            head += f" q={self.dtype[0]} k={self.dtype[1]}"
        if self.problem is not None:
            head += f" shape {self.problem}"
        rows: list[tuple[str, ...]] = [("", "provider", "from", "priority", "import", "q/k e4m3 pairs", "claims",
                                        "status")]
        chosen_one = self.chosen_candidate
        for c in self.candidates:
            mark = "*" if c is chosen_one else ""
            status = "accepted" if c.accepted else f"rejected [{c.code}] {c.reason}"
            prio = "" if c.priority is None else str(c.priority)
            imp = "" if c.import_seconds is None else f"{c.import_seconds * 1e3:.0f} ms"
            pairs = " ".join(f"{_short(q)}/{_short(k)}" for q, k in c.pairs)
            claims = ",".join(_CLAIM_SHORT.get(x, x) for x in c.claims)
            rows.append(tuple(printable(cell) for cell in (mark, c.name, c.origin, prio, imp, pairs, claims, status)))
        n = len(rows[0]) - 1
        widths = [max(len(r[i]) for r in rows) for i in range(n)]
        lines = [printable(head)]
        for r in rows:
            lines.append("  ".join(r[i].ljust(widths[i]) for i in range(n)) + "  " + r[n])
        chosen = self.chosen or "none"
        if self.chosen and self.chosen_distribution:
            chosen += f" ({self.chosen_distribution})"
        lines.append(printable(f"chosen: {chosen}: {self.why}"))
        return "\n".join(lines)
