"""The web console in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
which ``make test`` installs) driven by selenium against a real farmd with boxes, a published policy and a
submission in review. Each page's screenshot is written to build/screenshots/console/ (or
$FARM_SCREENSHOTS) for people to look at.

One farm and one browser serve the module: starting them is most of what these tests cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from farm_client import FarmClient, tinylm

from tests.conftest import RunningFarm
from tests.intake.contrib_example import EXAMPLE

pytestmark = [pytest.mark.sandbox]

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium comes with the dev extra (make setup)")
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TOKENS = {"op": ("op-token", "operator"), "tess": ("trainer-token", "trainer"), "rita": ("rita-token", "reviewer"),
          "ada": ("ada-token", "contributor")}
SHOTS = Path(os.environ.get("FARM_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "build" / "screenshots"
             / "console")
AGENT = "torch:tiny?max_tokens=6"
NOTE = 'tasks vary; <img src=x onerror="document.body.dataset.pwned=1"> the verifier counts exactly'
"""A reviewer's note is text anyone may write: the page must show it, not run it."""
_WAIT_S = 30


def chromium() -> tuple[str, str]:
    """Debian's Chromium and its driver; a clear failure when this host lacks them (``make test`` installs them)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.fail("the console's tests need Chromium and chromedriver: `make test` installs them as root "
                    "(apt-get install chromium chromium-driver)")
    return browser, driver


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFarm]:
    root = tmp_path_factory.mktemp("console")
    config = root / "farm.toml"
    config.write_text('[intake]\nseeds = [2, 2, 2]\nattack_budget = [2, 2, 2]\ntier2_tasks = 1\n' + "".join(
        f'\n[[credentials]]\nname = "{who}"\nroles = ["{role}"]\n'
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n' for who, (token, role) in TOKENS.items()))
    farm = RunningFarm(root / "data", "--workers", "2", "--http", "127.0.0.1:0", "--config", str(config))
    try:
        with FarmClient(farm.addr, token=TOKENS["op"][0]) as client:
            client.publish_policy(tinylm.save(tinylm.TinyLM(tinylm.LMConfig()).eval()), name="tiny")
        for agent, rollouts in ((AGENT, "8"), ("reference", "4")):
            farm.farmctl("--token", TOKENS["op"][0], "run", "--env", "arith", "--agent", agent, "--rollouts", rollouts,
                         "--group-size", "4", "--wait")
        farm.farmctl("--token", TOKENS["op"][0], "bounty", "post", "--domain", "text", "--requirements",
                     "counting tasks", "--payout", "50-100", "--wanted", "2")
        farm.farmctl("--token", TOKENS["ada"][0], "submit", str(EXAMPLE), "--wait", "--json")
        yield farm
    finally:
        farm.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    binary, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1100", "--lang=en-US"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    driver.set_page_load_timeout(_WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def console(farm: RunningFarm) -> str:
    return str(json.loads((farm.data_dir / "farmd.json").read_text())["console"])


def open_page(browser: Any, farm: RunningFarm, route: str, who: str | None) -> None:
    """The console at ``route`` as ``who`` (None: no token), its token entered in the page's own token box."""
    browser.get(f"http://{console(farm)}/#/farm-blank")
    browser.execute_script("window.sessionStorage.clear()")
    if who is not None:
        box = browser.find_element(By.ID, "token")
        box.clear()
        box.send_keys(TOKENS[who][0])
        browser.find_element(By.ID, "token-save").click()
    browser.get(f"http://{console(farm)}/#/{route}")
    browser.refresh()


def loaded(browser: Any, page: str) -> Any:
    """The page's root once its first load succeeded (``data-loaded``); the error banner's text if it failed."""
    def ready(driver: Any) -> Any:
        root = driver.find_elements(By.ID, f"page-{page}")
        if root and root[0].get_attribute("data-loaded") == "true":
            return root[0]
        return False
    try:
        return WebDriverWait(browser, _WAIT_S, ignored_exceptions=(StaleElementReferenceException,)).until(ready)
    except TimeoutException:
        raise AssertionError(f"page {page} did not load: {banner(browser)!r}") from None


def banner(browser: Any) -> str:
    found = browser.find_elements(By.ID, "error")
    return str(found[0].text) if found and found[0].is_displayed() else ""


def wait_for(browser: Any, check: Callable[[Any], Any], what: str) -> Any:
    """Until ``check`` holds; an element the page re-rendered meanwhile is looked for again."""
    try:
        return WebDriverWait(browser, _WAIT_S, ignored_exceptions=(StaleElementReferenceException,)).until(check)
    except TimeoutException:
        raise AssertionError(f"{what}: never happened ({banner(browser)!r})") from None


