"""``python -m transports_core.conformance URL``: run the conformance suite against the
store at URL and print one line per property, PASS, FAIL or SKIP, with the reason.

Exit status: 0 when nothing failed, 1 when something did, 2 on a usage error (a bad or
unknown URL, bad arguments). The store at URL must be empty; the suite leaves it empty.
Extra arguments after ``--`` go to pytest (``-- -k fencing``, say).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import pytest

from transports_core import known_schemes, redact_url

from ._properties import PROPERTIES

MODULE = "transports_core.conformance._by_url"


class _PropertyReport:
    """A pytest plugin object that files each test's outcome under its property."""

    def __init__(self) -> None:
        self.property_of: dict[str, str] = {}
        self.outcomes: dict[str, list[tuple[str, str]]] = {}
        self.errors: list[str] = []

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            marker = item.get_closest_marker("conformance_property")
            self.property_of[item.nodeid] = str(marker.args[0]) if marker else item.name

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.errors.append(f"cannot collect {report.nodeid}: {report.longreprtext}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        prop = self.property_of.get(report.nodeid, report.nodeid)
        flavour = "async" if "::TestAsync" in report.nodeid else "sync"
        test = f"{report.nodeid.rpartition('::')[2]} [{flavour}]"
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            message = getattr(crash, "message", None) or report.longreprtext
            why = message.strip().splitlines()[0] if message.strip() else "failed"
            if report.when != "call":
                why = f"error in {report.when}: {why}"
            self.outcomes.setdefault(prop, []).append(("FAIL", f"{why} ({test})"))
        elif report.skipped:
            longrepr = report.longrepr
            why = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.outcomes.setdefault(prop, []).append(("SKIP", why.removeprefix("Skipped: ")))
        elif report.when == "call":
            self.outcomes.setdefault(prop, []).append(("PASS", test))

    def lines(self) -> list[str]:
        width = max(map(len, [*PROPERTIES, *self.outcomes]))
        order = [*PROPERTIES, *sorted(set(self.outcomes) - set(PROPERTIES))]
        lines = []
        for prop in order:
            results = self.outcomes.get(prop)
            if not results:
                continue
            failed = [why for status, why in results if status == "FAIL"]
            if failed:
                more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
                lines.append(f"FAIL  {prop:<{width}}  {failed[0]}{more}")
            elif any(status == "PASS" for status, _ in results):
                lines.append(f"PASS  {prop:<{width}}  {PROPERTIES.get(prop, '')}".rstrip())
            else:
                lines.append(f"SKIP  {prop:<{width}}  {results[0][1]}")
        return lines


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m transports_core.conformance",
        description="Run the durable-transports conformance suite against the (empty) "
        "store at URL; print one line per property.",
        epilog="Arguments after -- go to pytest, for example: -- -k fencing",
    )
    parser.add_argument("url", help="transport URL, for example sqlite:///check.db")
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    args = parser.parse_args(argv)
    url: str = args.url
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        parser.error(f"{redact_url(url)!r} is not a transport URL (SCHEME://...)")
    known = known_schemes()
    if scheme not in known:
        parser.error(f"no backend for scheme {scheme!r}; known schemes: {', '.join(known)}")

    report = _PropertyReport()
    pytest_args = [
        "--pyargs",
        MODULE,
        f"--transport-url={url}",
        # Our plugin even when entry-point plugins are switched off; the user's project
        # configuration and conftest files stay out of it; no cache left in the cwd.
        "-p",
        "transports_core.conformance.plugin",
        "-c",
        os.devnull,
        "--rootdir",
        os.getcwd(),
        "--noconftest",
        "-p",
        "no:cacheprovider",
        # `python -m` imported this package before pytest could install its assertion
        # rewriter; every assertion of the suite carries its own message anyway.
        "-W",
        "ignore::pytest.PytestAssertRewriteWarning",
        *([] if args.verbose else ["-p", "no:terminal"]),
        *extra,
    ]
    print(f"conformance of {redact_url(url)}:", flush=True)
    code = pytest.main(pytest_args, plugins=[report])
    for line in report.lines():
        print(line)
    for error in report.errors:
        print(f"ERROR {error}")
    if code == pytest.ExitCode.USAGE_ERROR:
        return 2
    failed = code != pytest.ExitCode.OK or report.errors
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
