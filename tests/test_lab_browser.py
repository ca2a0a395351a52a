"""JupyterLab in a real headless Chromium: run a notebook as a user would, and read published ones.

What a user sees is the rendered page, not the .ipynb: these tests drive Debian's chromium through
playwright against `make lab`'s configuration on loopback, assert on the DOM (no error, a figure
decoded in an output area) and save screenshots in the test's tmp dir, and also in
$DRAFTLAB_SCREENSHOTS when it is set. They skip, saying why, without playwright or chromium.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from helpers_lab import published_notebooks, running_lab

ROOT = Path(__file__).parents[1]
CHROMIUM = os.environ.get("DRAFTLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PUBLISHED_STEMS = ("05_flag_diagnosis", "06_benchmark_acceptance")


def embeds_a_figure(path: Path) -> bool:
    cells = json.loads(path.read_text())["cells"]
    return any("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))


def published_with_figures(stems=PUBLISHED_STEMS) -> list[str]:
    """For each stem, one committed executed notebook that embeds a figure: results/reference's when it has one,
    else another published run's. The reference run is re-pointed from run to run, so no path is typed here."""
    paths = sorted(
        (str(p.relative_to(ROOT)) for p in published_notebooks()), key=lambda p: (p.split("/")[1] != "reference", p)
    )
    chosen = []
    for stem in stems:
        found = next((p for p in paths if Path(p).stem == stem and embeds_a_figure(ROOT / p)), None)
        assert found, f"no published results/*/executed/{stem}.ipynb embeds a figure"
        chosen.append(found)
    return chosen


ERROR_LINE = re.compile(r"^\w+(Error|Exception): ", re.M)  # an error's last line (SyntaxError has no Traceback line)

pytestmark = pytest.mark.server

# all code cells numbered, none pending, kernel idle: Run All finished (it leaves "[ ]" after an error)
RUN_FINISHED = """() => {
  const prompts = [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell .jp-InputPrompt')]
      .map(e => e.textContent.trim());
  const idle = document.querySelector(".jp-Notebook-ExecutionIndicator[data-status='idle']") !== null;
  return idle && prompts.some(t => /^\\[\\d+\\]:$/.test(t)) && !prompts.includes('[*]:');
}"""


@pytest.fixture
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (make setup installs it: pip install playwright)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no chromium at {CHROMIUM} (Debian: apt-get install chromium, which make setup runs as root)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


def open_in_lab(browser, lab, path: str):
    """A page with only this notebook open (its own workspace, so no tab of an earlier page is restored)."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.goto(f"{lab.url}/lab/workspaces/{Path(path).stem}/tree/{path}?token={lab.token}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    deadline = time.time() + 90  # its kernel started and idle, as the server sees it (the page shows idle earlier)
    while not any(
        s["path"] == path and s["kernel"]["execution_state"] == "idle" for s in lab.api("GET", "sessions").json()
    ):
        assert time.time() < deadline, f"{path}: no idle kernel after 90 s; see {lab.log}"
        time.sleep(0.5)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
    no_news = page.locator(".jp-toast-button:has-text('No')")  # Lab's "notified about Jupyter news?" toast
    if no_news.count():
        no_news.first.click()
    return page


def accept_kernel_dialog(page) -> None:
    """Lab may ask which kernel to start (the notebook's own, draftlab, is preselected): accept, as a user would."""
    button = page.locator(".jp-Dialog:has-text('Select Kernel') button.jp-mod-accept")
    if button.count():
        button.first.click(timeout=5_000)


def wait_for_run_all(page, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        accept_kernel_dialog(page)
        if page.evaluate(RUN_FINISHED):
            return True
        time.sleep(0.5)
    return False


def screenshot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path))
    if os.environ.get("DRAFTLAB_SCREENSHOTS"):
        out = Path(os.environ["DRAFTLAB_SCREENSHOTS"])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, out / name)
    return path


def decoded_images(page) -> list[int]:
    return page.eval_on_selector_all(
        ".jp-NotebookPanel .jp-OutputArea-output img", "els => els.map(e => e.naturalWidth)"
    )


def tracebacks(page) -> list[str]:
    texts = page.eval_on_selector_all(".jp-NotebookPanel .jp-OutputArea-output", "els => els.map(e => e.textContent)")
    return [t[:300] for t in texts if "Traceback (most recent call last)" in t or ERROR_LINE.search(t)]


