"""``python -m services`` is the ``temper`` command."""

import sys

from services.cli import main

sys.exit(main())
