"""WebRTC calls: OpenAI's ``POST /v1/realtime/calls``, shelled over the session step.

``routes`` answers the offers, ``offer`` reads them, ``call`` is one peer
connection and its session, ``tracks`` its audio both ways, ``network`` the
ICE servers, host and ports. aiortc does ICE, DTLS, SRTP, SCTP and RTP.
"""
