"""How providers and plugins are named, and how a user's name is matched against them.

A provider's identity is (distribution, name). pip keeps distribution names unique in an environment;
provider and entry-point names are chosen by plugin authors, so two distributions can claim one name.
Users can therefore write a provider name (``torch_ref``), a distribution name
(``mqa-provider-torch-ref``) or both (``mqa-provider-torch-ref:torch_ref``). Distribution names
compare as pip compares them (PEP 503: runs of ``-``, ``_`` and ``.`` are equal, case does not
matter); provider names compare case-insensitively.
"""

from __future__ import annotations

import re

#: A provider name: lower case, starts with a letter. Always matched whole (``re.fullmatch``).
PROVIDER_NAME = re.compile(r"[a-z][a-z0-9_\-]*")
#: A distribution name as packaging accepts it (PEP 508), any case.
DISTRIBUTION_NAME = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._\-]*[A-Za-z0-9]")
#: An entry-point name (what ``[project.entry-points."mqa_core.providers"]`` lists on the left).
ENTRY_POINT_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def printable(text: str) -> str:
    """``text`` as one line a terminal shows as it is: each character ``str.isprintable`` refuses
    (control characters such as newline, carriage return and ESC; Unicode format and separator
    characters such as bidi overrides and line separators) becomes a ``\\x..``, ``\\u....`` or
    ``\\U........`` escape. For every plugin-supplied text the CLI or a decision shows: it can then
    neither forge a line nor move the cursor. A str subclass is read through str's own methods."""
    if type(text) is not str:
        text = str.__str__(text) if isinstance(text, str) else str(text)
    if str.isprintable(text):
        return text
    return "".join(c if c.isprintable() else _escape(ord(c)) for c in text)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def normalize_distribution(name: str) -> str:
    """PEP 503: ``Mqa_Provider.Torch-Ref`` -> ``mqa-provider-torch-ref``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def provider_id(distribution: str, name: str) -> str:
    """The printable identity ``distribution:name`` (the spelling ``MQA_PROVIDER`` accepts)."""
    return f"{distribution}:{name}"


def split_ref(ref: str) -> tuple[str | None, str]:
    """``"dist:name"`` -> (normalised dist, name); ``"name"`` -> (None, name)."""
    dist, sep, name = ref.rpartition(":")
    return (normalize_distribution(dist), name.lower()) if sep else (None, ref.lower())


def names_provider(ref: str, distribution: str, name: str) -> bool:
    """Whether ``ref`` (``name`` or ``dist:name``) names the provider (distribution, name)."""
    dist, want = split_ref(ref)
    return want == name and (dist is None or dist == normalize_distribution(distribution))


def names_provider_or_distribution(ref: str, distribution: str, name: str) -> bool:
    """Like :func:`names_provider`, but a bare word may also be the distribution's name."""
    if names_provider(ref, distribution, name):
        return True
    return ":" not in ref and bool(distribution) and normalize_distribution(ref) == normalize_distribution(distribution)


def names_plugin(ref: str, entry_point: str, distribution: str) -> bool:
    """Whether ``ref`` (an ``MQA_PLUGINS`` entry) names an entry point: ``distribution`` names every
    entry point of that distribution, ``distribution:entry_point`` one of them. Never a bare entry-point
    name: any distribution can declare any entry-point name, only distribution names are unique."""
    if not distribution:
        return False
    dist, sep, name = ref.partition(":")
    if normalize_distribution(dist) != normalize_distribution(distribution):
        return False
    return not sep or name == entry_point
