"""The public Python client library (``DuplexClient``); arriving with its issue."""
