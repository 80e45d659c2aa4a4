"""``python -m server``: see :mod:`server.cli`."""

from server.cli import main

raise SystemExit(main())
