"""``python -m socllm ...`` is the ``socllm`` command."""

import sys

from .cli import main

sys.exit(main())
