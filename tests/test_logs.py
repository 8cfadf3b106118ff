"""Logging: JSON lines parse, structured keys show up, -v filters, odd values never raise."""

from __future__ import annotations

import enum
import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpuclaimctl.logs import (
    JsonFormatter,
    TextFormatter,
    KeyedLogger,
    LogFormat,
    get_logger,
    level_for_verbosity,
    setup_logging,
    verbosity_of_level,
)


class Reason(enum.Enum):
    NO_NODE_FITS = "NoNodeFits"


@pytest.fixture
def logger(request: pytest.FixtureRequest) -> Iterator[logging.Logger]:
    """A private logger outside logging's registry.

    Outside the registry pytest's log capture does not attach to it, and the
    root logger's handlers never see its records.
    """
    log = logging.Logger(f"test.logs.{request.node.name}")
    log.propagate = False
    yield log


def configure(logger: logging.Logger, fmt: str, verbosity: int = 0) -> io.StringIO:
    out = io.StringIO()
    handler = setup_logging(fmt, verbosity, stream=out, logger=logger)
    # logging swallows formatter errors and prints them to stderr; fail
    # loudly instead so a raising formatter cannot pass unnoticed.
    handler.handleError = lambda record: pytest.fail("the formatter raised")  # type: ignore[method-assign]
    return out


def json_lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_each_parse_and_carry_the_structured_keys(logger: logging.Logger) -> None:
    out = configure(logger, "json")
    logger.info("pod placed", extra={"pod": "ns/p", "claim": "ns/c", "node": "n1"})
    logger.warning("pod refused", extra={"pod": "ns/q", "reason": Reason.NO_NODE_FITS})

    first, second = json_lines(out)
    assert first["msg"] == "pod placed"
    assert first["level"] == "info"
    assert (first["pod"], first["claim"], first["node"]) == ("ns/p", "ns/c", "n1")
    assert first["logger"] == logger.name
    assert str(first["ts"]).endswith("Z")
    assert second["level"] == "warning"
    assert second["reason"] == "NoNodeFits"


def test_text_lines_render_keys_as_key_equals_value(logger: logging.Logger) -> None:
    out = configure(logger, "text")
    logger.info("pod placed", extra={"pod": "ns/p", "node": "n1", "gpus": 4, "why": "two words"})

    line = out.getvalue().strip()
    assert " info  " in line
    assert line.endswith('pod placed pod=ns/p node=n1 gpus=4 why="two words"')


def test_keyed_logger_adds_fixed_keys_and_call_keys_win(logger: logging.Logger) -> None:
    out = configure(logger, "json")
    log = KeyedLogger(logger, {"controller": "gpuclaim", "node": "default"})
    log.with_keys(pod="ns/p").info("synced", extra={"node": "n2"})

    (line,) = json_lines(out)
    assert line["controller"] == "gpuclaim"
    assert line["pod"] == "ns/p"
    assert line["node"] == "n2"


def test_keys_named_like_record_attributes_are_renamed_not_refused(
    logger: logging.Logger,
) -> None:
    out = configure(logger, "json")
    log = KeyedLogger(logger)
    log.info("claim created", extra={"name": "c1", "msg": "m", "ts": "t", "level": "l"})

    (line,) = json_lines(out)
    assert line["msg"] == "claim created"
    assert (line["name_"], line["msg_"], line["ts_"], line["level_"]) == ("c1", "m", "t", "l")


@pytest.mark.parametrize(
    ("verbosity", "shown"),
    [
        pytest.param(0, ["info", "warning"], id="v0-info-only"),
        pytest.param(2, ["info", "warning", "v1", "v2"], id="v2-adds-more-detail"),
        pytest.param(4, ["info", "warning", "v1", "v2", "v3", "v4", "debug"], id="v4-debug"),
    ],
)
def test_verbosity_filters_like_klog(
    logger: logging.Logger, verbosity: int, shown: list[str]
) -> None:
    out = configure(logger, "json", verbosity)
    log = KeyedLogger(logger)
    log.info("info")
    log.warning("warning")
    for n in (1, 2, 3, 4, 5):
        log.v(n).info(f"v{n}")
    log.debug("debug")

    assert [line["msg"] for line in json_lines(out)] == shown


