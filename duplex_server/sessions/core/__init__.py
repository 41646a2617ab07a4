"""The pure session core: records and their fold into state, the command
handlers that turn client events into records, responses and turn logic.

No I/O, no clock, nothing awaited: every function here can be called from a
test without a loop, a store or a socket (DESIGN.md, "Layout")."""
