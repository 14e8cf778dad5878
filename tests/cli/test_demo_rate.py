"""The demo's live progress bar and its verdict give one rate: the last frame of the bar
shows the figure the verdict prints (events acked from the first claim on)."""

from __future__ import annotations

import re

import pytest

from ._command import transports_on_a_terminal


@pytest.mark.slow
def test_the_last_frame_of_the_bar_shows_the_verdicts_rate() -> None:
    code, shown = transports_on_a_terminal("demo", "--quick", "--executions", "30")
    assert code == 0, shown
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown)
    frames = re.findall(r"\d+/240 ([\d,]+) events/s", plain)
    assert frames, plain
    verdict = re.search(r"^OK: 240 events .*\(2 workers, ([\d,]+) events/s\)", plain, re.M)
    assert verdict is not None, plain
    summary = re.search(r"^240 acks in .* \(([\d,]+) events/s\)", plain, re.M)
    assert summary is not None, plain
    assert frames[-1] == verdict[1] == summary[1]
