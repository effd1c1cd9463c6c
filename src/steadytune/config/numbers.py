"""Numbers that YAML did not mean: ``max_steps: yes`` is ``True`` to YAML 1.1, and pydantic, lax,
takes ``True`` as the integer 1 (``save_steps`` then failed against a one-step run, blamed for
what ``max_steps`` did). A field declared as a number refuses a boolean, naming it; a field that
also allows a boolean takes it as one."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator


def _numeric_only(annotation: Any) -> bool:
    """True for ``int``, ``float``, ``int | None``, ...: a number is wanted and a bool is not."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
    else:
        options = (annotation,)
    return bool not in options and any(o in (int, float) for o in options)


class NoBoolNumbers(BaseModel):
    """Base of the config sections: a boolean where a number is wanted is an error."""

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_bool(cls, value: Any, info: ValidationInfo) -> Any:
        if type(value) is bool and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric_only(field.annotation):
                said = "yes/true/on" if value else "no/false/off"
                raise ValueError(
                    f"{value!r} is a boolean (YAML reads {said} as one), not a number; write the number"
                )
        return value
