import sys

from solutions.cli import main

sys.exit(main())
