"""Synthetic but realistic text for benchmarks: sentences built from a vocabulary and templates.

Real embeddings of such text cluster the way CRM notes and policies do (by topic, company, person),
which is what vector search and HNSW recall depend on; uniform random vectors would not.
Deterministic for a given seed.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

PEOPLE = "Jane Raj Li Marta Samir Dolores Lucas Priya Kwame Hannah Omar Sofia Chen Aisha Tom Elena Yuki Pedro Nina Felix".split()
COMPANIES = "Acme Globex Initech Umbrella Hooli Vandelay Pinnacle Stark Wayne Wonka Soylent Cyberdyne Tyrell Gringotts Oscorp".split()
TOPICS = {
    "pricing": ["annual prepay", "the volume discount", "a multi-year term", "the Enterprise upgrade", "list price", "add-on pricing"],
    "security": ["the SOC 2 report", "SSO setup", "data residency", "the penetration test", "encryption at rest", "the DPA"],
    "support": ["a sync outage", "ticket escalation", "the on-call rota", "an API timeout", "the status page", "a data export"],
    "legal": ["the liability cap", "contract redlines", "the termination clause", "auto-renewal terms", "the MSA", "indemnity"],
    "onboarding": ["the kickoff call", "admin training", "the rollout plan", "data migration", "the success plan", "user invites"],
}
VERBS = ["asked about", "pushed back on", "wants clarity on", "raised concerns about", "confirmed", "agreed to", "followed up on"]
OUTCOMES = [
    "Told them approval is needed from the sales director.", "Promised an answer by Friday.", "Sent the relevant policy section.",
    "They will loop in procurement next week.", "Escalated to the account executive.", "No decision yet; revisit after budget review.",
    "Shared a quote valid for 30 days.", "Agreed to a follow-up call with their CFO.",
]
RULES = [
    "Discounts above {n}% need written approval from the {role}.", "Requests must be answered within {n} business days.",
    "Data is kept for {n} days after the contract ends unless a legal hold applies.", "Refunds are prorated after {n} days.",
    "Escalations move to tier {k} when unresolved after {n} hours.", "Multi-year terms lock the price for {k} years.",
    "Exceptions are logged in the deal desk tracker with the {role}'s sign-off.", "Trials last {n} days and may be extended once.",
]
ROLES = ["sales director", "VP of sales", "CFO", "deal desk", "legal counsel", "security lead", "support manager"]


def memory_text(rng: random.Random) -> str:
    topic = rng.choice(list(TOPICS))
    return (
        f"{rng.choice(PEOPLE)} from {rng.choice(COMPANIES)} {rng.choice(VERBS)} {rng.choice(TOPICS[topic])} "
        f"during the {rng.choice(['call', 'meeting', 'email thread', 'QBR', 'demo'])}. {rng.choice(OUTCOMES)}"
    )


def section_text(rng: random.Random, sentences: int = 5) -> tuple[str, str]:
    topic = rng.choice(list(TOPICS))
    heading = f"{topic.title()}: {rng.choice(TOPICS[topic])}"
    body = " ".join(
        rng.choice(RULES).format(n=rng.choice([5, 10, 14, 20, 30, 45, 60, 90]), k=rng.randint(2, 3), role=rng.choice(ROLES))
        for _ in range(sentences)
    )
    return heading, f"This applies to {rng.choice(TOPICS[topic])}. {body}"


def question(rng: random.Random) -> str:
    topic = rng.choice(list(TOPICS))
    return rng.choice([
        f"What did we agree about {rng.choice(TOPICS[topic])}?",
        f"Who has to approve {rng.choice(TOPICS[topic])} for {rng.choice(COMPANIES)}?",
        f"What are the rules for {rng.choice(TOPICS[topic])}?",
        f"Has {rng.choice(PEOPLE)} raised anything about {rng.choice(TOPICS[topic])} recently?",
    ])  # fmt: skip


def bundle(org: str, *, memories: int, sections: int, records: int = 200, seed: int = 7, per_doc: int = 8) -> dict:
    """A bundle of ``records`` contacts, ``memories`` memories and ``sections`` sections in one org."""
    rng = random.Random(seed)
    start = datetime(2025, 1, 1, tzinfo=timezone.utc)
    recs = [
        {"id": f"r{i}", "org": org, "kind": "contact",
         "identifiers": {"email": f"{rng.choice(PEOPLE).lower()}{i}@{rng.choice(COMPANIES).lower()}.com"},
         "properties": {"deal_stage": rng.choice(["discovery", "negotiation", "closed won"]), "seats": rng.randint(5, 500)}}
        for i in range(records)
    ]  # fmt: skip
    mems = [
        {"id": f"m{i}", "org": org, "record": f"r{rng.randrange(records)}", "text": memory_text(rng),
         "created_at": (start + timedelta(minutes=37 * i)).isoformat()}
        for i in range(memories)
    ]  # fmt: skip
    docs = []
    for d in range((sections + per_doc - 1) // per_doc):
        count = min(per_doc, sections - d * per_doc)
        secs = []
        for s in range(count):
            heading, text = section_text(rng)
            secs.append({"id": f"d{d}-s{s}", "heading": heading, "text": text})
        docs.append({"id": f"d{d}", "org": org, "title": f"{rng.choice(list(TOPICS)).title()} policy {d}", "sections": secs})
    return {"orgs": [{"id": org}], "callers": [{"id": "bench", "org": org, "roles": ["sales"]}],
            "records": recs, "memories": mems, "documents": docs}  # fmt: skip