def with_run_dir(root: Path, stem: str, run_dir: Path) -> None:
    """Copy notebook `stem` (and its twin) under root/notebooks with only RUN_DIR changed, as a user would."""
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    for ext, old in (
        (".ipynb", '\\"results/lab\\"'),
        (".py", '"results/lab"'),
    ):  # the .py last: jupytext wants it newest
        source = (ROOT / "notebooks" / f"{stem}{ext}").read_text()
        assert f"RUN_DIR = {old}" in source, f"{stem}{ext}: RUN_DIR default changed"
        new = json.dumps(str(run_dir)) if ext == ".py" else json.dumps(json.dumps(str(run_dir)))[1:-1]
        (root / "notebooks" / f"{stem}{ext}").write_text(source.replace(f"RUN_DIR = {old}", f"RUN_DIR = {new}"))
        time.sleep(1.1)


def run_all(page) -> None:
    page.click(".lm-MenuBar-itemLabel:text-is('Run')")
    page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")


def test_run_all_of_environment_check_in_chromium(browser, tmp_path):
    """Notebook 00 on its Lab defaults (the embedded target, quick; RUN_DIR moved into tmp) runs clean and draws
    its figure."""
    root, run_dir = tmp_path / "root", tmp_path / "run"
    with_run_dir(root, "00_environment_check", run_dir)
    with running_lab(root, tmp_path) as lab:
        assert "draftlab" in lab.api("GET", "kernelspecs").json()["kernelspecs"], "no draftlab kernel: run make setup"
        page = open_in_lab(browser, lab, "notebooks/00_environment_check.ipynb")
        run_all(page)
        if not wait_for_run_all(page, 240):  # the page as it was is the best error message
            shot = screenshot(page, tmp_path, "lab-00_environment_check-run-all-timeout.png")
            pytest.fail(f"Run All did not finish in 240 s: see {shot}")
        prompts = page.eval_on_selector_all(
            ".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())"
        )
        images = decoded_images(page)
        if images:
            page.locator(".jp-NotebookPanel .jp-OutputArea-output img").first.scroll_into_view_if_needed()
        shot = screenshot(page, tmp_path, "lab-00_environment_check-run-all.png")
        assert all(p[1:-2].isdigit() for p in prompts), f"not every cell ran: {prompts} (see {shot})"
        assert not tracebacks(page), tracebacks(page)
        assert images and all(w > 0 for w in images), f"no figure rendered in an output area (see {shot})"
        assert json.loads((run_dir / "metrics.json").read_text())["00_environment_check"]["target"]["target"] != "tiny"
        assert json.loads((run_dir / "run.json").read_text())["TARGET"] == "embedded"
        notebook = root / "notebooks" / "00_environment_check.ipynb"
        before = notebook.stat().st_mtime_ns
        page.keyboard.press("Control+s")
        deadline = time.time() + 30
        while notebook.stat().st_mtime_ns == before and time.time() < deadline:
            time.sleep(0.2)
        saved = json.loads(notebook.read_text())
        assert notebook.stat().st_mtime_ns != before, "Ctrl+S saved nothing"
        assert all(not c.get("outputs") for c in saved["cells"] if c["cell_type"] == "code"), "saved with outputs"


def test_run_all_of_a_stage_whose_input_is_missing_stops_with_one_line(browser, tmp_path):
    """05 on its Lab defaults in a new run folder: Run All stops at once and says, in one line and no
    traceback, which stages to run first (issue 20.1)."""
    root, run_dir = tmp_path / "root", tmp_path / "lab"
    with_run_dir(root, "05_flag_diagnosis", run_dir)
    with running_lab(root, tmp_path) as lab:
        page = open_in_lab(browser, lab, "notebooks/05_flag_diagnosis.ipynb")
        run_all(page)
        locator = page.locator(".jp-NotebookPanel .jp-OutputArea-output:has-text('StageMissing')")
        try:
            locator.first.wait_for(timeout=120_000)
        except Exception:
            shot = screenshot(page, tmp_path, "lab-05_flag_diagnosis-missing-stage-timeout.png")
            pytest.fail(f"no StageMissing line after 120 s: see {shot}")
        wait_for_run_all(page, 60)
        time.sleep(4)  # Run All activates the last cell; the error output scrolls its cell back (0.4-3 s)
        box = locator.first.bounding_box()
        shot = screenshot(page, tmp_path, "lab-05_flag_diagnosis-missing-stage.png")
        assert box and 0 <= box["y"] < 1000, f"the error is off screen after Run All: {box} (see {shot})"
        text = locator.first.text_content().strip()
        assert text.count("\n") == 0 and "Traceback" not in text, f"{text!r} ({shot})"
        assert "run 02_blend, then 03_regenerate, then 04_train_draft first" in text, text
        assert f"--run-id {run_dir.name}" in text
        assert not list((run_dir / "figures").glob("05_*.png"))  # nothing drawn from a stand-in


