"""The exceptions mqa_core raises; each message is meant to be read by a person."""

from __future__ import annotations


class ProviderUnavailableError(LookupError):
    """No provider can serve the request; the message is the rendered decision trace."""

    def __init__(self, message: str, decision: object = None) -> None:
        super().__init__(message)
        #: The :class:`mqa_core.Decision` behind the failure, when there is one.
        self.decision = decision


class PluginError(RuntimeError):
    """A provider plugin is broken; raised instead of isolated when ``MQA_STRICT_PLUGINS=1``."""
