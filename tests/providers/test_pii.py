"""Masking personal data: known values and patterns are replaced, unmask restores the exact text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dossier.bundle import Record
from dossier.providers.pii import Masker

JANE = Record.model_validate({
    "id": "rec-jane", "org": "northwind", "kind": "contact",
    "identifiers": {"email": "jane@acme.com", "phone": "+1 415 555 0100", "profile_url": "https://www.linkedin.com/in/jane-doe"},
    "properties": {"name": "Jane Doe", "plan": "Enterprise", "seats": 120, "phone_ext": 4155550100, "vip": True},
})  # fmt: skip

TEXT = (
    "Call with Jane Doe (Jane@Acme.com, (415) 555-0100) on 2025-01-14 16:00 about the Enterprise plan for 120 seats. "
    "Her colleague bob@example.org (+44 20 7946 0958) sent card 4111 1111 1111 1111 and IBAN DE89 3704 0044 0532 0130 00 "
    "from 10.0.0.1; profile https://www.linkedin.com/in/jane-doe. Version 1.2.3 shipped on 14.01.2025."
)


def test_known_values_and_patterns_are_masked_and_restored() -> None:
    masker = Masker.for_records([JANE])
    masked = masker.mask(TEXT)
    for secret in ("Jane", "Doe", "Jane@Acme.com", "555-0100", "Enterprise", "bob@example.org", "7946 0958",
                   "4111 1111", "DE89", "10.0.0.1", "linkedin.com/in/jane-doe"):  # fmt: skip
        assert secret.lower() not in masked.lower(), secret
    # dates, times, small numbers and version strings are not personal data
    for kept in ("2025-01-14 16:00", "120 seats", "1.2.3", "14.01.2025"):
        assert kept in masked, kept
    assert masker.unmask(masked) == TEXT
    assert "<EMAIL_1>" in masked and "<PHONE_1>" in masked and "<VALUE_" in masked


def test_the_same_value_gets_the_same_placeholder_across_texts() -> None:
    masker = Masker.for_records([JANE])
    a, b = masker.mask("write to jane@acme.com"), masker.mask("jane@acme.com replied")
    assert a.split()[-1] == b.split()[0] == "<EMAIL_1>"
    assert masker.unmask("I emailed <EMAIL_1> and <UNKNOWN_9>") == "I emailed jane@acme.com and <UNKNOWN_9>"


@pytest.mark.parametrize("value", ["email", "Jane"])
def test_values_match_whole_words_only(value: str) -> None:
    record = JANE.model_copy(update={"properties": {"channel": "email", "name": "Jane"}})
    masked = Masker.for_records([record]).mask("emails to Janet by email, Jane's reply")
    assert "emails" in masked and "Janet" in masked
    assert " email," not in masked and "Jane's" not in masked


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_mask_then_unmask_is_the_identity(text: str) -> None:
    masker = Masker.for_records([JANE])
    assert masker.unmask(masker.mask(text + " jane@acme.com " + text)) == text + " jane@acme.com " + text
