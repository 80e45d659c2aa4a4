"""The model host: one process per device that owns the models of the hostable engines and
serves every media worker's sessions from them, batched where the engine batches.

``service`` accepts the workers' connections (a Unix socket each, with a shared-memory
ring for the audio it sends back), ``connection`` is one worker's sessions on the host,
and ``utterance`` drives one utterance through the host's compute threads.
"""
