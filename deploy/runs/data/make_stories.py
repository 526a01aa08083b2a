"""Writes stories.jsonl, the mix run's JSONL domain: short counting stories.

    python deploy/runs/data/make_stories.py      # rewrites stories.jsonl next to this file

Each line is {"id", "question", "answer"}.  The id is the arithmetic itself
("a+b-c"), so the split (by a hash of the id) keeps every story of one sum on the
same side: a held-out story never shares its numbers with a trained one.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ("Ann", "Ben", "Mia", "Sam", "Lea", "Tom", "Ivy", "Max")
THINGS = ("apples", "coins", "stickers", "shells", "marbles", "pencils", "cards", "stamps")
STORIES = (
    "{name} had {a} {things}. {name} found {b} more and gave {c} away. "
    "How many {things} does {name} have now?",
    "{name} has {a} {things}, gets {b} more, then loses {c}. How many {things} are left?",
    "A box holds {a} {things}. {b} are added and {c} are taken out. "
    "How many {things} are in the box?",
)


def stories(seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    lines = []
    for a in range(1, 10):
        for b in range(1, 10):
            for c in range(1, a + b + 1):
                if c > 9:
                    break
                text = rng.choice(STORIES).format(
                    name=rng.choice(NAMES), things=rng.choice(THINGS), a=a, b=b, c=c
                )
                lines.append({"id": f"{a}+{b}-{c}", "question": text, "answer": str(a + b - c)})
    return lines


def main() -> None:
    out = Path(__file__).with_name("stories.jsonl")
    out.write_text("".join(json.dumps(line) + "\n" for line in stories()))
    print(f"{out}: {len(stories())} stories")


if __name__ == "__main__":
    main()
