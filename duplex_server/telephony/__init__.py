"""Phone calls: a carrier's media stream as a session like any other.

A carrier (Twilio first) asks the voice webhook what to do with a call; the
answer connects the call's audio to the media stream socket, and that
socket is a shell over the same session step as ``/v1/realtime``: inbound
audio becomes appends, the answer's audio leaves as the carrier's media
frames, and the carrier's marks are the playback acks.
"""