def test_published_executed_notebooks_show_their_figures_in_chromium(browser, tmp_path):
    """The committed GPU-run notebooks, opened in Lab, render their figures (issue 20.3), and stay as committed:
    opening one marks it changed (the kernel's language_info), so Lab serves them read-only and Ctrl+S and
    autosave write nothing."""
    root = tmp_path / "root"
    published = published_with_figures()
    for rel in published:  # a copy, so nothing Lab does can touch the committed files
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    with running_lab(root, tmp_path) as lab:
        for rel in published:
            cells = json.loads((ROOT / rel).read_text())["cells"]
            embedded = sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))
            page = open_in_lab(browser, lab, rel)
            page.wait_for_selector(".jp-NotebookPanel .jp-OutputArea-output img", state="attached", timeout=60_000)
            figures = page.locator(".jp-NotebookPanel .jp-OutputArea-output img")
            figures.last.scroll_into_view_if_needed()
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-NotebookPanel .jp-OutputArea-output img')]"
                ".every(e => e.naturalWidth > 0)",
                timeout=30_000,
            )
            shot = screenshot(page, tmp_path, f"lab-{rel.split('/')[1]}-{Path(rel).stem}.png")
            assert figures.count() == embedded, f"{rel}: {embedded} figures embedded, {figures.count()} shown ({shot})"
            assert lab.api("GET", f"contents/{rel}?content=0").json()["writable"] is False
            page.locator(".jp-NotebookPanel").first.click()
            page.keyboard.press("Control+s")  # as a user would; Lab says it is read-only
            page.locator(".jp-toast-message:has-text('read-only')").first.wait_for(timeout=10_000)
            assert (root / rel).read_bytes() == (ROOT / rel).read_bytes(), f"{rel}: Lab rewrote a published record"
            page.close()


def test_make_demo_run_folder_runs_all_of_05_and_06_without_an_edit(browser, tmp_path, monkeypatch):
    """What `make demo` then `make lab` give a user: the run folder results/lab (here a smoke run of the stages
    05 and 06 read, under $DRAFTLAB_RESULTS) and the notebooks as committed; Run All of each, no edit: no
    error, every cell run, figures drawn, and the first output names the run it continued."""
    import subprocess
    import sys

    results = tmp_path / "results"
    monkeypatch.setenv("DRAFTLAB_RESULTS", str(results))  # the run, the Lab server and its kernels
    draftlab = str(Path(sys.executable).with_name("draftlab"))
    cmd = [draftlab, "run", "02", "03", "04", "--profile", "smoke", "--run-id", "lab"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    root = tmp_path / "root"
    (root / "notebooks").mkdir(parents=True)
    for stem in ("05_flag_diagnosis", "06_benchmark_acceptance"):
        for ext in (".ipynb", ".py"):  # unchanged; the .py last, jupytext wants it newest
            shutil.copy(ROOT / "notebooks" / f"{stem}{ext}", root / "notebooks" / f"{stem}{ext}")
            time.sleep(1.1)
    with running_lab(root, tmp_path) as lab:
        for stem in ("05_flag_diagnosis", "06_benchmark_acceptance"):
            page = open_in_lab(browser, lab, f"notebooks/{stem}.ipynb")
            run_all(page)
            finished = wait_for_run_all(page, 900)
            shot = screenshot(page, tmp_path, f"lab-demo-{stem}-run-all.png")
            assert finished, f"{stem}: Run All did not finish in 900 s (see {shot})"
            prompts = page.eval_on_selector_all(
                ".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt", "els => els.map(e => e.textContent.trim())"
            )
            assert all(p[1:-2].isdigit() for p in prompts), f"{stem}: not every cell ran: {prompts} (see {shot})"
            assert not tracebacks(page), f"{stem}: {tracebacks(page)} (see {shot})"
            images = decoded_images(page)
            assert images and all(w > 0 for w in images), f"{stem}: no figure drawn (see {shot})"
            first = page.locator(".jp-NotebookPanel .jp-OutputArea-output").first.text_content()
            assert "RUN_DIR results/lab (a smoke run of 'tiny'" in first, first
            page.close()
    metrics = json.loads((results / "lab" / "metrics.json").read_text())
    assert {"05_flag_diagnosis", "06_benchmark_acceptance"} <= set(metrics)
