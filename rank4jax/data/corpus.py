"""The built-in story corpus: a seeded, deterministic generator of five-sentence stories.

A small world of characters, places, objects and actions. In every story the fifth sentence
depends on facts stated earlier (who, what, where, which colour, whose), so predicting it needs
the model to integrate across time slices rather than copy the previous sentence.

Story kinds:
- *hide*: someone puts an object in a container at a place, leaves, and later remembers exactly
  where it is (object, colour, container and place come from sentences 1–3);
- *gift*: someone buys an object for a friend, who later thanks them for it (giver, object and
  receiver come from sentences 1–2);
- *weather*: the weather of the morning decides what a character carries at the end;
- *lost*: someone loses an object at a place and goes back there to find it.

The corpus is the project's own code; nothing is downloaded.
"""

from __future__ import annotations

import numpy as np

from rank4jax.data.readers import Story

NAMES = {
    "Anna": "she", "Maya": "she", "Lucy": "she", "Emma": "she", "Nora": "she", "Zoe": "she",
    "Ben": "he", "Sam": "he", "Leo": "he", "Omar": "he", "Tom": "he", "Jack": "he",
}  # fmt: skip
PLACES = ["kitchen", "garden", "library", "park", "school", "market", "beach", "station", "office", "barn"]
OBJECTS = ["key", "book", "ball", "hat", "cup", "lamp", "box", "coin", "map", "shell", "scarf", "clock"]
COLOURS = ["red", "blue", "green", "yellow", "white", "black", "small", "old"]
CONTAINERS = ["drawer", "basket", "bag", "cupboard", "jar", "pocket"]
FILLERS = [
    "{p} talked to a neighbour for a while.",
    "{p} drank some tea and read the news.",
    "The afternoon was quiet and long.",
    "{p} helped a friend carry some chairs.",
    "{p} watched the birds outside.",
    "Later {p} had a short nap.",
]
WEATHER = {
    "rainy": ("it rained all morning", "an umbrella"),
    "sunny": ("the sun was very bright", "sunglasses"),
    "cold": ("the wind was cold and sharp", "a warm coat"),
    "snowy": ("snow covered the streets", "heavy boots"),
}


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _pick(rng: np.random.Generator, items, exclude=()):
    choices = [i for i in items if i not in exclude]
    return choices[int(rng.integers(len(choices)))]


def _hide(rng) -> list[str]:
    name = _pick(rng, list(NAMES))
    p = NAMES[name]
    place, obj, colour, box = _pick(rng, PLACES), _pick(rng, OBJECTS), _pick(rng, COLOURS), _pick(rng, CONTAINERS)
    other = _pick(rng, PLACES, exclude=(place,))
    return [
        f"{name} went to the {place}.",
        f"{_cap(p)} found a {colour} {obj} there.",
        f"{_cap(p)} put the {obj} in the {box}.",
        f"Then {name} walked to the {other}.",
        _pick(
            rng,
            [
                f"{_cap(p)} knew the {colour} {obj} was in the {box} at the {place}.",
                f"{_cap(p)} remembered that the {colour} {obj} was still in the {box}.",
                f"Later {name} went back to the {place} to get the {obj} from the {box}.",
            ],
        ),
    ]


def _gift(rng) -> list[str]:
    giver = _pick(rng, list(NAMES))
    friend = _pick(rng, list(NAMES), exclude=(giver,))
    obj, colour, place = _pick(rng, OBJECTS), _pick(rng, COLOURS), _pick(rng, PLACES)
    return [
        f"{giver} bought a {colour} {obj} at the {place}.",
        f"It was a present for {friend}.",
        _cap(_pick(rng, FILLERS).format(p=NAMES[giver])),
        f"In the evening {giver} visited {friend}.",
        _pick(rng, [f"{friend} thanked {giver} for the {colour} {obj}.", f"{friend} loved the {colour} {obj}."]),
    ]


def _weather(rng) -> list[str]:
    name = _pick(rng, list(NAMES))
    p = NAMES[name]
    kind = _pick(rng, list(WEATHER))
    sky, item = WEATHER[kind]
    place = _pick(rng, PLACES)
    return [
        f"In the morning {sky}.",
        f"{name} had to go to the {place}.",
        _cap(_pick(rng, FILLERS).format(p=p)),
        f"{_cap(p)} got ready to leave.",
        _pick(rng, [f"{_cap(p)} took {item} because it was {kind}.", f"{_cap(p)} did not forget {item}."]),
    ]


def _lost(rng) -> list[str]:
    name = _pick(rng, list(NAMES))
    p = NAMES[name]
    obj, colour, place = _pick(rng, OBJECTS), _pick(rng, COLOURS), _pick(rng, PLACES)
    home = _pick(rng, PLACES, exclude=(place,))
    return [
        f"{name} had a {colour} {obj}.",
        f"{_cap(p)} took it to the {place} one day.",
        f"When {p} came back to the {home} the {obj} was gone.",
        _cap(_pick(rng, FILLERS).format(p=p)),
        _pick(
            rng,
            [
                f"{name} went back to the {place} and found the {colour} {obj}.",
                f"{_cap(p)} found the {colour} {obj} at the {place} the next day.",
            ],
        ),
    ]


STORY_KINDS = {"hide": _hide, "gift": _gift, "weather": _weather, "lost": _lost}


def generate_stories(n_stories: int, seed: int = 0) -> list[Story]:
    """``n_stories`` five-sentence stories, identical for the same ``seed``."""
    rng = np.random.default_rng(seed)
    kinds = list(STORY_KINDS)
    stories = []
    for i in range(n_stories):
        kind = kinds[int(rng.integers(len(kinds)))]
        stories.append(Story(f"builtin-{seed}-{i}", tuple(STORY_KINDS[kind](rng))))
    return stories
