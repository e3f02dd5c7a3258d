"""Word banks of the cooperation tasks and the parse of an agent's answer.

Every problem of the cooperation tasks is a handful of words from one category. Training problems
use :data:`TRAIN_CATEGORIES` only and held-out problems :data:`HELD_OUT_CATEGORIES` only: no held-out
word (and no held-out category name) appears in any training prompt, so a held-out gain is a
convention that transfers to new content, not memorised pairings (:func:`check_disjoint` pins it).
The words are short, common and single words, so that an answer of 1-4 new tokens can name one.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence

TRAIN_CATEGORIES: dict[str, tuple[str, ...]] = {
    "animals": ("cat", "dog", "cow", "pig", "horse", "sheep", "goat", "mouse"),
    "fruits": ("apple", "pear", "plum", "grape", "lemon", "mango", "peach", "cherry"),
    "colors": ("red", "blue", "green", "yellow", "black", "white", "pink", "brown"),
    "vehicles": ("car", "bus", "train", "truck", "boat", "plane", "bike", "taxi"),
    "furniture": ("chair", "table", "bed", "desk", "sofa", "shelf", "bench", "stool"),
    "clothes": ("shirt", "hat", "coat", "sock", "shoe", "dress", "scarf", "glove"),
    "drinks": ("tea", "coffee", "milk", "juice", "water", "soda", "cocoa", "wine"),
    "tools": ("hammer", "saw", "drill", "wrench", "knife", "rope", "ladder", "shovel"),
    "sports": ("soccer", "tennis", "golf", "rugby", "boxing", "hockey", "cricket", "skiing"),
    "weather": ("rain", "snow", "wind", "fog", "hail", "storm", "sun", "frost"),
    "instruments": ("piano", "drum", "flute", "violin", "guitar", "harp", "trumpet", "cello"),
    "vegetables": ("carrot", "potato", "onion", "pea", "bean", "corn", "leek", "cabbage"),
}
"""Category -> 8 words; the only content of training problems."""

HELD_OUT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "birds": ("owl", "crow", "duck", "eagle", "swan", "robin", "hawk", "goose"),
    "metals": ("gold", "silver", "iron", "copper", "tin", "lead", "zinc", "steel"),
    "insects": ("ant", "bee", "wasp", "moth", "fly", "beetle", "flea", "gnat"),
    "shapes": ("circle", "square", "star", "heart", "oval", "cube", "cone", "ring"),
    "jobs": ("nurse", "farmer", "pilot", "baker", "judge", "chef", "singer", "tailor"),
    "gems": ("ruby", "pearl", "opal", "jade", "diamond", "amber", "topaz", "onyx"),
}
"""Category -> 8 words; the only content of held-out problems (none in :data:`TRAIN_CATEGORIES`)."""

SPLITS = ("train", "held_out")
"""The two splits a problem generator takes (``split``)."""


def categories(split: str) -> dict[str, tuple[str, ...]]:
    """The word bank of ``split`` (one of :data:`SPLITS`).

    Raises:
        ValueError: ``split`` not in :data:`SPLITS`.
    """
    if split not in SPLITS:
        raise ValueError(f"split: got {split!r}, allowed: {list(SPLITS)}")
    return TRAIN_CATEGORIES if split == "train" else HELD_OUT_CATEGORIES


def check_disjoint() -> None:
    """Raises ValueError when a held-out word or category also appears in training."""
    train = {w for ws in TRAIN_CATEGORIES.values() for w in ws} | set(TRAIN_CATEGORIES)
    held = {w for ws in HELD_OUT_CATEGORIES.values() for w in ws} | set(HELD_OUT_CATEGORIES)
    if train & held:
        raise ValueError(f"word banks: held-out words also in training: {sorted(train & held)}")


def _check_num_options(n: int) -> None:
    if not 2 <= n <= 8:
        raise ValueError(f"num_options: got {n}, must be in [2, 8] (a category has 8 words)")


def draw(rng: random.Random, split: str, n: int) -> tuple[str, list[str]]:
    """A category of ``split`` and ``n`` distinct words of it in random order.

    Raises:
        ValueError: ``n`` not in [2, 8] (a category has 8 words), or a bad ``split``.
    """
    _check_num_options(n)
    bank = categories(split)
    category = rng.choice(sorted(bank))
    return category, rng.sample(list(bank[category]), n)


def orderings(split: str, n: int) -> int:
    """How many distinct ordered draws of ``n`` words from one category ``split``'s bank holds: the
    sum over its categories of ``8!/(8-n)!`` (held-out, 4 words: 6 x 1,680 = 10,080).

    Raises:
        ValueError: ``n`` not in [2, 8], or a bad ``split``.
    """
    _check_num_options(n)
    return sum(math.perm(len(ws), n) for ws in categories(split).values())


def unique_rows(make, n: int, seed: int, pool: int) -> list[dict]:  # noqa: ANN001 - make: (Random) -> row
    """``n`` distinct rows from ``make(rng)`` with ``rng = random.Random(seed)``; ``pool``: how many
    distinct rows ``make`` can give at all.

    Raises:
        ValueError: ``n`` > ``pool`` (at once: drawing for rows that do not exist never ends in time;
            100,000 of a 10,080 pool ran for minutes), or fewer than ``n`` distinct rows after ``1000·n`` draws.
    """
    if n > pool:
        raise ValueError(f"{n} distinct problems asked, the word banks hold {pool:,}")
    rng, seen, out = random.Random(seed), set(), []
    for _ in range(1000 * n):
        row = make(rng)
        key = repr(sorted(row.items()))
        if key not in seen:
            seen.add(key)
            out.append(row)
            if len(out) == n:
                return out
    raise ValueError(f"the word banks give fewer than {n} distinct problems")


_WORD = re.compile(r"[a-z]+")


def parse_choice(text: str, options: Sequence[str]) -> str | None:
    """The option a completion names: the first of its words (case and punctuation ignored) that is
    one of ``options``; None when it names none ("Dog." -> "dog", "I pick owl" -> "owl")."""
    allowed = set(options)
    return next((w for w in _WORD.findall(text.lower()) if w in allowed), None)


def named_options(text: str, options: Sequence[str]) -> list[str]:
    """Every distinct option a completion names, in the order it first names them (case and
    punctuation ignored): "chef, baker" -> ``["chef", "baker"]``; "chef. Chef!" -> ``["chef"]``."""
    allowed = set(options)
    return list(dict.fromkeys(w for w in _WORD.findall(text.lower()) if w in allowed))


def one_choice(text: str, options: Sequence[str]) -> str | None:
    """The option a completion names when it names exactly one; None when it names none or two or
    more (a reply that lists several items has not chosen one: "chef, baker" -> None)."""
    named = named_options(text, options)
    return named[0] if len(named) == 1 else None


def listing(words: Sequence[str]) -> str:
    """``["cat", "dog", "cow"]`` -> ``"cat, dog, cow"`` (how options appear in a prompt)."""
    return ", ".join(words)


def two_choices(
    who: str,
    joint_action: Sequence[str],
    options: Sequence[str],
    parse=parse_choice,  # noqa: ANN001
) -> tuple[str | None, str | None]:
    """The option each of the two agents names in ``joint_action``, read by ``parse`` (:func:`parse_choice`:
    the first option named; :func:`one_choice`: the option when exactly one is named).

    Raises:
        ValueError: ``joint_action`` does not hold exactly two completions (naming ``who``).
    """
    if len(joint_action) != 2:
        raise ValueError(f"{who}: a joint action has {len(joint_action)} completions, need 2")
    return parse(joint_action[0], options), parse(joint_action[1], options)
