"""The end-to-end suites' fixtures, for check_metrics.py (real `bastion run` and `mailrelay` processes)."""

from tests.e2e.conftest import key_env, minter
from tests.e2e.mailrelay.conftest import own_webhook, queue_relay, start_relay, stream_name

__all__ = ["key_env", "minter", "own_webhook", "queue_relay", "start_relay", "stream_name"]
