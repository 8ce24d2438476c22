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


@pytest.mark.parametrize(
    "email, domain",
    [("jane@acme.com", "acme.com"), ("bob@eu.acme.co.uk", "acme.co.uk"), ("joe@gmail.com", None), ("x@proton.me", None)],
)
def test_email_domain_skips_freemail(email: str, domain: str | None) -> None:
    assert email_domain(email) == domain


def test_registrable_domain() -> None:
    assert registrable_domain("a.b.acme.com") == "acme.com"
    assert registrable_domain("a.b.acme.co.uk") == "acme.co.uk"
