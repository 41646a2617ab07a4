"""Session core: the log, its pure fold, the actor that drives it, and the manager.

Nothing here calls a model or a socket directly: the actor talks to a
:class:`~duplex_server.sessions.model_port.ModelPort` and to attachments.
"""
