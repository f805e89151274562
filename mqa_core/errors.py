"""The exceptions mqa_core raises; each message is meant to be read by a person."""

from __future__ import annotations


class ProviderUnavailableError(LookupError):
    """No provider can serve the request; the message is the rendered decision trace."""

    def __init__(self, message: str, decision: object = None) -> None:
        super().__init__(message)
        #: The :class:`mqa_core.Decision` behind the failure, when there is one.
        self.decision = decision


class PluginError(RuntimeError):
    """A provider plugin is broken; raised instead of isolated when ``MQA_STRICT_PLUGINS`` is on."""


class SettingsError(ValueError):
    """An ``MQA_*`` environment variable has a value mqa_core does not accept; the message names it."""


class ProviderResultError(RuntimeError):
    """A provider's kernel returned something that breaks the op's contract (type, shape, dtype,
    device, layout, or with ``MQA_VALIDATE=full`` non-finite values); the message names the provider,
    its distribution, what was expected and what came back."""

    def __init__(self, message: str, provider: str = "", distribution: str = "") -> None:
        super().__init__(message)
        self.provider = provider
        self.distribution = distribution
