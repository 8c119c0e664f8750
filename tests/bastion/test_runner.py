"""``bastion run``'s start-up work that is not the server's: objects built before serving are frozen for the GC."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_startup_objects_leave_the_collectors_sight() -> None:
    """Run in a fresh interpreter: freezing is process-wide and would change this test process's collections."""
    script = (
        "import gc\n"
        "from bastion._runner import freeze_startup_objects\n"
        "import examples.documents_api as ex\n"
        "from bastion import load_settings\n"
        "ex.service.build(load_settings(environ={'SERVICE_TOKEN_ENABLED': 'false'}))\n"
        "assert gc.get_freeze_count() == 0\n"
        "freeze_startup_objects()\n"
        "frozen = gc.get_freeze_count()\n"
        "print(frozen, len(gc.get_objects()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    frozen, still_tracked = (int(n) for n in done.stdout.split())
    assert frozen > 50_000  # the app's routes, schemas, validators, policies: most of the heap
    assert still_tracked < frozen // 10
