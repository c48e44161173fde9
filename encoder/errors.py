"""The encoder's exceptions. The service maps :class:`EncoderError` subclasses to HTTP statuses."""

from __future__ import annotations


class EncoderError(RuntimeError):
    """Base of every error raised while loading or running an encoder."""


class ModelDirError(EncoderError):
    """A model directory (or hub id) cannot be loaded or saved; the message names the file."""


class DeviceError(EncoderError):
    """The requested device does not exist on this machine."""
