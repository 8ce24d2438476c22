"""The bundle models' content hash: what a store keeps to tell a changed item from one loaded again as it was."""

from __future__ import annotations

from dossier.bundle import Caller, Org, Record, content_hash


def test_the_hash_is_pinned_so_existing_stores_do_not_reload_everything() -> None:
    """Stores hold these hashes: a new formula would make every item of every store look changed."""
    assert Org(id="acme", name="Acme").content_hash == "bdc424e960f81bf8ed7f55f821b28cc4"
    jane = Record(id="r1", org="acme", kind="contact", identifiers={"email": "Jane@Acme.com"}, properties={"tier": "gold"})
    assert jane.content_hash == content_hash(jane) == "6afe4b61c0354634eab2c5f595971614"


def test_the_hash_follows_the_normalised_content() -> None:
    one = Record(id="r1", org="acme", kind="contact", identifiers={"email": "Jane@Acme.com"})
    same = Record(id="r1", org="acme", kind="contact", identifiers={"email": "jane@acme.com"})
    assert one.content_hash == same.content_hash  # identifiers are hashed as stored (normalised)
    assert Caller(id="ana", org="acme", roles=("sales",)).content_hash != Caller(id="ana", org="acme").content_hash
    assert Org(id="acme").content_hash != Org(id="acme", name="Acme").content_hash
