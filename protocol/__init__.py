"""Wire contract of duplex-server: one msgspec Struct per message.

This package is a leaf: it imports nothing from ``duplex_server`` so that
clients and servers can share it.
"""
