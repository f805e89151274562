"""The environment variables mqa_core obeys, read once per (re)load into a frozen :class:`Settings`.

Reading them once keeps selection deterministic inside a process and the per-call path free of
``os.environ`` lookups; call :func:`mqa_core.reload` after changing them. Parsing is strict: a value
that is not understood raises :class:`~mqa_core.errors.SettingsError` naming the variable, rather
than being read as "off" (a misspelt ``MQA_STRICT_PLUGINS=on`` must not quietly mean not strict).
Entries of the lists that are well formed but name nothing installed are warned about after
discovery (``discovery.unknown_names``).
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import SettingsError
from .names import DISTRIBUTION_NAME, ENTRY_POINT_NAME, PROVIDER_NAME, normalize_distribution

#: name -> what it does; also the source of ``mqa --help``'s environment section.
ENV_VARS = {
    "MQA_PROVIDER": "ordered preference 'a[,dist:b,...]': the first usable one is used, else the call fails; "
                    "'distribution:name' picks one of two providers that claim a name",
    "MQA_DISABLE_PROVIDERS": "'a,dist,dist:b': providers never chosen, by provider name, distribution, or both",
    "MQA_PLUGINS": "'dist[,dist:entry_point...]': import only these plugins, by distribution name (or one "
                   "entry point of a distribution); empty: none; nothing else is imported",
    "MQA_STRICT_PLUGINS": "1/0, true/false, yes/no, on/off: a broken plugin raises instead of being isolated",
    "MQA_VALIDATE": "'cheap' (default) or 'full': also check what needs a device sync (k_scale > 0, block "
                    "ids, non-finite logits inside the windows)",
    "MQA_TORCH_REF_MEMORY_MB": "torch_ref's bound on temporary memory, in MiB: a positive number (default 512)",
    "MQA_GLUON_PDL": "1/0 (default 1): the gluon provider's sm_90 decode kernel launched as a programmatic "
                     "dependent launch that lets the next kernel start early, or plainly (faster beside "
                     "plainly launched kernels; docs/paged-op.md)",
    "MQA_TUNING": "FILE written by `mqa tune`: per shape bucket, the fastest measured usable provider is chosen",
    "MQA_WORKSPACE_MB": "the indexer step's bound on extra device memory, in MiB (default 256): the top-k ops "
                        "score rows in chunks whose temporaries fit it, whatever the context length",
    "MQA_BATCH_INVARIANT": "1/0 (default 0): choose only providers that claim batch_invariant (a query's "
                           "result never depends on the rest of the batch), for every op",
}
#: MQA_WORKSPACE_MB's default.
DEFAULT_WORKSPACE_MB = 256.0

#: Names under this prefix belong to the test suite's stand-ins and are not warned about.
TEST_PREFIX = "MQA_TEST_"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
#: MQA_VALIDATE's accepted values.
VALIDATE_MODES = ("cheap", "full")


def parse_bool(variable: str, text: str | None, default: bool = False) -> bool:
    """1/0, true/false, yes/no, on/off in any case; unset or empty -> ``default``."""
    if text is None or not text.strip():
        return default
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise SettingsError(f"{variable}={text!r} is not a boolean: use one of {', '.join(_TRUE + _FALSE)}")


def parse_choice(variable: str, text: str | None, choices: tuple[str, ...]) -> str:
    """One of ``choices`` in any case; unset or empty -> the first."""
    if text is None or not text.strip():
        return choices[0]
    word = text.strip().lower()
    if word not in choices:
        raise SettingsError(f"{variable}={text!r} is not accepted: use one of {', '.join(choices)}")
    return word


def parse_positive_number(variable: str, text: str | None, default: float) -> float:
    """A positive, finite number written in ASCII; unset or empty -> ``default``. Anything else
    (``abc``, ``0``, ``-1``, ``inf``, ``٥``) raises SettingsError naming the variable."""
    if text is None or not text.strip():
        return default
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SettingsError(f"{variable}={text!r} must be a positive number")
    return value


def env_positive_number(variable: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """A positive, finite number from ``env[variable]``, by default as the current state read it (once
    per state, like every ``MQA_*`` variable: :func:`mqa_core.reload` reads it again); unset or empty
    -> ``default``. Anything else raises SettingsError naming the variable.

    For providers' own variables (torch_ref reads ``MQA_TORCH_REF_MEMORY_MB`` with it).
    """
    if env is not None:
        return parse_positive_number(variable, env.get(variable), default)
    from . import registry  # the state holds the snapshot (and imports this module)

    return registry.state().settings.number(variable, default)


def setting_text(variable: str) -> str | None:
    """The value an ``MQA_*`` variable had when the current state read the environment (None when
    unset): how a provider reads its own variables once per state, as the core reads its own."""
    from . import registry

    return registry.state().settings.env.get(variable)


#: Providers' variables that ENV_VARS documents: checked when the settings are read, so a bad value
#: is an error from the start (``mqa providers`` exits 2), not from some later call.
PROVIDER_VARIABLES: dict[str, Callable[[str, str | None], object]] = {
    "MQA_TORCH_REF_MEMORY_MB": lambda var, text: parse_positive_number(var, text, 1.0),
    "MQA_GLUON_PDL": lambda var, text: parse_bool(var, text, default=True),
}


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """One message per ``MQA_*`` variable set in ``env`` (``os.environ`` by default) that nothing reads,
    naming the closest known one: a misspelt setting must not be silently ignored."""
    env = os.environ if env is None else env
    out = []
    for name in sorted(env):
        if not name.startswith("MQA_") or name in ENV_VARS or name.startswith(TEST_PREFIX):
            continue
        close = difflib.get_close_matches(name, list(ENV_VARS), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(ENV_VARS)}"
        out.append(f"{name} is not a setting mqa-core or its providers read, so it changes nothing; {hint}")
    return out


def _provider_ref(text: str) -> str | None:
    """``name`` or ``dist:name``, normalised; None when malformed."""
    dist, sep, name = text.rpartition(":")
    name = name.lower()
    if not PROVIDER_NAME.fullmatch(name):
        return None
    if not sep:
        return name
    if not DISTRIBUTION_NAME.fullmatch(dist):
        return None
    return f"{normalize_distribution(dist)}:{name}"


def _block_ref(text: str) -> str | None:
    """A provider ref, or a bare distribution name."""
    ref = _provider_ref(text)
    if ref is not None:
        return ref
    return normalize_distribution(text) if DISTRIBUTION_NAME.fullmatch(text) else None


def _plugin_ref(text: str) -> str | None:
    """``dist`` or ``dist:entry_point``, the distribution normalised; None when malformed."""
    dist, sep, name = text.partition(":")
    if not DISTRIBUTION_NAME.fullmatch(dist) or (sep and not ENTRY_POINT_NAME.fullmatch(name)):
        return None
    return normalize_distribution(dist) + (f":{name}" if sep else "")


def parse_list(variable: str, text: str | None, parse: Callable[[str], str | None], what: str) -> tuple[str, ...]:
    """Comma-separated entries, blanks dropped, duplicates removed, order kept; each one parsed."""
    if text is None:
        return ()
    out: dict[str, None] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        ref = parse(part)
        if ref is None:
            raise SettingsError(f"{variable}={text!r}: {part!r} is not {what}")
        out[ref] = None
    return tuple(out)


@dataclass(frozen=True)
class Settings:
    """Every ``MQA_*`` variable the core reads, parsed. Build with :meth:`from_env`."""

    #: MQA_PROVIDER: ``name`` or ``distribution:name`` (normalised), in the user's order.
    preference: tuple[str, ...] = ()
    #: MQA_DISABLE_PROVIDERS: provider names, distribution names, or ``distribution:name``.
    disabled: frozenset[str] = frozenset()
    #: MQA_PLUGINS: None: load every plugin; otherwise only these distributions (normalised), or
    #: ``distribution:entry_point`` for one entry point of one.
    plugins: frozenset[str] | None = None
    strict: bool = False
    validate_full: bool = False
    #: A table written by ``mqa tune`` (see mqa_core.tuning); None: choose by priority only.
    tuning: str | None = None
    #: MQA_WORKSPACE_MB in bytes: what the top-k ops may allocate beyond their inputs and outputs.
    workspace_bytes: int = int(DEFAULT_WORKSPACE_MB * 2**20)
    #: MQA_BATCH_INVARIANT: only providers claiming ``batch_invariant`` are chosen.
    batch_invariant: bool = False
    #: Every ``MQA_*`` variable as it was read (providers read their own from here: setting_text).
    env: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: (variable, default) -> the number read from ``env`` (env_positive_number's cache).
    _numbers: dict[tuple[str, float], float] = field(default_factory=dict, init=False, compare=False, repr=False)

    def number(self, variable: str, default: float) -> float:
        """``env[variable]`` as a positive number (:func:`parse_positive_number`), parsed once."""
        key = (variable, default)
        value = self._numbers.get(key)
        if value is None:
            value = self._numbers[key] = parse_positive_number(variable, self.env.get(variable), default)
        return value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Parse the variables (``os.environ`` by default); raise SettingsError naming a bad one."""
        env = os.environ if env is None else env
        snapshot = {k: v for k, v in env.items() if k.startswith("MQA_")}
        for variable, parse in PROVIDER_VARIABLES.items():
            parse(variable, snapshot.get(variable))
        plugins = env.get("MQA_PLUGINS")
        return cls(
            preference=parse_list("MQA_PROVIDER", env.get("MQA_PROVIDER"), _provider_ref,
                                  "a provider name or distribution:name"),
            disabled=frozenset(parse_list("MQA_DISABLE_PROVIDERS", env.get("MQA_DISABLE_PROVIDERS"), _block_ref,
                                          "a provider name, a distribution name, or distribution:name")),
            plugins=None if plugins is None else frozenset(
                parse_list("MQA_PLUGINS", plugins, _plugin_ref, "a distribution name or distribution:entry_point")),
            strict=parse_bool("MQA_STRICT_PLUGINS", env.get("MQA_STRICT_PLUGINS")),
            validate_full=parse_choice("MQA_VALIDATE", env.get("MQA_VALIDATE"), VALIDATE_MODES) == "full",
            tuning=env.get("MQA_TUNING", "").strip() or None,
            workspace_bytes=max(1, int(parse_positive_number("MQA_WORKSPACE_MB", env.get("MQA_WORKSPACE_MB"),
                                                             DEFAULT_WORKSPACE_MB) * 2**20)),
            batch_invariant=parse_bool("MQA_BATCH_INVARIANT", env.get("MQA_BATCH_INVARIANT")),
            env=MappingProxyType(snapshot),
        )
