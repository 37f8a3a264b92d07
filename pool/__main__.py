"""``python -m pool``: see :mod:`pool.cli`."""

import sys

from pool.cli import main

sys.exit(main())
