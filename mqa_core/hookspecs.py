"""The one hook a provider implements, and the markers for it (pluggy project ``mqa_core``)."""

from __future__ import annotations

from collections.abc import Sequence

import pluggy

from .spec import ProviderSpec

PROJECT = "mqa_core"
#: Entry-point group under which provider distributions register their hook module.
ENTRY_POINT_GROUP = "mqa_core.providers"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a provider's ``mqa_providers`` function with this.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def mqa_providers() -> Sequence[ProviderSpec]:
    """Declare the kernels this plugin offers.

    Called once per process, at discovery. Return one :class:`ProviderSpec` per provider (a plugin may
    offer several, each under its own name). Keep it cheap: build specs from constants, import no
    kernel library here; put imports behind ``ProviderSpec.load`` and ``ProviderSpec.check``.

    Trust: whatever this hook (or the module's import, a spec's ``check``, ``shape_limits`` or
    ``load``) raises, ``SystemExit`` included, is recorded as this plugin's failure; a plugin is
    used whole or not at all, so one invalid item discards every spec it returns. A provider name
    another distribution also claims is ambiguous until the user picks ``distribution:name``.
    See ``docs/hooks.md``.

    :return: the specs; an empty sequence when this plugin offers nothing on this system.

    Example, in ``my_provider/plugin.py`` registered as
    ``[project.entry-points."mqa_core.providers"] my = "my_provider.plugin"``::

        from mqa_core import ProviderSpec, hookimpl

        @hookimpl
        def mqa_providers():
            return [ProviderSpec(name="my", ops={"fp8_mqa_logits"}, archs={"sm_90", "gfx942"},
                                 dtype_pairs={"gfx942": [("float8_e4m3fnuz", "float8_e4m3fnuz")],
                                              "any": [("float8_e4m3fn", "float8_e4m3fn")]},
                                 priority=100, load="my_provider.kernel:PROVIDER")]
    """
    raise NotImplementedError