def test_verbose_lines_say_their_level(logger: logging.Logger) -> None:
    out = configure(logger, "json", 4)
    log = KeyedLogger(logger)
    log.v(2).info("detail")
    log.v(4).info("debugging")

    detail, debugging = json_lines(out)
    assert (detail["level"], detail["v"]) == ("info", 2)
    assert (debugging["level"], debugging["v"]) == ("debug", 4)


def test_v_enabled_tells_whether_a_message_would_be_written(logger: logging.Logger) -> None:
    configure(logger, "text", 2)
    log = KeyedLogger(logger)
    assert log.v(2).enabled
    assert not log.v(3).enabled


@pytest.mark.parametrize("v", range(0, 20))
def test_verbosity_levels_round_trip_and_never_reach_notset(v: int) -> None:
    level = level_for_verbosity(v)
    assert level >= 1
    if level > 1:
        assert verbosity_of_level(level) == v


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def odd_values() -> dict[str, object]:
    cycle: list[object] = []
    cycle.append(cycle)
    return {
        "obj": Unprintable(),
        "huge": 2**100,
        "surrogate": "bad\udcffbyte",
        "cycle": cycle,
        "nested": {"a": [1, {"b": None}], 3: "int key"},
        "nothing": None,
        "flag": True,
        "empty": "",
        "bytes": b"\x00\xff",
    }


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_odd_values_and_bad_arguments_never_raise(logger: logging.Logger, fmt: str) -> None:
    out = configure(logger, fmt)

    logger.info("odd", extra=odd_values())
    logger.info("args %s %s", "only-one")
    logger.info(Unprintable())

    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    if fmt == "json":
        first, second, third = (json.loads(line) for line in lines)
        assert first["obj"] == "<unprintable Unprintable>"
        assert first["huge"] == str(2**100)
        assert first["nested"] == {"a": [1, {"b": None}], "3": "int key"}
        assert first["flag"] is True
        assert "bad log arguments" in str(second["msg"])
        assert third["msg"] == "<unprintable Unprintable>"
    else:
        assert 'empty="" ' in lines[0]
        assert "nothing=null" in lines[0]
        assert 'obj="<unprintable Unprintable>"' in lines[0]
        assert "bad log arguments" in lines[1]


def test_exceptions_are_kept_with_their_traceback(logger: logging.Logger) -> None:
    out = configure(logger, "json")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("sync failed", extra={"pod": "ns/p"})

    (line,) = json_lines(out)
    assert line["level"] == "error"
    assert "ValueError: boom" in str(line["exc"])
    assert line["pod"] == "ns/p"


def test_setting_up_again_replaces_the_handler(logger: logging.Logger) -> None:
    first = configure(logger, "text")
    second = configure(logger, "json")
    logger.info("once")

    assert first.getvalue() == ""
    assert len(json_lines(second)) == 1
    ours = [h for h in logger.handlers if isinstance(h.formatter, (JsonFormatter, TextFormatter))]
    assert len(ours) == 1


@pytest.mark.parametrize("bad", ["yaml", "", "JSONL"])
def test_unknown_format_is_refused_with_one_line(bad: str) -> None:
    with pytest.raises(ValueError, match="log format must be one of text, json") as err:
        LogFormat.parse(bad)
    assert "\n" not in str(err.value)


def test_negative_verbosity_is_refused() -> None:
    with pytest.raises(ValueError, match="verbosity must be 0 or more"):
        level_for_verbosity(-1)


def test_get_logger_carries_keys(request: pytest.FixtureRequest) -> None:
    log = get_logger(f"test.logs.{request.node.name}", node="n1")
    log.logger.propagate = False
    out = configure(log.logger, "json")
    try:
        log.info("hello")
    finally:
        log.logger.handlers.clear()
    assert json_lines(out)[0]["node"] == "n1"
