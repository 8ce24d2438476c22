"""Identifier normalisation: what is stored is what is asked for."""

from __future__ import annotations

import pytest

from dossier.identifiers import email_domain, normalize, registrable_domain

TABLE = [
    ("email", "Jane.Doe@Acme.COM", "jane.doe@acme.com"),
    ("email", "  bob@eu.acme.co.uk ", "bob@eu.acme.co.uk"),
    ("phone", "+1 (555) 010-2000", "15550102000"),
    ("phone", "+44 20 7946 0958", "442079460958"),
    ("phone", "030/123456", "030123456"),
    ("website", "https://www.Acme.com/pricing?x=1", "acme.com"),
    ("website", "acme.com", "acme.com"),
    ("website", "shop.eu.acme.com", "acme.com"),
    ("website", "http://www.acme.co.uk/", "acme.co.uk"),
    ("website", "store.acme.co.uk", "acme.co.uk"),
    ("website", "acme.com.au", "acme.com.au"),
    ("website", "example.org.", "example.org"),
    ("website", "ACME.IO:8080/x", "acme.io"),
    ("profile_url", "https://www.linkedin.com/in/jane-doe/", "linkedin.com/in/jane-doe"),
    ("profile_url", "linkedin.com/in/Jane-Doe?trk=abc", "linkedin.com/in/jane-doe"),
    ("profile_url", "http://uk.linkedin.com/in/jane", "uk.linkedin.com/in/jane"),
    ("profile_url", "github.com/janedoe#readme", "github.com/janedoe"),
]


@pytest.mark.parametrize("kind, value, expected", TABLE)
def test_normalise(kind: str, value: str, expected: str) -> None:
    assert normalize(kind, value) == expected


@pytest.mark.parametrize("kind, value, expected", TABLE)
def test_normalising_twice_changes_nothing(kind: str, value: str, expected: str) -> None:
    assert normalize(kind, expected) == expected


@pytest.mark.parametrize(
    "kind, value",
    [
        ("email", "jane"),
        ("email", "jane@acme"),
        ("email", "jane doe@acme.com"),
        ("email", "@acme.com"),
        ("phone", "12345"),
        ("phone", "call me"),
        ("phone", "1" * 16),
        ("website", "localhost"),
        ("website", "not a website"),
        ("website", "192.168.0.1"),
        ("website", "-acme.com"),
        ("website", ""),
        ("profile_url", "linkedin.com"),
        ("profile_url", "https://linkedin.com/"),
        ("fax", "12345678"),
    ],
)
def test_invalid_values_raise_value_error(kind: str, value: str) -> None:
    with pytest.raises(ValueError):
        normalize(kind, value)


# a host name holds at most 253 characters and 63 between dots, an email address 254 (RFC 1035, RFC 5321): longer
# ones are no identifiers, and a store's index entry of a record's website or domain stays small
LABEL, HOST = "a" * 63, ".".join(["a" * 63] * 3) + "." + "b" * 57 + ".com"  # 63 and 253 characters


@pytest.mark.parametrize(("kind", "value"), [
    ("website", LABEL + ".com"), ("website", HOST), ("profile_url", HOST + "/in/jane"),
    ("email", "j" * 64 + "@" + LABEL + ".com"), ("email", "j@" + "b" * 63 + "." + "c" * 63 + "." + "d" * 63 + "." + "e" * 55 + ".com"),
])  # fmt: skip
def test_the_longest_host_label_and_email_a_standard_allows_are_identifiers(kind: str, value: str) -> None:
    assert normalize(kind, value) == normalize(kind, normalize(kind, value))


@pytest.mark.parametrize(("kind", "value", "says"), [
    ("website", "a" * 64 + ".com", "253 characters, 63 between dots"),
    ("website", "a" + HOST, "253 characters, 63 between dots"),
    ("profile_url", "a" + HOST + "/in/jane", "253 characters, 63 between dots"),
    ("email", "j@" + "a" * 64 + ".com", "254 characters, 63 between the dots"),
    ("email", "j" * 250 + "@acme.com", "254 characters, 63 between the dots"),
])  # fmt: skip
def test_a_longer_host_label_or_email_is_refused_saying_the_limit(kind: str, value: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        normalize(kind, value)


@pytest.mark.parametrize(
    "email, domain",
    [("jane@acme.com", "acme.com"), ("bob@eu.acme.co.uk", "acme.co.uk"), ("joe@gmail.com", None), ("x@proton.me", None)],
)
def test_email_domain_skips_freemail(email: str, domain: str | None) -> None:
    assert email_domain(email) == domain


def test_registrable_domain() -> None:
    assert registrable_domain("a.b.acme.com") == "acme.com"
    assert registrable_domain("a.b.acme.co.uk") == "acme.co.uk"
