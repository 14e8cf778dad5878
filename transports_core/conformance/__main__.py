"""``python -m transports_core.conformance URL``: run the conformance suite against the
store at URL and print one line per property, PASS, FAIL or SKIP, with the reason.

Exit status: 0 when nothing failed, 1 when something did, 2 on a usage error (a bad or
unknown URL, a store that is not empty, bad arguments). The store at URL must be empty;
the suite leaves it empty, dead letters included, and says so (or what it left). It
writes nothing into the current directory. ``--quick`` runs every property with fewer
rounds. Extra arguments after ``--`` go to pytest (``-- -k fencing``, say).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence

try:
    import pytest
except ImportError as exc:  # the suite runs under pytest: say which extra brings it
    _NEEDS = "the conformance suite needs pytest: pip install 'durable-transports[conformance]'"
    if __name__ == "__main__":
        print(f"error: {_NEEDS}", file=sys.stderr)
        sys.exit(2)
    raise ImportError(_NEEDS) from exc

from transports_core import (
    TransportAdmin,
    TransportError,
    known_schemes,
    open_transport,
    redact_url,
)

from ._properties import PROPERTIES

MODULE = "transports_core.conformance._by_url"
QUICK_MODULE = "transports_core.conformance._by_url_quick"


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
        suite_class = report.nodeid.split("::")[1] if "::" in report.nodeid else ""
        flavour = "async" if "Async" in suite_class else "sync"
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

    def tally(self) -> dict[str, int]:
        """How many properties passed, failed and were skipped."""
        counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
        for line in self.lines():
            counts[line[:4]] += 1
        return counts

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
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every property, with fewer rounds and examples (about a minute on SQLite)",
    )
    args = parser.parse_args(argv)
    url: str = args.url
    scheme, sep, _ = url.partition("://")
    if not sep or not scheme:
        parser.error(f"{redact_url(url)!r} is not a transport URL (SCHEME://...)")
    known = known_schemes()
    if scheme not in known:
        parser.error(f"no backend for scheme {scheme!r}; known schemes: {', '.join(known)}")

    try:
        found = _contents(url)
    except (TransportError, ValueError, TypeError, ImportError, OSError) as exc:
        print(f"{parser.prog}: error: cannot open {redact_url(url)}: {exc}", file=sys.stderr)
        return 2
    if found:
        print(
            f"{parser.prog}: error: the store at {redact_url(url)} is not empty ({found}); "
            "the suite needs an empty store, which it leaves empty",
            file=sys.stderr,
        )
        return 2

    report = _PropertyReport()
    began = time.monotonic()
    print(f"conformance of {redact_url(url)}:", flush=True)
    # pytest's rootdir and temporary files go to a directory of our own, removed at the
    # end: nothing of the run is left in the current directory.
    with tempfile.TemporaryDirectory(prefix="transports-conformance-") as scratch:
        # Hypothesis keeps its files (a charmap cache, say) under the current directory
        # unless told otherwise, even with no example database.
        os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(scratch, "hypothesis"))
        pytest_args = [
            "--pyargs",
            QUICK_MODULE if args.quick else MODULE,
            f"--transport-url={url}",
            # Our plugin even when entry-point plugins are switched off; the user's
            # project configuration and conftest files stay out of it; no cache.
            "-p",
            "transports_core.conformance.plugin",
            "-c",
            os.devnull,
            "--rootdir",
            scratch,
            f"--basetemp={os.path.join(scratch, 'tmp')}",
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
        code = pytest.main(pytest_args, plugins=[report])
    took = time.monotonic() - began
    for line in report.lines():
        print(line)
    for error in report.errors:
        print(f"ERROR {error}")
    if code == pytest.ExitCode.USAGE_ERROR:
        return 2
    left = _contents(url)
    if left:
        print(f"LEFT  the suite left the store not empty: {left}")
    tally = report.tally()
    print(
        f"{sum(tally.values())} properties: {tally['PASS']} passed, {tally['FAIL']} failed, "
        f"{tally['SKIP']} skipped in {took:.1f} s" + (" (quick profile)" if args.quick else "")
    )
    failed = code != pytest.ExitCode.OK or report.errors or left
    return 1 if failed else 0


def _contents(url: str) -> str:
    """What the store at ``url`` holds, in words ('' when empty), read with the admin
    interface; '' as well for a backend without it, whose store cannot be read without
    changing it."""
    with open_transport(url) as transport:
        if not isinstance(transport, TransportAdmin):
            return ""
        stats = transport.stats()
    counts = {
        "ready": stats.ready,
        "in flight": stats.in_flight,
        "parked": stats.parked,
        "dead letters": stats.dead,
    }
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n)


if __name__ == "__main__":
    sys.exit(main())
