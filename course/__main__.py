"""``python -m course`` is ``ppo-course``."""

import sys

from course.cli import main

sys.exit(main())
