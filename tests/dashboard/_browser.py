"""Debian's headless Chromium, driven by Selenium through Debian's chromedriver.

Both are named by path, so Selenium downloads nothing. Where they are not installed the
browser tests skip with the command that installs them, except under ``CI=true``, where
that fails the run (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get install -y chromium chromium-driver"


def start_browser() -> webdriver.Chrome:
    """A new headless Chromium with a fixed window, for pages and screenshots alike."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        why = f"the browser tests need {' and '.join(missing)}: {INSTALL}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # tests run as root, where Chromium's sandbox refuses to start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--force-device-scale-factor=1",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
