"""The job channel: the launcher's HTTP line to workers on hosts that share no disk with it.

Both ends live here, so the protocol is read in one place: the head serves it (server.py) and
the workers fetch their config and post their records through it; the token that guards it
travels as a file (token.py). The head and the worker import this room; it imports neither.
"""
