"""``python -m pipeline serve|transcribe|doctor``: the ``sensevoice`` command (pipeline/entry.py)."""

import sys

from pipeline.entry import main

sys.exit(main())
