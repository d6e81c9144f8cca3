"""--log-format json: one JSON object per line, extra fields included."""

from __future__ import annotations

import io
import json
import logging

import pytest

from proxy import logs


@pytest.fixture
def captured() -> logging.Logger:
    logger = logging.getLogger("warmwatch.test-logs")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger


def lines(logger: logging.Logger, formatter: logging.Formatter) -> io.StringIO:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    return out


def test_json_lines_parse_with_their_extra_fields(captured: logging.Logger) -> None:
    out = lines(captured, logs.JsonFormatter())
    captured.info(
        "%s: listed at RV %s",
        "v1/configmaps",
        "42",
        extra={"resource": "v1/configmaps", "resourceVersion": "42"},
    )
    captured.warning('quotes " and\nnewlines', extra={"objects": 3, "odd": object()})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        captured.exception("failed")
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(records) == 3  # one object per line, a message's newline escaped
    first = records[0]
    assert first["message"] == "v1/configmaps: listed at RV 42"
    assert first["level"] == "INFO" and first["logger"] == "warmwatch.test-logs"
    assert first["resource"] == "v1/configmaps" and first["resourceVersion"] == "42"
    assert first["time"].endswith("+00:00") and "T" in first["time"]
    assert records[1]["message"] == 'quotes " and\nnewlines' and records[1]["objects"] == 3
    assert records[1]["odd"].startswith("<object object")
    assert "RuntimeError: boom" in records[2]["exception"]
    assert "args" not in first and "msg" not in first  # the record's own attributes stay out


def test_configure_picks_the_format() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure(level="debug", log_format="json")
        assert isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        assert root.level == logging.DEBUG
        logs.configure(level="INFO", log_format="text")
        assert not isinstance(root.handlers[0].formatter, logs.JsonFormatter)
        with pytest.raises(ValueError, match="log-format"):
            logs.configure(level="INFO", log_format="xml")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
