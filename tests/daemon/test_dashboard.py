"""The live page, in a real headless Chromium (Debian's chromium and chromedriver, driven by
selenium): the runs table, filters, a run page with its loss curve and log tail, and hostile text
from a status message and a log line showing as text. Screenshots are taken every time; with
UPDATE_SCREENSHOTS=1 they replace the ones under docs/images/ that the docs show."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from reconciler.daemon import dashboard, httpd
from reconciler.core.runstatus import Condition, Handle, RunStatus, Transition
from reconciler.status.store import dump

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def _chromium():
    chrome, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver  # noqa: F401
    except ImportError:
        chrome = None
    if not chrome or not driver:
        reason = "headless browser tests need Debian's chromium and chromium-driver and selenium: run .ci/run"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return chrome, driver


def screenshot(browser, tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    assert browser.save_screenshot(str(out)) and out.stat().st_size > 10_000  # a page, not a blank
    if os.environ.get("UPDATE_SCREENSHOTS"):
        shutil.copyfile(out, DOCS_IMAGES / name)


def write(status_dir: Path, st: RunStatus) -> None:
    (status_dir / f"{st.name}.yaml").write_text(dump(st))


class Site(str):
    """The page's address, and the workspace of its running local run."""

    def __new__(cls, url: str, ws: Path):
        obj = super().__new__(cls, url)
        obj.ws = ws
        return obj


@pytest.fixture
def site(tmp_path):
    repo, state = tmp_path / "repo", tmp_path / "state"
    (repo / "status").mkdir(parents=True)
    ws = tmp_path / "ws" / "sft-llama-g1-a2"
    (ws / "artifacts").mkdir(parents=True)
    (ws / "artifacts" / "stdout.log").write_text("".join(f"step {i} loss {3 / i:.3f}\n" for i in range(1, 40))
                                                 + f"evil line {XSS}\n")
    t = "2026-11-23T10:0{}:00Z"
    write(repo / "status", RunStatus(
        name="sft-llama", phase="Running", generation=1, attempt=2, message="resumed from checkpoint-200",
        handle=Handle(machine="local", identity="sft-llama-g1-a2", workspace=str(ws), gpus=[0, 1]),
        progress={"step": 390, "max_steps": 1000, "loss": 0.84},
        loss_curve=[(i * 10, round(3.2 / (1 + i * 0.1), 4)) for i in range(1, 40)],
        conditions=[Condition(type="Ready", status="True", reason="Running", last_transition=t.format(1))],
        history=[Transition(time=t.format(0), phase="Running", generation=1, attempt=1, reason="new run"),
                 Transition(time=t.format(1), phase="Running", generation=1, attempt=2, reason="resumed")]))
    write(repo / "status", RunStatus(
        name="dpo-eval", phase="Failed", generation=1, attempt=1, message=f"exit 1: {XSS}",
        handle=Handle(machine="lab-1", identity="dpo-eval-g1-a1"),
        history=[Transition(time=t.format(2), phase="Failed", generation=1, attempt=1, reason="exit 1")]))
    write(repo / "status", RunStatus(
        name="hello", phase="Succeeded", generation=1, attempt=1, message="hello-g1-a1 succeeded (exit 0)",
        handle=Handle(machine="local", identity="hello-g1-a1"),
        history=[Transition(time=t.format(3), phase="Succeeded", generation=1, attempt=1, reason="exit 0")]))
    server = dashboard.make_server("127.0.0.1:0", dashboard.Views(repo, state, [tmp_path / "ws"]))
    httpd.serve_in_thread(server)
    host, port = server.server_address[:2]
    yield Site(f"http://{host}:{port}", ws)
    server.shutdown()
    server.server_close()


@pytest.fixture
def browser():
    chrome, driver_path = _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    profile = tempfile.mkdtemp(prefix="rc-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1200,900"):
        opts.add_argument(flag)
    d = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    d.set_page_load_timeout(20)
    yield d
    d.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_runs_table_and_filters(site, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(site + "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tr")[1:]
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == ["hello", "dpo-eval", "sft-llama"]
    assert "390/1000" in rows[2].text
    # Hostile text in a status message is shown as text, never run.
    assert browser.execute_script("return window.__xss") is None
    assert "<script>window.__xss = 1</script>" in rows[1].text
    screenshot(browser, tmp_path, "dashboard-runs.png")
    browser.get(site + "/?phase=Running")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text
            for r in browser.find_elements(By.CSS_SELECTOR, "#runs tr")[1:]] == ["sft-llama"]
    browser.get(site + "/?q=eval&machine=lab-1")
    assert "Runs (1 of 3)" in browser.find_element(By.TAG_NAME, "h1").text


