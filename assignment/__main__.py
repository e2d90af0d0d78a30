"""``python -m assignment`` is ``ppo-train``."""

import sys

from assignment.cli import main

sys.exit(main())
