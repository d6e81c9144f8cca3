"""Label key and value syntax, with apimachinery's validation messages.

``content.IsLabelKey`` / ``content.IsLabelValue`` (apimachinery v0.37): a key is an optional
DNS-1123 subdomain prefix (≤ 253 bytes, lowercase) and ``/``, then a name of ≤ 63 bytes of
``[A-Za-z0-9_.-]`` starting and ending alphanumeric; a value is empty or such a name. Lengths
count UTF-8 bytes, as Go's ``len`` does.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["label_key_errors", "label_value_errors"]

_LABEL_KEY_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_KEY_MSG: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_LABEL_KEY_MAX: Final = 63
_LABEL_VALUE_FMT: Final = f"({_LABEL_KEY_FMT})?"
_LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE_MAX: Final = 63
_DNS1123_LABEL_FMT: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT: Final = f"{_DNS1123_LABEL_FMT}(\\.{_DNS1123_LABEL_FMT})*"
_DNS1123_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character"
)
_DNS1123_SUBDOMAIN_MAX: Final = 253

# Python's ``$`` also matches before a trailing newline; fullmatch is Go's ``^...$``.
_LABEL_KEY_RE: Final = re.compile(_LABEL_KEY_FMT)
_LABEL_VALUE_RE: Final = re.compile(_LABEL_VALUE_FMT)
_DNS1123_SUBDOMAIN_RE: Final = re.compile(_DNS1123_SUBDOMAIN_FMT)


def _regex_error(message: str, regex: str, *examples: str) -> str:
    """``content.RegexError``, including its doubled space before ``or`` between examples."""
    if not examples:
        return f"{message} (regex used for validation is '{regex}')"
    text = message + " (e.g. "
    for index, example in enumerate(examples):
        if index > 0:
            text += " or "
        text += f"'{example}', "
    return text + f"regex used for validation is '{regex}')"


def _byte_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _max_len_error(length: int) -> str:
    return f"must be no more than {length} bytes"


def _dns1123_subdomain_errors(value: str) -> list[str]:
    errors: list[str] = []
    if _byte_len(value) > _DNS1123_SUBDOMAIN_MAX:
        errors.append(_max_len_error(_DNS1123_SUBDOMAIN_MAX))
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        errors.append(_regex_error(_DNS1123_SUBDOMAIN_MSG, _DNS1123_SUBDOMAIN_FMT, "example.com"))
    return errors


def label_key_errors(key: str) -> list[str]:
    """``content.IsLabelKey``: an empty list when valid, else the messages."""
    if _LABEL_KEY_RE.fullmatch(key) and _byte_len(key) <= _LABEL_KEY_MAX:
        return []  # fast path: a plain valid name
    errors: list[str] = []
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend("prefix part " + msg for msg in _dns1123_subdomain_errors(prefix))
    else:
        return [
            "a valid label key "
            + _regex_error(_LABEL_KEY_MSG, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif _byte_len(name) > _LABEL_KEY_MAX:
        errors.append("name part " + _max_len_error(_LABEL_KEY_MAX))
    if not _LABEL_KEY_RE.fullmatch(name):
        errors.append(
            "name part "
            + _regex_error(_LABEL_KEY_MSG, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
        )
    return errors


def label_value_errors(value: str) -> list[str]:
    """``content.IsLabelValue``: an empty list when valid, else the messages."""
    errors: list[str] = []
    if _byte_len(value) > _LABEL_VALUE_MAX:
        errors.append(_max_len_error(_LABEL_VALUE_MAX))
    if not _LABEL_VALUE_RE.fullmatch(value):
        errors.append(
            _regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345")
        )
    return errors
