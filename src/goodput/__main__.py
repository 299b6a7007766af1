"""``python -m goodput`` is the ``goodput`` command."""

import sys

from goodput.cli import main

sys.exit(main())
