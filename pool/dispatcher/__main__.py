"""``python -m pool.dispatcher``: see :mod:`pool.dispatcher.server`."""

import sys

from pool.dispatcher.server import main

sys.exit(main())
