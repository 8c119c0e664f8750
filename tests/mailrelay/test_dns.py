"""DnsClient against a real DNS server: answers, empty answers, failures, the shared deadline."""

from __future__ import annotations

import pytest

from mailrelay._dns import Deadline, DnsClient, DnsFailure
from mailrelay.testing import FakeClock
from tests.mailrelay.servers import DnsZone


@pytest.fixture(scope="module")
def client(dns_zone: DnsZone) -> DnsClient:
    return DnsClient(servers=[("127.0.0.1", dns_zone.port)], timeout=0.5)


def test_txt_records_are_joined_per_record(client: DnsClient, dns_zone: DnsZone) -> None:
    dns_zone.txt("joined.dns.test", "a" * 300, "second")
    assert sorted(client.txt("Joined.DNS.test.")) == [b"a" * 300, b"second"]


def test_missing_names_and_types_are_empty(client: DnsClient, dns_zone: DnsZone) -> None:
    dns_zone.a("only-a.dns.test", "192.0.2.1")
    assert client.txt("only-a.dns.test") == []
    assert client.txt("nxdomain.dns.test") == []
    assert client.txt("a" * 70 + ".dns.test") == []  # a label over 63 octets cannot exist


@pytest.mark.parametrize("how", ["slow", "servfail"])
def test_timeouts_and_servfail_are_failures(client: DnsClient, dns_zone: DnsZone, how: str) -> None:
    name = f"{how}.dns.test"
    getattr(dns_zone, how).add(name)
    with pytest.raises(DnsFailure, match=name):
        client.txt(name)


def test_a_spent_deadline_asks_nothing(client: DnsClient, dns_zone: DnsZone) -> None:
    clock = FakeClock()
    deadline = Deadline(2.0, clock=clock)
    clock.advance(2.0)
    before = len(dns_zone.queries)
    with pytest.raises(DnsFailure, match="time for DNS checks used up"):
        client.txt("any.dns.test", deadline=deadline)
    assert len(dns_zone.queries) == before
