"""``python -m assignment.trainer`` is ``ppo-train``."""

import sys

from assignment.trainer.cli import main

sys.exit(main())
