"""MailRelay's extras (docs/installation.md): the optional features whose packages ``pip install mailrelay``
leaves out, the modules each brings, and the variable that turns the feature on.

``check(settings)`` runs at start-up with the other configuration checks: a configured feature whose extra is
missing stops the relay with one line (``MAIL_RELAY_QUEUE=jetstream needs the queue extra: pip install
'mailrelay[queue]'``) and exit code 2. The packages are imported only where each feature is built.
"""

from __future__ import annotations

from bastion_core._extras import Extra
from mailrelay._config import PREFIX, Settings

DISTRIBUTION = "mailrelay"
S3 = Extra(
    distribution=DISTRIBUTION, name="s3", modules=("boto3", "botocore"), feature=f"{PREFIX}ATTACHMENT_DELIVERY=s3"
)
DMARC = Extra(
    distribution=DISTRIBUTION,
    name="dmarc",
    modules=("dkim", "spf", "dns", "publicsuffixlist"),
    feature=f"{PREFIX}DMARC_MODE",
)
QUEUE = Extra(distribution=DISTRIBUTION, name="queue", modules=("nats",), feature=f"{PREFIX}QUEUE=jetstream")
# The sender rules' Cedar engine (bastion_core._cedar, shared with Bastion; docs/installation.md)
POLICY = Extra(distribution=DISTRIBUTION, name="policy", modules=("cedarpy",), feature=f"{PREFIX}SENDER_POLICY_FILE")
EXTRAS = (S3, DMARC, QUEUE, POLICY)
RAW_S3 = Extra(distribution=DISTRIBUTION, name="s3", modules=("boto3", "botocore"), feature=f"{PREFIX}RAW=s3")
"""The s3 extra again, named for the other variable that needs it (not a second extra: EXTRAS lists each once)."""
DEAD_LETTERS = Extra(distribution=DISTRIBUTION, name="queue", modules=("nats",), feature="mailrelay dead-letters")
"""The queue extra, for the dead-letters command."""


def configured(settings: Settings) -> tuple[Extra, ...]:
    """The extras the settings turn on."""
    on = {
        S3: settings.attachment_delivery == "s3" and settings.s3_bucket is not None,
        DMARC: settings.dmarc_mode != "off",
        QUEUE: settings.queue == "jetstream" and settings.nats_url is not None,
        RAW_S3: settings.raw == "s3" and settings.s3_bucket is not None,
        POLICY: settings.sender_policy_file is not None,
    }
    return tuple(extra for extra in (*EXTRAS, RAW_S3) if on[extra])


def check(settings: Settings) -> None:
    """Raise MissingExtra for the first configured feature whose extra is not installed."""
    for extra in configured(settings):
        extra.require()
