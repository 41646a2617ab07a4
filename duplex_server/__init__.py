"""duplex-server: an event-sourced realtime session server."""

__version__ = "0.1.0"
