"""Jinja filters that turn free text into safe literals for the rendered files."""

import json

from jinja2.ext import Extension


def toml_string(value: object) -> str:
    """A TOML basic string: JSON's escapes are TOML's, once DEL is escaped too."""
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def py_string(value: object) -> str:
    """A Python string literal in the quotes ruff format keeps.

    Double quotes, unless the text holds more double than single quotes.
    """
    text = str(value)
    body = json.dumps(text, ensure_ascii=False)[1:-1]
    if text.count('"') <= text.count("'"):
        return f'"{body}"'
    return "'" + body.replace('\\"', '"').replace("'", "\\'") + "'"


class LiteralExtension(Extension):
    """Registers the `toml_string` and `py_string` filters."""

    def __init__(self, environment):
        super().__init__(environment)
        environment.filters["toml_string"] = toml_string
        environment.filters["py_string"] = py_string
