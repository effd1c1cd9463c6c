"""A model validator's error that knows which key it is about.

A ``mode="before"`` model validator sees the whole section, so pydantic files its error under
the section (``alerts.sinks.0.webhook``, the union's tag for a key) with no value. Raising
:class:`KeyedValueError` instead lets the config loader name the key, show the value as the validator
allows (a secret never), and give the fix apart from the problem, as for every other error.
"""

from __future__ import annotations


class KeyedValueError(ValueError):
    """A section's value error about one of its keys.

    Attributes:
        key: the key inside the section (``url``).
        problem: what is wrong, without the fix.
        fix: what to write instead.
        shown: what to show as the value (``***`` for a secret).
    """

    def __init__(self, key: str, problem: str, fix: str, shown: str = "***") -> None:
        super().__init__(f"`{key}:` {problem}; {fix}")
        self.key = key
        self.problem = problem
        self.fix = fix
        self.shown = shown
