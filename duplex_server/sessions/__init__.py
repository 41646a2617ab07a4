"""Sessions: ``core`` (pure), ``log`` (storage) and ``runtime`` (asyncio).

Arrows: runtime uses core and log; log uses core's record types; core uses
neither. Nothing here calls a model or a socket directly: the actor talks to
a :class:`~duplex_server.sessions.core.model_port.ModelPort` and to
attachments. ``tests/test_architecture.py`` holds these arrows.
"""
