"""`python -m mailrelay`, the same as the `mailrelay` console script."""

from __future__ import annotations

import sys

from mailrelay.cli import main

sys.exit(main())
