"""A small labelled data set for the analyses: templated sentences, subjects x attributes.

The "Beyond Gaussian" post (papers/004) used 10 subjects x 12 attributes x 200 sentences written
by a language model; this is a small, deterministic stand-in built from templates: 5 subjects,
5 attributes (a tone, a casing, a style, a sentence form, and neutral), 8 facts per subject, so
200 rows. Every (subject, attribute) cell holds the same 8 facts, rewritten by the attribute.

``repgeom-example-data data/examples/subject_attribute.csv`` writes it.

Examples
--------
>>> df = make_examples()
>>> df.shape, sorted(df.columns)
((200, 3), ['attribute', 'subject', 'text'])
>>> df.groupby(["subject", "attribute"]).size().unique().tolist()
[8]
"""

from __future__ import annotations

import pandas as pd

__all__ = ["SUBJECTS", "ATTRIBUTES", "make_examples"]

SUBJECTS: dict[str, list[str]] = {
    "cats": [
        "Cats sleep for most of the day",
        "A cat can hear sounds that people cannot",
        "Cats use their whiskers to judge small gaps",
        "The cat knocked the glass off the table",
        "Most cats dislike getting wet",
        "A kitten learns to hunt by watching its mother",
        "Cats purr when they feel safe",
        "The old cat sat in the warm window",
    ],
    "ocean": [
        "The ocean covers most of the planet",
        "Waves carry energy across the sea",
        "Deep water in the ocean is very cold",
        "Tides rise and fall twice a day",
        "Whales travel thousands of miles across the sea",
        "Coral reefs grow in warm shallow water",
        "The sea looked grey under the storm clouds",
        "Salt makes ocean water heavier than river water",
    ],
    "football": [
        "The team scored a goal in the last minute",
        "A football match lasts ninety minutes",
        "The goalkeeper caught the ball with both hands",
        "Fans sang loudly during the whole game",
        "The striker missed the penalty kick",
        "The coach changed the players at half time",
        "The referee showed the defender a yellow card",
        "The stadium was full for the final",
    ],
    "cooking": [
        "Onions should be cooked slowly until they are soft",
        "Bread needs time to rise before baking",
        "A sharp knife makes cutting vegetables easier",
        "The soup simmered on the stove for an hour",
        "Salt brings out the flavour of the tomatoes",
        "Rice absorbs water as it cooks",
        "The cake was baked at a low temperature",
        "Fresh herbs are added at the end of cooking",
    ],
    "space": [
        "The moon orbits the earth once a month",
        "Astronauts train for years before a mission",
        "Mars has the tallest volcano in the solar system",
        "The rocket launched just before sunrise",
        "Light from the sun reaches the earth in eight minutes",
        "Jupiter is the largest planet around the sun",
        "The space station circles the planet every ninety minutes",
        "Stars are born inside clouds of gas and dust",
    ],
}


def _neutral(fact: str) -> str:
    return fact + "."


def _angry(fact: str) -> str:
    return f"I am so sick of hearing it: {fact[0].lower() + fact[1:]}! Stop telling me!"


def _lower(fact: str) -> str:
    return fact.lower() + "."


def _childish(fact: str) -> str:
    return f"Guess what!! {fact} and that is super duper cool!!"


def _question(fact: str) -> str:
    return f"Is it true that {fact[0].lower() + fact[1:]}?"


ATTRIBUTES = {
    "neutral": _neutral,
    "angry tone": _angry,
    "all lower case": _lower,
    "childish style": _childish,
    "question": _question,
}


def make_examples() -> pd.DataFrame:
    """The data set: columns ``text, subject, attribute``, 200 rows, fixed order."""
    rows = [
        {"text": rewrite(fact), "subject": subject, "attribute": attribute}
        for subject, facts in SUBJECTS.items()
        for attribute, rewrite in ATTRIBUTES.items()
        for fact in facts
    ]
    return pd.DataFrame(rows)
