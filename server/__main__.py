"""``python -m server``: ``serve`` runs the server (:mod:`server.deploy.cli`); ``peer`` runs
the headless peer (:mod:`peer.cli`).

The peer is a client in a package of its own, which the server never imports: this
launcher is the one place that names it, and loads it only for the ``peer`` command.
"""

import sys

if sys.argv[1:2] == ["peer"]:
    from peer.cli import main as peer_main

    raise SystemExit(peer_main(sys.argv[2:]))

from server.deploy.cli import main

raise SystemExit(main())
