"""The environment variables mqa_core obeys, read once per (re)load into a frozen :class:`Settings`.

Reading them once keeps selection deterministic inside a process and the per-call path free of
``os.environ`` lookups; call :func:`mqa_core.reload` after changing them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

#: name -> what it does; also the source of ``mqa --help``'s environment section.
ENV_VARS = {
    "MQA_PROVIDER": "ordered preference 'a[,b]': the first usable of these is used, else the call fails",
    "MQA_DISABLE_PROVIDERS": "'a,b': providers never chosen",
    "MQA_PLUGINS": "'a,b': load only these entry-point names (empty: load none)",
    "MQA_STRICT_PLUGINS": "'1': a broken plugin raises instead of being isolated",
    "MQA_VALIDATE": "'full': also check values that need a device sync (k_scale > 0, block ids)",
    "MQA_TUNING": "FILE from `mqa tune`: per shape bucket, the fastest measured usable provider is chosen",
}


def _names(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    return tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


@dataclass(frozen=True)
class Settings:
    preference: tuple[str, ...] = ()
    disabled: frozenset[str] = frozenset()
    #: None: load every plugin; otherwise only these entry-point names.
    plugins: frozenset[str] | None = None
    strict: bool = False
    validate_full: bool = False
    #: A table written by ``mqa tune`` (see mqa_core.tuning); None: choose by priority only.
    tuning: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "Settings":
        plugins = env.get("MQA_PLUGINS")
        return cls(
            preference=_names(env.get("MQA_PROVIDER")),
            disabled=frozenset(_names(env.get("MQA_DISABLE_PROVIDERS"))),
            plugins=None if plugins is None else frozenset(_names(plugins)),
            strict=env.get("MQA_STRICT_PLUGINS", "").strip().lower() in ("1", "true", "yes"),
            validate_full=env.get("MQA_VALIDATE", "").strip().lower() == "full",
            tuning=env.get("MQA_TUNING", "").strip() or None,
        )
