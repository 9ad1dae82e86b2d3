"""Debian's Chromium, headless, driven by Selenium through chromium-driver: the browser the
dashboard's tests and its screenshots (scripts/dashboard_screenshots.py) open its pages in."""
from __future__ import annotations

from .tools import require, which


def chromium(width: int = 1280, height: int = 1100, console: bool = True):
    """A headless Chromium session (skipped where the tools are missing); console: keep the
    browser's console log for get_log("browser")."""
    require("chromium", "chromedriver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}",
                "--hide-scrollbars"):
        options.add_argument(arg)
    if console:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(which("chromedriver")), options=options)
