"""Did-you-mean hints for names a user typed (methods, backends, options)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name ``name`` was most likely meant to be: same letters in another case first, then difflib's."""
    choices = sorted(set(known))
    folded = [k for k in choices if k.lower() == name.lower() and k != name]
    if folded:
        return folded[0]
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'score'?)"``, with a word on case when only the case differs; ``""`` when nothing is near."""
    match = nearest(name, known)
    if match is None:
        return ""
    if match.lower() == name.lower():
        return f" (did you mean {match!r}? names are case-sensitive)"
    return f" (did you mean {match!r}?)"
