"""The explorer where people use it: JupyterLab in headless Chromium, its cells run from the Run menu, the k slider
dragged, the figure and the numbers redrawn by the kernel. Needs Chromium and its driver (Debian's ``chromium`` and
``chromium-driver``, which .ci/run installs) and Selenium (the ``test`` extra); skipped, saying which is missing,
without them. Select it with ``pytest -m browser``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import specbench
from specbench.inputs.capabilities import has
from specbench.report.profiles import PROFILES

pytestmark = pytest.mark.browser

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "explorer.ipynb"
TOKEN = "specbench-browser-test"
WAIT_S = 120  # each wait's limit; the whole test took 30-40 s on 2 cores at load 8-11
RUN_ALL = ".lm-Menu-item[data-command='runmenu:run-all']"
EXPLORER = ".jp-OutputArea .widget-vbox:has(.widget-slider)"
STDERR = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"


def _executable(*names: str) -> str | None:
    return next((path for path in map(shutil.which, names) if path), None)


def _browser() -> tuple[str, str]:
    """Chromium and its driver, or a skip naming what is missing and how to install it."""
    pytest.importorskip("selenium", reason="Selenium is not installed: pip install -e '.[test]'")
    chromium = _executable("chromium", "chromium-browser")
    driver = _executable("chromedriver")
    if chromium is None or driver is None:
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None)
        pytest.skip(f"no {missing} on PATH: install Debian's chromium and chromium-driver (.ci/run does, as root)")
    return chromium, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on this interpreter, in its own Jupyter folders, serving the explorer notebook with the
    quick report's parameters (a miniature of the embedded model); yields its URL."""
    import papermill

    if not has("embedded_model"):
        pytest.skip("the explorer's miniature needs the embedded model's tokenizer (make setup builds it)")
    work = tmp_path / "lab"
    work.mkdir()
    params = {**PROFILES["quick"]["explorer"], "output_dir": str(tmp_path / "report"), "progress": False}
    papermill.execute_notebook(str(NOTEBOOK), str(work / "explorer.ipynb"), parameters=params, prepare_only=True)
    # the notebook's kernel, "specbench", as this interpreter: the user's may be another environment's
    jupyter = tmp_path / "jupyter"
    kernel = jupyter / "path" / "kernels" / "specbench"
    kernel.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (specbench)",
        "language": "python",
    }
    (kernel / "kernel.json").write_text(json.dumps(spec))
    # no toast asking whether to fetch Jupyter's news (it could cover a control)
    notification = jupyter / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True)
    notification.write_text(json.dumps({"fetchNews": "false"}))
    # the kernel imports the specbench this test imports (the kernel starts in the notebook's folder)
    source = str(Path(specbench.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p),
        "JUPYTER_PATH": str(jupyter / "path"),
        "JUPYTER_DATA_DIR": str(jupyter / "data"),
        "JUPYTER_CONFIG_DIR": str(jupyter / "config"),
        "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(jupyter / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(jupyter / "workspaces"),
        "IPYTHONDIR": str(jupyter / "ipython"),
    }
    port = _free_port()
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--allow-root",  # CI runs as root
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={TOKEN}",
            f"--ServerApp.root_dir={work}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ],
        cwd=work,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited ({server.returncode}):\n{(tmp_path / 'lab.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer in {WAIT_S} s:\n{(tmp_path / 'lab.log').read_text()}")
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture
def browser():
    """Headless Chromium driven through Selenium."""
    chromium, driver = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    session = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield session
    finally:
        session.quit()


def _image_bytes(browser, image) -> str:
    """The bytes an <img> shows (a blob: URL), base64-encoded, read in the page."""
    script = """
        const [img, done] = arguments;
        fetch(img.src).then(r => r.arrayBuffer()).then(b => {
            let s = ""; new Uint8Array(b).forEach(x => s += String.fromCharCode(x)); done(btoa(s));
        }).catch(e => done("error: " + e));
    """
    return browser.execute_async_script(script, image)


def test_dragging_the_k_slider_redraws_the_explorer(browser, lab, tmp_path):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def errors() -> list[str]:
        """The notebook's error outputs, each its last line (JupyterLab shows a traceback as stderr)."""
        texts = [e.get_attribute("textContent") or "" for e in browser.find_elements(By.CSS_SELECTOR, STDERR)]
        return [t.strip().splitlines()[-1] for t in texts if "Traceback (most recent call last)" in t]

    def until(condition, what: str):
        """``condition``'s first true value within ``WAIT_S``; else a failure naming what did not happen, with the
        page's error outputs and a screenshot."""
        try:
            return WebDriverWait(browser, WAIT_S, poll_frequency=0.2).until(condition)
        except TimeoutException:
            browser.save_screenshot(str(tmp_path / "page.png"))
            pytest.fail(f"{what} within {WAIT_S} s; errors: {errors()}; screenshot: {tmp_path / 'page.png'}")

    def idle(b):
        return b.find_elements(By.CSS_SELECTOR, ".jp-Notebook-ExecutionIndicator[data-status='idle']")

    k = PROFILES["quick"]["explorer"]["k"]
    browser.set_script_timeout(WAIT_S)
    browser.get(f"{lab}/lab/tree/explorer.ipynb?token={TOKEN}")
    until(
        lambda b: "Python (specbench)" in b.find_element(By.CSS_SELECTOR, ".jp-KernelName").text, "no specbench kernel"
    )
    until(idle, "the kernel was not idle")
    # Run > Run All Cells
    menus = browser.find_elements(By.CSS_SELECTOR, "#jp-MainMenu .lm-MenuBar-item")
    next(m for m in menus if m.text.strip() == "Run").click()
    until(lambda b: b.find_element(By.CSS_SELECTOR, RUN_ALL), "no Run All Cells in the Run menu").click()

    # the explorer's controls and figure, drawn by the kernel for the notebook's k (found anew on each look: the
    # widgets re-render their content)
    explorer = until(lambda b: b.find_element(By.CSS_SELECTOR, EXPLORER), "the explorer's widgets did not render")

    def look(selector: str):
        return explorer.find_element(By.CSS_SELECTOR, selector)

    def k_shown() -> str:
        return look(".widget-slider .widget-readout").text.strip()

    def png() -> str:
        return _image_bytes(browser, look("img.widget-image"))

    assert k_shown() == str(k)
    until(lambda _: f"fixed:{k}" in look(".widget-html table").text, f"the numbers of fixed:{k} were not shown")
    drawn = until(lambda _: (shown := png()).startswith("iVBOR") and shown, "no figure was drawn")  # a PNG's start

    # drag the slider's handle to the right: a larger k, replayed and redrawn by the kernel
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", explorer)
    ActionChains(browser).drag_and_drop_by_offset(look(".widget-slider .noUi-handle"), 40, 0).perform()
    until(lambda _: k_shown() != str(k), "the slider did not move")
    moved = int(k_shown())
    assert moved > k
    until(lambda _: f"fixed:{moved}" in look(".widget-html table").text, f"the numbers of fixed:{moved} were not shown")
    until(lambda _: png() not in ("", drawn), "the figure was not redrawn")
    assert png().startswith("iVBOR")
    # and the notebook ran to its end without an error
    until(idle, "the kernel did not finish")
    assert not errors()
