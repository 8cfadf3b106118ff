"""Logging for gpuclaimctl: text or JSON lines, klog verbosity, structured keys.

Structured keys travel the standard way, ``log.info("placed", extra={"pod":
"ns/p", "node": "n1"})``; the text format renders them as ``key=value``
after the message and the JSON format as fields of the line's object.
``KeyedLogger`` adds fixed keys to every record and offers klog's ``V(n)``.

Verbosity follows klog's ``-v``: 0 is the default (info and above), 2 adds
the "more detail" messages, 4 is debug; 6 adds the HTTP requests of the
client libraries and 8 their bodies, as in kubectl. A ``V(n)`` message is
shown exactly when ``n <= v``.

Formatting must never raise: a log call in an error path that throws would
hide the original error. Values that cannot be printed are replaced.

Nothing here touches logging state at import; ``setup_logging`` does, once,
from the CLI.
"""

from __future__ import annotations

import datetime
import enum
import json
import logging
import sys
from typing import Any, Mapping, MutableMapping, TextIO

import orjson

# klog levels that have no stdlib name sit between INFO and DEBUG, so a
# stdlib ``logger.debug`` is hidden until -v=4, like klog's V(4).
_DEBUG_VERBOSITY = 4
# Where the client libraries' own loggers open up, after kubectl's -v=6
# (request URLs) and -v=8 (request and response bodies).
_HTTP_VERBOSITY = {"urllib3": 6, "kubernetes": 8}

# Attributes every LogRecord has; anything else on a record came from
# ``extra`` and is a structured key. ``taskName`` arrived in Python 3.12.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName"}

# Fixed fields of a JSON line; a structured key with one of these names is
# written with a trailing underscore instead of overwriting it.
_JSON_FIELDS = frozenset({"ts", "level", "v", "logger", "msg", "exc", "stack"})

_HANDLER_MARK = "_gpuclaimctl_handler"


class LogFormat(enum.Enum):
    TEXT = "text"
    JSON = "json"

    @classmethod
    def parse(cls, value: str) -> LogFormat:
        try:
            return cls(value.strip().lower())
        except ValueError:
            choices = ", ".join(f.value for f in cls)
            raise ValueError(f"log format must be one of {choices}, not {value!r}") from None


def level_for_verbosity(verbosity: int) -> int:
    """The stdlib level of a ``V(verbosity)`` message, and the threshold of ``-v``.

    0 is INFO; 1-3 lie between INFO and DEBUG; 4 is DEBUG; above 4 each step
    goes one level lower, never reaching 0 (which logging reads as "unset").
    """
    if verbosity < 0:
        raise ValueError(f"verbosity must be 0 or more, not {verbosity}")
    if verbosity == 0:
        return logging.INFO
    if verbosity < _DEBUG_VERBOSITY:
        return logging.INFO - verbosity
    return max(1, logging.DEBUG - (verbosity - _DEBUG_VERBOSITY))


def verbosity_of_level(levelno: int) -> int:
    """The ``V(n)`` a record's level stands for; 0 at INFO and above."""
    if levelno >= logging.INFO:
        return 0
    if levelno >= logging.INFO - (_DEBUG_VERBOSITY - 1):
        return logging.INFO - levelno
    if levelno > logging.DEBUG:  # a foreign level between V(3) and debug
        return _DEBUG_VERBOSITY
    return _DEBUG_VERBOSITY + (logging.DEBUG - levelno)


def _level_name(levelno: int) -> str:
    if levelno >= logging.CRITICAL:
        return "critical"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= logging.INFO - (_DEBUG_VERBOSITY - 1):
        return "info"
    return "debug"


