"""Engines whose models live in a model host process: the worker side of the host's IPC.

``wire`` frames the control messages, ``ring`` carries audio in shared memory, ``link`` is
a worker's one connection to the host, and ``engine`` is the speak engine a worker serves
for each engine the host hosts (the shape of the remote ``cosyvoice-triton`` engine).
"""