def shoot(browser: Any, name: str) -> None:
    """The whole page, not the window's worth of it: the window is made as tall as the page for the shot."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = int(browser.execute_script("return document.documentElement.scrollHeight"))
    width = browser.get_window_size()["width"]
    browser.set_window_size(width, min(max(height + 140, 800), 6000))
    try:
        browser.save_screenshot(str(SHOTS / f"{name}.png"))
    finally:
        browser.set_window_size(width, 1100)


def no_page_errors(browser: Any) -> None:
    """Nothing the page ran failed, and the page broke none of its own rules (a CSP violation is logged)."""
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]
              and "the server responded with a status of 40" not in e["message"]]
    assert not severe, severe


def state_shown(browser: Any) -> str:
    """The submission's state as the page shows it, in farmctl's words (``in_review``)."""
    shown = str(browser.find_element(By.ID, "submission-state").text).strip().lower()
    return shown.removeprefix("submission_state_").replace(" ", "_")


def value(browser: Any, element_id: str) -> str:
    return str(browser.find_element(By.ID, element_id).get_attribute("data-value"))


def test_the_farm_page_shows_what_farmctl_status_shows(farm: RunningFarm, browser: Any) -> None:
    open_page(browser, farm, "farm", "op")
    loaded(browser, "farm")
    status = json.loads(farm.farmctl("--token", TOKENS["op"][0], "status", "--json").stdout)
    assert int(value(browser, "stat-last-seq")) == status["last_seq"] == 12
    assert int(value(browser, "stat-policy-version")) == status["policy_version"] >= 1
    for tile, key in (("stat-done", "done"), ("stat-queued", "queued"), ("stat-failed", "failed")):
        assert int(value(browser, tile)) == status["queue"][key], tile
    assert int(value(browser, "stat-workers")) == status["workers"] == 2
    assert value(browser, "stat-node") == status["node"]
    assert int(value(browser, "stat-policy-bytes")) == status["disk"]["policy_bytes"] > 0, "the disk, as status says"
    assert int(value(browser, "stat-store-bytes")) > 0
    rows = browser.find_elements(By.CSS_SELECTOR, "#pass-rates-table tbody tr")
    assert any("arith" in r.text for r in rows), [r.text for r in rows]
    assert browser.find_elements(By.CSS_SELECTOR, "#page-farm svg"), "the plots are drawn"
    shoot(browser, "farm")
    no_page_errors(browser)


def test_a_trajectory_opens_with_its_turns(farm: RunningFarm, browser: Any) -> None:
    open_page(browser, farm, f"trajectories?agent={quote(AGENT, safe='')}", "op")
    loaded(browser, "trajectories")
    rows = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#trajectories-table .trajectory-row"),
                    "the torch policy's trajectories listed")
    assert len(rows) == 8 and all("torch:tiny" in r.text for r in rows), [r.text for r in rows]
    shoot(browser, "trajectories")
    chosen = rows[0].get_attribute("data-id")
    rows[0].click()
    page = loaded(browser, "trajectory")
    with FarmClient(farm.addr, token=TOKENS["op"][0]) as client:
        record = client.trajectory(int(chosen))
    turns = page.find_elements(By.CSS_SELECTOR, "#traj-turns .turn")
    assert len(turns) == len(record.messages) >= 2, "the conversation, turn by turn"
    assert str(len(record.turns[0].token_ids)) in turns[-1].text, "with the reply's token count"
    assert record.messages[0].content.splitlines()[0] in turns[0].text, "the task as posed to the policy"
    assert browser.find_element(By.ID, "traj-final").text.strip() == record.final.strip()
    verdict = browser.find_element(By.ID, "traj-verdict").text
    assert record.verifier_version in verdict and record.reasons[0] in verdict
    shoot(browser, "trajectory")
    no_page_errors(browser)


def test_the_training_page_draws_the_policy_learning_curve(farm: RunningFarm, browser: Any) -> None:
    open_page(browser, farm, "training", "tess")
    page = loaded(browser, "training")
    assert "torch:tiny" in page.text
    assert page.find_elements(By.CSS_SELECTOR, "#training-curve svg polyline, #training-curve svg path")
    shoot(browser, "training")
    no_page_errors(browser)


def test_a_review_and_a_quarantine_from_the_page_change_the_submission_in_the_store(farm: RunningFarm, browser: Any) -> None:
    (sub,) = json.loads(farm.farmctl("--token", TOKENS["rita"][0], "review", "list", "--json").stdout)
    open_page(browser, farm, "intake", "rita")
    loaded(browser, "intake")
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"#submissions-table [data-id='{sub['id']}']"),
             "the submission in the queue")
    bounties = browser.find_elements(By.CSS_SELECTOR, "#bounties-table tbody tr")
    assert len(bounties) == 1 and "counting tasks" in bounties[0].text, "the bounty board"
    assert "$50.00\u2013$100.00" in bounties[0].text, "its payout, from the API's Money"
    shoot(browser, "intake")
    open_page(browser, farm, f"submission/{sub['id']}", "rita")
    loaded(browser, "submission")
    wait_for(browser, lambda d: state_shown(d) == "in_review", "the submission shown in review")
    shoot(browser, "submission")
    browser.find_element(By.ID, "review-note").send_keys(NOTE)
    browser.find_element(By.ID, "review-approve").click()
    wait_for(browser, lambda d: state_shown(d) == "approved", "the page showing the approval")
    stored = json.loads(farm.farmctl("--token", TOKENS["op"][0], "submission", "show", str(sub["id"]),
                                     "--json").stdout)
    assert stored["state"] == "approved" and stored["reviewer"] == "rita" and stored["review_note"] == NOTE
    page = wait_for(browser, lambda d: NOTE in d.find_element(By.ID, "page-submission").text and
                    d.find_element(By.ID, "page-submission"), "the note shown as it was written")
    assert not page.find_elements(By.TAG_NAME, "img") and browser.execute_script(
        "return document.body.dataset.pwned === undefined"), "text people wrote is shown, never run"
    no_page_errors(browser)
    env = f"contrib:{sub['name']}@{sub['version']}"
    farm.farmctl("--token", TOKENS["op"][0], "run", "--env", env, "--agent", "reference", "--rollouts", "2", "--wait")

    browser.find_element(By.ID, "quarantine-reason").send_keys("a red team found a hedge that passes")
    browser.find_element(By.ID, "quarantine").click()
    wait_for(browser, lambda d: state_shown(d) == "quarantined", "the page showing the quarantine")
    stored = json.loads(farm.farmctl("--token", TOKENS["op"][0], "submission", "show", str(sub["id"]),
                                     "--json").stdout)
    assert stored["state"] == "quarantined"

    # Its two rollouts are withdrawn: the list leaves them out and says so, and shows them withdrawn when asked.
    query = f"env={quote(env, safe='')}&agent=reference"
    open_page(browser, farm, f"trajectories?{query}", "op")
    loaded(browser, "trajectories")
    wait_for(browser, lambda d: "2 withdrawn left out" in d.find_element(By.ID, "traj-count").text,
             "the count of withdrawn trajectories left out")
    assert not browser.find_elements(By.CSS_SELECTOR, "#trajectories-table .trajectory-row")
    browser.find_element(By.ID, "f-include-withdrawn").click()
    browser.find_element(By.ID, "f-apply").click()
    rows = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#trajectories-table .trajectory-row"),
                    "the withdrawn trajectories listed when asked for")
    assert len(rows) == 2 and all("withdrawn" in r.text and "0.000" in r.text for r in rows), [r.text for r in rows]
    shoot(browser, "trajectories-withdrawn")
    rows[0].click()
    loaded(browser, "trajectory")
    assert value(browser, "traj-reward") == "0" and value(browser, "traj-verdict-version") != "0"
    scores = browser.find_elements(By.CSS_SELECTOR, "#traj-scores .score-row")
    assert [r.get_attribute("data-verdict") == "0" for r in scores] == [True, False], "the first, then the withdrawal"
    assert "first" in scores[0].text and "current" in scores[1].text and "withdrawn" in scores[1].text
    no_page_errors(browser)
    open_page(browser, farm, f"contributor/{sub['contributor']}", "rita")
    loaded(browser, "contributor")
    ledger = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#ledger-table tbody tr")]
    assert len(ledger) >= 2 and any("-20" in r.replace("\u2212", "-") for r in ledger), ledger
    shoot(browser, "contributor")


def test_a_page_without_the_right_credential_is_refused(farm: RunningFarm, browser: Any) -> None:
    open_page(browser, farm, "farm", None)
    refused = wait_for(browser, lambda d: banner(d), "the refusal shown")
    assert "UNAUTHENTICATED" in refused
    assert browser.find_element(By.ID, "page-farm").get_attribute("data-loaded") != "true"
    assert not browser.find_elements(By.CSS_SELECTOR, "#pass-rates-table tbody tr"), "no data shown"
    shoot(browser, "refused-no-token")

    (sub,) = json.loads(farm.farmctl("--token", TOKENS["op"][0], "submission", "list", "--json").stdout)
    open_page(browser, farm, f"submission/{sub['id']}", "tess")
    refused = wait_for(browser, lambda d: banner(d), "the refusal shown")
    assert "PERMISSION_DENIED" in refused and "tess" in refused
    assert not browser.find_elements(By.ID, "review-approve")
    shoot(browser, "refused-trainer")
