"""Logging for farmd: readable lines for people, or one JSON object per line for pipelines.

Structured fields go in ``extra=`` (``log.info("...", extra={"job": 7})``) and come
out as keys of the JSON object; the text format shows the message only.

Messages quote what attempts, endpoints and clients said (job errors, reasons, names).
The text format is read on a terminal, so it shows control and invisible characters as
escapes and keeps each record to its line: a newline in a message is shown, not obeyed,
and a traceback's lines are indented under their record, so nothing a message holds can
pass for a record of its own. JSON escapes all of this by itself.
"""

from __future__ import annotations

import json
import logging
import time

from farmd.text import for_terminal

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        # format() has just set record.message from msg % args, and sets it afresh on every call.
        record.message = for_terminal(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("  " + for_terminal(line) for line in text.split("\n"))


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
