"""Runtime options: the registry lives in C++; this is its Python face."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from . import _C


@dataclass(frozen=True)
class Option:
    """One runtime option: its effective value, where that came from, and how to set it."""

    name: str
    type: str
    value: bool | int | str
    source: str
    default: bool | int | str
    env: str
    doc: str
    choices: tuple[str, ...] = ()

    @property
    def accepted(self) -> str:
        """What the option accepts, in words."""
        if self.type == "bool":
            return "0, 1, true, false"
        if self.type == "enum":
            return ", ".join(self.choices)
        if self.type == "int":
            return "integer"
        return self.type


def _typed(kind: str, text: str) -> bool | int | str:
    if kind == "bool":
        return text == "1"
    if kind == "int":
        return int(text)
    return text


def _from_raw(raw: dict) -> Option:
    kind = raw["type"]
    return Option(
        name=raw["name"],
        type=kind,
        value=_typed(kind, raw["value"]),
        source=raw["source"],
        default=_typed(kind, raw["default"]),
        env=raw["env"],
        doc=raw["doc"],
        choices=tuple(raw["choices"]),
    )


class RuntimeOptions(Mapping[str, Option]):
    """A snapshot of every runtime option, keyed by short name (``"log_level"``).

    Printing it shows a table; ``opts["log_level"].value`` is the effective value and
    ``.source`` says whether it is the default, came from the environment, or was set by the API.
    The environment variable name works as a key too.
    """

    def __init__(self, items: list[Option]) -> None:
        self._items = {o.name: o for o in items}
        self._by_env = {o.env: o for o in items}

    def __getitem__(self, key: str) -> Option:
        if key in self._items:
            return self._items[key]
        if key in self._by_env:
            return self._by_env[key]
        raise KeyError(f"no runtime option {key!r}; known: {', '.join(self._items)}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def table(self) -> str:
        """A plain-text table: option, environment variable, value, source."""
        rows = [("option", "environment variable", "value", "source")]
        for o in self._items.values():
            rows.append((o.name, o.env, _show(o.value), o.source))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def markdown(self) -> str:
        """The README's options table (defaults, not the effective values)."""
        lines = [
            "| Environment variable | Type | Default | Accepted | Description |",
            "|---|---|---|---|---|",
        ]
        for o in self._items.values():
            default = _show(o.default) if o.default != "" else "(empty)"
            lines.append(f"| `{o.env}` | {o.type} | `{default}` | {o.accepted} | {o.doc} |")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"RuntimeOptions(\n{self.table()}\n)"


def _show(value: bool | int | str) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def options() -> RuntimeOptions:
    """The effective runtime options, each with its source (default, env or api)."""
    return RuntimeOptions([_from_raw(r) for r in _C.options_list()])


def set_option(name: str, value: bool | int | str) -> None:
    """Set a runtime option from code; validated like its environment variable.

    Raises OptionError naming the option, the value and what is accepted.
    """
    if isinstance(value, bool):
        text = "1" if value else "0"
    else:
        text = str(value)
    _C.set_option(name, text)


def reload_options() -> None:
    """Forget settings made by set_option and read every option from the environment again."""
    _C.reload_options()
