"""``python -m workers``: run one worker (see :mod:`workers.process`)."""

import sys

from workers.process import main

sys.exit(main())
