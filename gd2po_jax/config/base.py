"""What every section of the run config shares: `ConfigError`, the checks that name a field, and
`_Section`, the conversion between nested mappings (a ConfigDict's ``to_dict()``, a run's
config.json) and the frozen section dataclasses.

May import: gd2po_jax.errors (the base of `ConfigError`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
import typing
from collections.abc import Mapping
from typing import Any, ClassVar

from gd2po_jax.errors import UserError

DTYPES = ("float32", "bfloat16")
"""The dtypes a model may compute in, or its weights be held or exported in."""


class ConfigError(UserError, ValueError):
    """A config value that cannot work; the message starts with the field's dotted name."""


# ----------------------------------------------------------------------------------------------
# Checks shared by the sections. ``field`` is the dotted name without "config.".
# ----------------------------------------------------------------------------------------------


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config.{field}: {message}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """An int or a finite float (NaN and infinities are not numbers a config can use)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _one_of(value: Any, field: str, choices) -> None:
    _require(value in tuple(choices), field, f"{value!r} is not one of {tuple(choices)}")


def _int_at_least(value: Any, field: str, minimum: int = 1) -> None:
    _require(_is_int(value) and value >= minimum, field, f"must be an integer >= {minimum}, got {value!r}")


def _in_range(value: Any, field: str, low: float, high: float) -> None:
    _require(_is_number(value) and low <= value <= high, field, f"must be in [{low}, {high}], got {value!r}")


def _number(value: Any, field: str) -> None:
    _require(_is_number(value), field, f"must be a finite number, got {value!r}")


def _learning_rate(value: Any, field: str) -> None:
    _require(
        _is_number(value) and 0 < value < 1,
        field,
        f"must be a finite number in (0, 1) (an AdamW step size), got {value!r}",
    )


def _flag(value: Any, field: str) -> None:
    _require(isinstance(value, bool), field, f"must be True or False, got {value!r}")


def _text(value: Any, field: str, what: str = "a string") -> None:
    _require(isinstance(value, str), field, f"must be {what}, got {value!r}")


def _literal_or_text(text: str) -> Any:
    """``text`` as the Python literal it spells (``False``, ``2``, ``'a'``, ``[1, 2]``), else itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


# ----------------------------------------------------------------------------------------------
# Conversion between nested mappings and sections.
# ----------------------------------------------------------------------------------------------

_OMIT_IF_NONE = {"omit_if_none": True}
"""Field metadata: the field is left out of `_Section.to_dict` while it is None (data.synthetic's task
fields, whose None means "the task's own default")."""


class _Section:
    """Conversion shared by every section: `from_dict` (checks unknown and missing fields) and
    `to_dict`. ``_path`` is the section's dotted name in the run config."""

    _path: ClassVar[str] = ""
    if typing.TYPE_CHECKING:  # every section is a dataclass (for `dataclasses.fields`)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @classmethod
    def _dotted(cls, name: str) -> str:
        return f"{cls._path}.{name}" if cls._path else name

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], path: str | None = None):
        """The section from its nested mapping (a ConfigDict's ``to_dict()`` or JSON): sub-sections
        (and groups of named sub-sections, ``dict[str, <section>]`` fields) are converted, lists
        become tuples for tuple fields, and absent fields with a default take it. (A run's
        config.json written by an older version is first brought up to date by
        `gd2po_jax.config.versions.upgrade`.)

        Args:
          path: the section's dotted name in errors; default ``_path`` (a named sub-section such
            as ``rewards.reward_models.useful`` passes its own).

        Raises:
          ConfigError: for unknown fields (naming all of them), a missing field without a default,
            or any invalid value.
        """
        prefix = cls._path if path is None else path

        def dotted(name: str) -> str:
            return f"{prefix}.{name}" if prefix else name

        where = f"config.{prefix}" if prefix else "config"
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: must be a group of fields, got {values!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            names = ", ".join(f"config.{dotted(name)}" for name in unknown)
            raise ConfigError(
                f"{names}: unknown field{'s' if len(unknown) > 1 else ''}; {where} has "
                f"{', '.join(fields)} (see configs/default.py)"
            )
        hints = _type_hints(typing.cast(type, cls))  # type[...] is not Hashable to mypy (mypy#11470)
        kwargs = {}
        for name, field in fields.items():
            if name not in values:
                if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                    raise ConfigError(f"config.{dotted(name)} is missing (start from configs/default.py)")
                continue
            value, hint = values[name], hints[name]
            named = _named_sections_hint(hint)
            if isinstance(hint, type) and issubclass(hint, _Section):
                value = hint.from_dict(value)
            elif _optional_section_hint(hint) is not None and value is not None:
                value = typing.cast("type[_Section]", _optional_section_hint(hint)).from_dict(value)
            elif named is not None:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"config.{dotted(name)}: must be a group of named sections, got {value!r}")
                value = {key: named.from_dict(item, f"{dotted(name)}.{key}") for key, item in value.items()}
            elif _is_tuple_hint(hint) and isinstance(value, (list, tuple)):
                value = tuple(value)
            kwargs[name] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain values, as ``ConfigDict.to_dict()`` gives them for the same config (tuples
        stay tuples, ints ints, floats floats; JSON writes tuples as lists)."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.metadata.get("omit_if_none"):
                continue
            if isinstance(value, _Section):
                value = value.to_dict()
            elif _named_sections_hint(_type_hints(typing.cast(type, type(self)))[field.name]) is not None:
                value = {key: section.to_dict() for key, section in value.items()}
            out[field.name] = value
        return out


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _optional_section_hint(hint: Any) -> type[_Section] | None:
    """The section type of a ``<section> | None`` field (``data.safety``), else None."""
    sections = [a for a in typing.get_args(hint) if isinstance(a, type) and issubclass(a, _Section)]
    return sections[0] if len(sections) == 1 and type(None) in typing.get_args(hint) else None


def _named_sections_hint(hint: Any) -> type[_Section] | None:
    """The section type of a ``dict[str, <section>]`` field (a group of named sub-sections, e.g.
    ``rewards.reward_models``), else None."""
    if typing.get_origin(hint) is not dict:
        return None
    _, value_type = typing.get_args(hint)
    return value_type if isinstance(value_type, type) and issubclass(value_type, _Section) else None


def _is_tuple_hint(hint: Any) -> bool:
    """``tuple[...]``, or an optional one (``tuple[...] | None``)."""
    return typing.get_origin(hint) is tuple or any(typing.get_origin(a) is tuple for a in typing.get_args(hint))
