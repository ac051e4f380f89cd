"""Errors a user can meet. The CLI prints their message as one line and exits non-zero."""


class PrefillError(Exception):
    """Base of every error we raise on purpose; the message says what to do."""


class BadInput(PrefillError, ValueError):
    """An argument, prompt or request that cannot be served as given."""


class ModelFileError(PrefillError):
    """A model file or folder that is missing, truncated or of an unsupported architecture."""
