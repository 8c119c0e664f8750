"""``python -m bastion``: the ``bastion`` command."""

import sys

from bastion._cli import main

sys.exit(main())