def test_run_page_has_its_curve_history_and_a_following_log_tail(site, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(site + "/runs/sft-llama")
    assert browser.find_elements(By.CSS_SELECTOR, "#curve svg polyline")
    log = browser.find_element(By.ID, "log").text
    assert "step 39 loss" in log and "evil line <script>window.__xss = 1</script>" in log
    assert browser.execute_script("return window.__xss") is None
    assert "resumed" in browser.page_source
    screenshot(browser, tmp_path, "dashboard-run.png")
    # The tail follows: a new line appears without a reload.
    ws = site.ws
    with open(ws / "artifacts" / "stdout.log", "a") as fh:
        fh.write(f"a new line {XSS}\n")
    WebDriverWait(browser, 10).until(lambda d: "a new line" in d.find_element(By.ID, "log").text)
    assert browser.execute_script("return window.__xss") is None


def test_read_only_and_unknown_pages(site):
    req = urllib.request.Request(site + "/runs/hello", method="POST", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    for path in ("/runs/nope", "/runs/..%2Fetc", "/runs/NOT_A_NAME/log", "/etc/passwd"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(site + path, timeout=10)
        assert e.value.code == 404, path
    resp = urllib.request.urlopen(site + "/runs/dpo-eval/log", timeout=10)
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert resp.read().decode() == "(no log yet)"  # ended on lab-1, not collected yet
    page = urllib.request.urlopen(site + "/machines", timeout=10).read().decode()
    assert "lab-1" in page and "<script>window.__xss" not in page


AUDIT = "".join(
    '{"ts": %d, "event": "sample", "devices": [{"index": 0, "util_gpu_pct": %d, "mem_used_mib": %d, '
    '"mem_total_mib": 81559}, {"index": 1, "util_gpu_pct": %d, "mem_used_mib": 40000, "mem_total_mib": 81559}]}\n'
    % (1764000000 + i, 50 + (i * 7) % 50, 20000 + 300 * i, 90 - (i % 10)) for i in range(120)) + "not json\n"


def test_the_page_follows_phase_and_loss_without_a_reload_and_draws_the_gpus(site, browser, tmp_path):
    """A recorded NVML audit (two GPUs, two minutes) is drawn as two charts; a new loss point and a
    phase change written to the status file appear on the open page by themselves."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    (site.ws / "artifacts" / "nvml-audit.jsonl").write_text(AUDIT)
    status_dir = Path(site.ws).parents[1] / "repo" / "status"
    browser.get(site + "/runs/sft-llama")
    charts = browser.find_elements(By.CSS_SELECTOR, "#gpu svg")
    assert len(charts) == 2 and len(browser.find_elements(By.CSS_SELECTOR, "#gpu svg polyline")) == 4
    before = browser.find_element(By.CSS_SELECTOR, "#curve svg polyline").get_attribute("points")
    screenshot(browser, tmp_path, "dashboard-gpus.png")
    st = RunStatus(name="sft-llama", phase="Succeeded", generation=1, attempt=2, message="done",
                   handle=Handle(machine="local", identity="sft-llama-g1-a2", workspace=str(site.ws)),
                   loss_curve=[(i * 10, round(3.2 / (1 + i * 0.1), 4)) for i in range(1, 41)] + [(420, 0.1)])
    write(status_dir, st)
    # The page swaps its live parts under the test: an element found may be replaced before it is read.
    live = WebDriverWait(browser, 15, ignored_exceptions=[StaleElementReferenceException])
    live.until(lambda d: "Succeeded" in d.find_element(By.ID, "facts").text)
    live.until(lambda d: d.find_element(By.CSS_SELECTOR, "#curve svg polyline").get_attribute("points") != before)
    assert browser.execute_script("return window.__xss") is None


def test_the_runs_list_shows_cost_and_follows_a_new_run(site, browser):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    status_dir = Path(site.ws).parents[1] / "repo" / "status"
    browser.get(site + "/")
    assert "cost" in browser.find_element(By.CSS_SELECTOR, "#runs tr").text
    write(status_dir, RunStatus(name="rented", phase="Running", generation=1, attempt=1,
                                handle=Handle(machine="local/r-1", identity="rented-g1-a1"),
                                cost={"provider": "local", "price_per_hour": 3.6, "so_far": 1.25}))
    live = WebDriverWait(browser, 15, ignored_exceptions=[StaleElementReferenceException])
    live.until(lambda d: "rented" in d.find_element(By.ID, "runs").text)
    live.until(lambda d: any(r.text.startswith("rented") and "1.25" in r.text
                             for r in d.find_elements(By.CSS_SELECTOR, "#runs tr")))
    live.until(lambda d: "Runs (4 of 4)" in d.find_element(By.TAG_NAME, "h1").text)
