"""Engines whose models live in a model host process: the worker side of the host's IPC.

``wire`` frames the control messages, ``ring`` carries speech audio in shared memory,
``link`` is a worker's one connection to the host, ``description`` how the host describes
its engines, and ``catalog`` makes one worker engine of each: ``engine``'s speak engine
(the shape of the remote ``cosyvoice-triton`` engine) or ``transform``'s, whose audio goes
to the host and back chunk by chunk, on a server loop's own ``hop_channel`` (``hops``
matches the host's answers to the chunks in flight).
"""
