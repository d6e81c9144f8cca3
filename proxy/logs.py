"""Log output: text for people (the default), or one JSON object per line for collectors
(``--log-format json``).

A JSON line holds ``time`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``,
``message``, every field the call passed with ``extra=`` (``resource``,
``resourceVersion``, ``objects``, ...) under its own name, and ``exception`` with the
traceback when there is one. Values that are not JSON types are written as their ``str``.

Like ``metrics``, this module imports nothing from the rest of ``proxy``: any layer may use it.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Final

import orjson

FORMATS: Final = ("text", "json")

TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD: Final = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in document:
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        return orjson.dumps(document, default=str).decode()


def configure(*, level: str, log_format: str) -> None:
    """Log to stderr at ``level`` in ``log_format`` (one of :data:`FORMATS`)."""
    if log_format not in FORMATS:
        raise ValueError(f"--log-format is one of {', '.join(FORMATS)}, not {log_format!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