def _safe_str(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        pass
    try:
        return repr(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _clean(text: str) -> str:
    # Lone surrogates (from undecodable bytes) cannot be written as UTF-8.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:
        # An unprintable message, or arguments that do not fit its format
        # string: keep what can be printed, raise nothing.
        text = _safe_str(record.msg)
        if record.args:
            text += f" (bad log arguments: {_safe_str(record.args)})"
        return text


def structured_keys(record: logging.LogRecord) -> dict[str, Any]:
    """The keys a record carries from ``extra``, in the order they were given."""
    return {
        _safe_str(k): v
        for k, v in record.__dict__.items()
        if k not in _RECORD_ATTRIBUTES and not (isinstance(k, str) and k.startswith("_"))
    }


def _timestamp(record: logging.LogRecord) -> str:
    ts = datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


class _BaseFormatter(logging.Formatter):
    def _exception_text(self, record: logging.LogRecord) -> str | None:
        if not record.exc_info:
            return None
        try:
            return self.formatException(record.exc_info)
        except Exception:
            return f"<unformattable exception {_safe_str(record.exc_info[1])}>"


def _text_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (int, float)):
        return _safe_str(value)
    text = _safe_str(value)
    if not text or any(c.isspace() or c in '"=\\' or not c.isprintable() for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class TextFormatter(_BaseFormatter):
    """``2025-01-02T15:04:05.123Z info  logger: message key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _timestamp(record),
            f"{_level_name(record.levelno):<5}",
            f"{_safe_str(record.name)}:",
            _message(record),
        ]
        for key, value in structured_keys(record).items():
            parts.append(f"{key}={_text_value(value)}")
        line = " ".join(parts)
        exc = self._exception_text(record)
        if exc:
            line += "\n" + exc
        if record.stack_info:
            line += "\n" + _safe_str(record.stack_info)
        return _clean(line)


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return _safe_str(value)


def _json_value_ok(value: Any) -> bool:
    try:
        orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS)
        return True
    except Exception:
        return False


class JsonFormatter(_BaseFormatter):
    """One JSON object per line: ts, level, v (when above 0), logger, msg, keys."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": _level_name(record.levelno),
        }
        v = verbosity_of_level(record.levelno)
        if v:
            line["v"] = v
        line["logger"] = _safe_str(record.name)
        line["msg"] = _message(record)
        for key, value in structured_keys(record).items():
            while key in line or key in _JSON_FIELDS:
                key += "_"
            line[key] = value
        exc = self._exception_text(record)
        if exc:
            line["exc"] = exc
        if record.stack_info:
            line["stack"] = _safe_str(record.stack_info)
        try:
            return self._dumps(line)
        except Exception:
            pass
        # Some value orjson refuses (a cycle, an int past 64 bits, a lone
        # surrogate): keep every field that encodes, print the others as text.
        cleaned = {
            k: v if _json_value_ok(v) else _clean(_safe_str(v)) for k, v in line.items()
        }
        try:
            return self._dumps(cleaned)
        except Exception:
            return self._dumps({k: _clean(_safe_str(v)) for k, v in line.items()})

    @staticmethod
    def _dumps(line: Mapping[str, Any]) -> str:
        return orjson.dumps(line, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


def setup_logging(
    fmt: LogFormat | str = LogFormat.TEXT,
    verbosity: int = 0,
    *,
    stream: TextIO | None = None,
    logger: logging.Logger | None = None,
) -> logging.Handler:
    """Send ``logger`` (default: the root logger) to ``stream`` (default stderr).

    Calling it again replaces the handler it installed before, so a CLI can
    reconfigure after parsing flags. Returns the handler.
    """
    if isinstance(fmt, str):
        fmt = LogFormat.parse(fmt)
    level = level_for_verbosity(verbosity)
    target = logger if logger is not None else logging.getLogger()
    for old in list(target.handlers):
        if getattr(old, _HANDLER_MARK, False):
            target.removeHandler(old)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.setFormatter(JsonFormatter() if fmt is LogFormat.JSON else TextFormatter())
    target.addHandler(handler)
    target.setLevel(level)
    if target is logging.getLogger():
        for name, opens_at in _HTTP_VERBOSITY.items():
            logging.getLogger(name).setLevel(
                logging.NOTSET if verbosity >= opens_at else logging.WARNING
            )
    return handler


class _Verbose:
    """What ``KeyedLogger.v(n)`` returns: klog's ``V(n).Info``."""

    __slots__ = ("_log", "_level")

    def __init__(self, log: KeyedLogger, level: int) -> None:
        self._log = log
        self._level = level

    @property
    def enabled(self) -> bool:
        return self._log.isEnabledFor(self._level)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log.log(self._level, msg, *args, **kwargs)


class KeyedLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger that puts fixed keys on every record and merges per-call ``extra``.

    Keys that would clash with a LogRecord attribute (``name``, ``msg``,
    ``module``...) get a trailing underscore instead of making logging raise.
    """

    def __init__(self, logger: logging.Logger, keys: Mapping[str, object] | None = None) -> None:
        super().__init__(logger, dict(keys or {}))

    def with_keys(self, **keys: object) -> KeyedLogger:
        merged: dict[str, object] = dict(self.extra or {})
        merged.update(keys)
        return KeyedLogger(self.logger, merged)

    def v(self, verbosity: int) -> _Verbose:
        return _Verbose(self, level_for_verbosity(verbosity))

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        merged: dict[str, object] = dict(self.extra or {})
        call_extra = kwargs.get("extra")
        if isinstance(call_extra, Mapping):
            merged.update(call_extra)
        kwargs["extra"] = safe_extra(merged)
        return msg, kwargs


def safe_extra(keys: Mapping[Any, object]) -> dict[str, object]:
    """``keys`` with names that logging would refuse renamed (``name`` -> ``name_``)."""
    out: dict[str, object] = {}
    for key, value in keys.items():
        name = _safe_str(key)
        while name in _RECORD_ATTRIBUTES or name in out:
            name += "_"
        out[name] = value
    return out


def get_logger(name: str, **keys: object) -> KeyedLogger:
    """``logging.getLogger(name)`` with fixed structured keys."""
    return KeyedLogger(logging.getLogger(name), keys)
