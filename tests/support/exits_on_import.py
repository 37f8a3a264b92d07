"""A module whose import ends the process that imports it, as a task's
module might: workers must refuse it, not exit."""

import sys

sys.exit(3)
