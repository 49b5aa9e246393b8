"""The notebook widgets in a real browser: JupyterLab 4 + headless Chromium, driven as a user would.

JupyterLab runs on 127.0.0.1 (free port, token, a temp root holding copies of the notebooks that use
widgets); Debian's `chromium` + `chromium-driver` are driven by selenium (no browser downloads). Each
notebook is run whole, every widget is used (a prefix typed with a leading newline, thinking toggled, the
viewer stepped, policies compared on the dashboard), and the rendered DOM is checked in the light and the dark
theme: no "Error displaying widget", values updated, token text and the widgets' own HTML text readable
(WCAG contrast >= 4.5:1, computed from the computed styles), no horizontal overflow, no HTML printed with its
tags, no errors in the browser console.

All checks of a notebook run; the failures are reported together, with page screenshots in a temp folder.
`STRATA_WIDGET_SHOTS=docs/widgets pytest tests/test_widgets_browser.py` also writes one PNG per widget and
theme (the pictures of docs/guide/notebooks.md).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = [p for p in sorted((ROOT / "notebooks").glob("*.ipynb"))
             if re.search(r"strata_lab(\.notebook)?\.widgets|strata_lab\.caches\.widget", p.read_text(encoding="utf-8"))]
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
MIN_CONTRAST = 4.5  # WCAG AA for body text
RUN_TIMEOUT = 240   # seconds for a whole notebook (replays, a tiny engine) on a loaded 2-core machine
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        binary = shutil.which(name)
        if binary:
            break
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no chromium + chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    return binary, driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a temp root: notebooks/ (copies) and dumps/; settings and workspaces in temp dirs."""
    pytest.importorskip("jupyterlab")
    pytest.importorskip("ipywidgets")
    import httpx

    import strata_lab

    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    (root / "notebooks").mkdir(parents=True)
    for nb in NOTEBOOKS:
        shutil.copy(nb, root / "notebooks" / nb.name)
    shutil.copytree(ROOT / "dumps", root / "dumps")
    settings = base / "settings"
    for plugin, values in {
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/apputils-extension/themes": {"theme": THEMES["light"]},
        # every cell laid out, so off-screen widgets have sizes to check
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    }.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), "strata-" + os.urandom(8).hex()
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(base / "ws"),
               JUPYTER_RUNTIME_DIR=str(base / "runtime"), MPLBACKEND="module://matplotlib_inline.backend_inline")
    # the kernel imports the strata_lab this test imports (a checkout on PYTHONPATH or the installed one)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pathlib.Path(strata_lab.__file__).parent.parent),
                                                      env.get("PYTHONPATH")]))
    log = open(base / "lab.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0", "--allow-root",
         "--ServerApp.terminals_enabled=False"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                tail = (base / "lab.log").read_text()[-2000:]
                raise RuntimeError(f"jupyterlab exited {proc.returncode}: {tail}")
            try:
                if httpx.get(f"{url}/api/status", params={"token": token}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("jupyterlab did not answer within 90 s")
            time.sleep(0.3)  # polling a server that is starting: nothing to wait on yet
        yield {"url": url, "token": token, "log": base / "lab.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def driver():
    binary, chromedriver = _browser()
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,1000", "--force-device-scale-factor=1", "--hide-scrollbars"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, read after each notebook
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_script_timeout(60)
    yield d
    d.quit()


# --- in-page helpers ------------------------------------------------------------------------------------------
_JS_COLOR = r"""
function rgba(c) {
  const m = c && c.match(/rgba?\(([^)]+)\)/);
  if (!m) return null;
  const p = m[1].split(/[\s,\/]+/).filter(Boolean).map(Number);
  return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
}
function over(top, under) {  // alpha-composite top over an opaque colour
  const a = top[3];
  return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a));
}
function background(el) {  // the colour behind el: its own and its ancestors' backgrounds, composited
  const layers = [];
  for (let e = el; e; e = e.parentElement) {
    const c = rgba(getComputedStyle(e).backgroundColor);
    if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  let col = [255, 255, 255];
  for (let i = layers.length - 1; i >= 0; i--) col = over(layers[i], col);
  return col;
}
function lum(c) {
  const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
}
function contrast(el) {
  const bg = background(el);
  const fg = over(rgba(getComputedStyle(el).color), bg);
  const [a, b] = [lum(fg), lum(bg)].sort((x, y) => y - x);
  return {ratio: (a + 0.05) / (b + 0.05), fg: fg.map(Math.round), bg: bg.map(Math.round)};
}
"""

# every widget view in the open notebook: its kind (from its controls), contrast of the text of its HTML
# children (token chips marked), horizontal overflow of the view, its output area and scrolling children
_JS_OUTPUTS = r"""
function widgetOutputs() {  // output areas showing a widget view (or the error drawn in its place)
  return [...document.querySelectorAll('.jp-OutputArea-output')].filter(
    o => o.querySelector(':scope > .jupyter-widgets') || o.innerText.includes('Error displaying widget'));
}
"""
_JS_INSPECT = _JS_OUTPUTS + _JS_COLOR + r"""
const views = widgetOutputs();
return views.map((out, i) => {
  const root = out.querySelector('.jupyter-widgets');
  const labels = [...out.querySelectorAll('.widget-label')].map(l => l.textContent.trim());
  const buttons = [...out.querySelectorAll('button')].map(b => b.textContent.trim());
  let kind = 'unknown';
  if (buttons.includes('next miss')) kind = 'DivergenceViewer';
  else if (buttons.includes('replay')) kind = 'EngineExplorer';
  else if (buttons.includes('compare')) kind = 'ReuseDashboard';
  else if (buttons.includes('run')) kind = 'PrefixExperiment';
  else if (labels.includes('prefix')) kind = 'TemplateExplorer';
  const texts = [];
  for (const el of out.querySelectorAll('.widget-html-content, .widget-html-content *')) {
    const own = [...el.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
    if (!own || !el.getClientRects().length) continue;
    const c = contrast(el);
    texts.push({text: own.slice(0, 30), chip: el.hasAttribute('data-pos'), ...c});
  }
  const overflow = [];
  const boxes = new Set([out, ...out.querySelectorAll('*')]);
  for (const el of boxes) {
    const ox = getComputedStyle(el).overflowX;
    const scrolls = ox === 'auto' || ox === 'scroll';
    if ((scrolls || el === out || el === root) && el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0)
      overflow.push(`${el.tagName.toLowerCase()}.${[...el.classList].slice(0, 3).join('.')} ` +
                    `scrollWidth ${el.scrollWidth} > clientWidth ${el.clientWidth}`);
  }
  return {index: i, kind, rendered: !!root, text: out.innerText.slice(0, 200), texts, overflow};
});
"""

# state of the open notebook: path, kernel status, code cells not run yet, error outputs
_JS_STATE = _JS_OUTPUTS + r"""
const app = window.jupyterapp;
const w = app && app.shell.currentWidget;
if (!w || !w.content || !w.content.model || !w.sessionContext) return null;
const cells = [...w.content.model.cells];
const code = cells.filter(c => c.type === 'code');
const errors = [];
let widgets = 0;
const tags = [];  // HTML printed as text instead of rendered
for (const c of code) for (const o of c.outputs.toJSON()) {
  if (o.output_type === 'error') errors.push(`${o.ename}: ${o.evalue}`);
  const text = o.output_type === 'stream' ? [].concat(o.text).join('') : '';
  if (/<\/?(b|i|div|span|table|code)\b[^>]*>/.test(text)) tags.push(text.slice(0, 80));
  if (o.data && o.data['%s']) widgets++;
}
const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
return {path: w.context.path, status: kernel ? kernel.status : 'none',
        pending: code.filter(c => c.executionCount === null).length, errors,
        widgets, shown: widgetOutputs().length, tags,
        widgetErrors: document.body.innerText.includes('Error displaying widget')};
""" % WIDGET_MIME


def _contrast_failures(views, where):
    out = []
    for v in views:
        bad = [t for t in v["texts"] if t["ratio"] < MIN_CONTRAST]
        chips = [t for t in v["texts"] if t["chip"]]
        if v["kind"] in ("TemplateExplorer", "DivergenceViewer") and not chips:
            out.append(f"{where}: {v['kind']} shows no token chips")
        if bad:
            worst = sorted(bad, key=lambda t: t["ratio"])[:3]
            out.append(f"{where}: {v['kind']}: {len(bad)} text elements below {MIN_CONTRAST}:1 "
                       f"({sum(t['chip'] for t in bad)} token chips), worst: "
                       + "; ".join(f"{t['text']!r} rgb{tuple(t['fg'])} on rgb{tuple(t['bg'])} = {t['ratio']:.2f}"
                                   for t in worst))
    return out


class Page:
    """One notebook open in JupyterLab; `check(ok, message)` collects failures instead of stopping."""

    def __init__(self, driver, lab, name, shots):
        from selenium.webdriver.support.ui import WebDriverWait

        self.d, self.lab, self.name, self.shots = driver, lab, name, shots
        self.failures: list[str] = []
        from selenium.common.exceptions import StaleElementReferenceException

        # views re-render their HTML children on every update: an element read mid-update goes stale
        self.wait = lambda timeout=60: WebDriverWait(driver, timeout, poll_frequency=0.2,
                                                     ignored_exceptions=(StaleElementReferenceException,))

    def check(self, ok, message):
        if not ok:
            self.failures.append(message)
        return ok

    def js(self, script, *args):
        return self.d.execute_script(script, *args)

    def open_and_run(self):
        d, lab = self.d, self.lab
        d.get(f"{lab['url']}/lab/workspaces/{self.name}/tree/notebooks/{self.name}.ipynb?token={lab['token']}")
        self.wait(90).until(lambda _: (self.js(_JS_STATE) or {}).get("status") == "idle",
                            "the notebook did not open with an idle kernel")
        self.js("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        state = self.wait(RUN_TIMEOUT).until(
            lambda _: (s := self.js(_JS_STATE)) and (s["errors"] or (not s["pending"] and s["status"] == "idle"))
            and s, f"the notebook did not finish within {RUN_TIMEOUT} s")
        assert not state["errors"], f"{self.name}: cells raised: {state['errors']}"
        self.check(not state["tags"], f"{self.name}: HTML printed with its tags: {state['tags']}")
        # widget views render from comm messages after the cell finished: wait for each to draw or fail
        self.wait().until(lambda _: (s := self.js(_JS_STATE))["shown"] >= s["widgets"], "widget views not drawn")

    def theme(self, name):
        theme = THEMES[name]
        self.js("window.jupyterapp.commands.execute('apputils:change-theme', {theme: arguments[0]})", theme)
        dark = name == "dark"
        self.wait().until(lambda _: self.js(
            "const s = getComputedStyle(document.body);"
            "return document.body.dataset.jpThemeName === arguments[0] && "
            "document.body.dataset.jpThemeLight === arguments[1] && s.getPropertyValue('--jp-layout-color0')",
            theme, "false" if dark else "true"), f"theme {theme} not applied")

    def views(self):
        return self.js(_JS_INSPECT)

    def inspect(self, where):
        views = self.views()
        # a view just clicked may still be redrawing its chips (its header changes first): on a loaded machine
        # give it a few seconds before calling a view without chips a failure
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
                v["kind"] in ("TemplateExplorer", "DivergenceViewer") and not any(t["chip"] for t in v["texts"])
                for v in views):
            time.sleep(0.25)
            views = self.views()
        state = self.js(_JS_STATE)
        self.check(not state["widgetErrors"], f"{where}: the page shows 'Error displaying widget'")
        self.check(views and all(v["rendered"] for v in views), f"{where}: widget views not rendered: "
                   + str([v["text"][:80] for v in views if not v["rendered"]]))
        self.failures += _contrast_failures(views, where)
        for v in views:
            self.check(not v["overflow"], f"{where}: {v['kind']} overflows horizontally: {v['overflow'][:3]}")
        return views

    def element(self, kind):
        """The output element of the first widget view of a kind."""
        views = self.views()
        index = next((v["index"] for v in views if v["kind"] == kind), None)
        assert index is not None, f"{self.name}: no {kind} shown (views: {[v['kind'] for v in views]})"
        return self.js(_JS_OUTPUTS + "return widgetOutputs()[arguments[0]];", index)

    def shoot(self, kind, theme):
        """With STRATA_WIDGET_SHOTS set: a PNG of the widget (a window tall enough for all of it, 64 colours)."""
        if not self.shots:
            return
        from PIL import Image

        height = self.js("return arguments[0].getBoundingClientRect().height", self.element(kind))
        self.d.set_window_size(1280, int(height) + 300)
        try:
            el = self.element(kind)
            self.js("arguments[0].scrollIntoView({block: 'center'})", el)
            path = pathlib.Path(self.shots) / f"{kind}-{theme}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            el.screenshot(str(path))
            Image.open(path).convert("RGB").quantize(64).save(path, optimize=True)
        finally:
            self.d.set_window_size(1280, 1000)


def _control(view, label):
    """The input, textarea or container of the control described by `label`."""
    from selenium.webdriver.common.by import By

    return view.find_element(
        By.XPATH, f".//label[contains(@class, 'widget-label') and normalize-space()='{label}']"
                  "/following-sibling::*[1]")


def _html_children(view):
    from selenium.webdriver.common.by import By

    return view.find_elements(By.CSS_SELECTOR, ".widget-html-content")


def _retype(box, *keys):
    from selenium.webdriver.common.keys import Keys

    box.click()
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)
    if keys:
        box.send_keys(*keys)


def _template_explorer(page):
    """Type a prefix with a leading newline; thinking is disabled with a note while there is a prefix and
    changes the prompt once the prefix is gone."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    view = page.element("TemplateExplorer")
    box = _control(view, "prefix")
    # the notebook set explorer.prefix.value = "\nSure": the box must show that newline
    page.check(box.get_attribute("value") == "\nSure",
               f"TemplateExplorer: prefix box shows {box.get_attribute('value')!r} for the kernel's '\\nSure'")

    def summary():
        return next((h.text for h in _html_children(view) if " tokens" in h.text), "")

    before = summary()
    _retype(box, Keys.ENTER, "Sure!")
    try:
        page.wait(30).until(lambda _: "Sure!" in view.text and summary() != before)
    except Exception:
        page.check(False, f"TemplateExplorer: typing a prefix did not update the view (summary {summary()!r})")
    page.check(box.get_attribute("value") == "\nSure!",
               f"TemplateExplorer: prefix typed as ENTER 'Sure!' reads {box.get_attribute('value')!r}")
    page.check("BPE merged across the boundary" in summary(),
               f"TemplateExplorer: leading newline lost, no straddling token reported: {summary()!r}")
    def buttons():  # found afresh: the view redraws its buttons on updates
        return _control(view, "thinking").find_elements(By.TAG_NAME, "button")

    page.check(buttons() and all(not b.is_enabled() for b in buttons()),
               "TemplateExplorer: thinking buttons enabled while a prefix makes them do nothing")
    notes = [h.text for h in _html_children(view)
             if "think" in h.text and "prefix" in h.text and not h.find_elements(By.CSS_SELECTOR, "[data-pos]")]
    page.check(any(notes), "TemplateExplorer: no visible note why thinking is off while there is a prefix")
    _retype(box)
    page.wait(30).until(lambda _: "prefix starts" not in summary(), "clearing the prefix did not re-render")
    page.wait(10).until(lambda _: all(b.is_enabled() for b in buttons()), "thinking stays disabled, no prefix")
    count = summary().split(" tokens")[0]
    on = next(b for b in buttons() if b.text.strip() == "on")
    off = next(b for b in buttons() if b.text.strip() == "off")
    (off if "mod-active" in (on.get_attribute("class") or "") else on).click()
    try:
        page.wait(30).until(lambda _: summary().split(" tokens")[0] != count)
    except Exception:
        page.check(False, f"TemplateExplorer: toggling thinking did not change the prompt ({summary()!r})")
    # leave the view showing the demonstrated boundary (screenshots)
    _retype(box, Keys.ENTER, "Sure!")
    page.wait(30).until(lambda _: "Sure!" in view.text, "typing a prefix did not re-render")


def _prefix_experiment(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    view = page.element("PrefixExperiment")
    box = _control(view, "prefix")
    _retype(box, Keys.ENTER, "Tamam")
    page.check(box.get_attribute("value") == "\nTamam",
               f"PrefixExperiment: prefix typed as ENTER 'Tamam' reads {box.get_attribute('value')!r}")
    run = next(b for b in view.find_elements(By.TAG_NAME, "button") if b.text.strip() == "run")
    run.click()
    try:
        page.wait(60).until(lambda _: "with prefix '\\nTamam'" in view.text)
    except Exception:
        page.check(False, "PrefixExperiment: run with the prefix '\\nTamam' did not show its result "
                          f"({[h.text[:60] for h in _html_children(view)]})")


def _divergence_viewer(page):
    from selenium.webdriver.common.by import By

    view = page.element("DivergenceViewer")

    def header():
        return next((h.text for h in _html_children(view) if "cause" in h.text), "")

    def consistent(where):
        label = view.find_element(By.CSS_SELECTOR, ".widget-slider .widget-label").text.strip()
        readout = view.find_element(By.CSS_SELECTOR, ".widget-readout").text.strip()
        m = re.search(rf"\b{re.escape(label)} (\d+)", header())
        page.check(m and m.group(1) == readout,
                   f"DivergenceViewer ({where}): slider reads {label} {readout}, header says "
                   f"{header().splitlines()[0] if header() else ''!r}")

    consistent("first")
    for button in ("▶", "next miss"):
        before = header()
        next(b for b in view.find_elements(By.TAG_NAME, "button") if b.text.strip() == button).click()
        try:
            page.wait(30).until(lambda _: header() != before)
        except Exception:
            page.check(False, f"DivergenceViewer: {button} did not change the call shown")
        consistent(f"after {button}")


def _reuse_dashboard(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    view = page.element("ReuseDashboard")
    select = Select(view.find_element(By.TAG_NAME, "select"))  # the policies
    image = view.find_element(By.TAG_NAME, "img").get_attribute("src")
    select.deselect_all()
    for policy in ("recorded", "every:64"):
        select.select_by_visible_text(policy)
    next(b for b in view.find_elements(By.TAG_NAME, "button") if b.text.strip() == "compare").click()

    def policies():
        rows = view.find_elements(By.CSS_SELECTOR, "table tbody tr")
        return [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows]

    try:
        page.wait(90).until(lambda _: policies() == ["recorded", "every:64"])
    except Exception:
        page.check(False, f"ReuseDashboard: compare shows {policies()} for recorded, every:64")
    try:
        page.wait(30).until(lambda _: view.find_element(By.TAG_NAME, "img").get_attribute("src") != image)
    except Exception:
        page.check(False, "ReuseDashboard: the plot did not change")


def _engine_explorer(page):
    """Tick engines, type an override spec, replay: the summary lists exactly those specs and the plot
    changes; a bad spec shows an error naming the field and leaves the summary as it was."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    view = page.element("EngineExplorer")
    select = Select(view.find_element(By.TAG_NAME, "select"))  # the engines
    box = view.find_element(By.TAG_NAME, "textarea")            # one spec per line
    image = view.find_element(By.TAG_NAME, "img").get_attribute("src")

    def replay():
        next(b for b in view.find_elements(By.TAG_NAME, "button") if b.text.strip() == "replay").click()

    def specs():  # first column of the summary table
        rows = view.find_elements(By.CSS_SELECTOR, "table tbody tr")
        return [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows]

    select.deselect_all()
    for engine in ("strata", "sglang"):
        select.select_by_visible_text(engine)
    _retype(box, "vllm:block_size=32")
    replay()
    try:
        page.wait(120).until(lambda _: len(specs()) == 3 and specs()[0].startswith("strata")
                             and specs()[1].startswith("sglang") and "block_size=32" in specs()[2])
    except Exception:
        page.check(False, f"EngineExplorer: replay shows {specs()} for strata, sglang, vllm:block_size=32")
    try:
        page.wait(30).until(lambda _: view.find_element(By.TAG_NAME, "img").get_attribute("src") != image)
    except Exception:
        page.check(False, "EngineExplorer: the plot did not change")
    before = specs()
    _retype(box, "vllm:bogus_field=1")
    replay()
    try:
        page.wait(60).until(lambda _: "bogus_field" in view.text)
    except Exception:
        page.check(False, "EngineExplorer: a bad spec shows no error naming the field")
    page.check(specs() == before, f"EngineExplorer: a bad spec changed the summary ({before} -> {specs()})")


INTERACT = {"TemplateExplorer": _template_explorer, "PrefixExperiment": _prefix_experiment,
            "DivergenceViewer": _divergence_viewer, "ReuseDashboard": _reuse_dashboard,
            "EngineExplorer": _engine_explorer}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_widgets_in_jupyterlab(path, driver, lab):  # driver first: no browser, no JupyterLab
    page = Page(driver, lab, path.stem, os.environ.get("STRATA_WIDGET_SHOTS"))
    try:
        page.open_and_run()
        page.theme("light")
        kinds = [v["kind"] for v in page.inspect("light, as run")]
        unknown = [v["text"][:80] for v in page.views() if v["kind"] == "unknown"]
        assert not unknown, (f"widget views this test does not know: {unknown}; give each a kind (from its "
                             "controls) in _JS_INSPECT and an interaction in INTERACT")
        for kind in dict.fromkeys(kinds):
            INTERACT[kind](page)
        for theme in THEMES:
            page.theme(theme)
            page.inspect(f"{theme}, after use")
            for kind in dict.fromkeys(kinds):
                page.shoot(kind, theme)
    except Exception as exc:  # a broken page: report it with the checks that failed so far
        page.failures.append(f"stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        if page.failures:
            shots = pathlib.Path(tempfile.mkdtemp(prefix=f"strata-browser-{path.stem}-"))
            driver.save_screenshot(str(shots / "page.png"))
            (shots / "page.html").write_text(driver.page_source, encoding="utf-8")
            for theme in THEMES:
                try:
                    page.theme(theme)
                    driver.execute_script("document.body.style.zoom = '0.5'")
                    driver.save_screenshot(str(shots / f"page-{theme}.png"))
                    driver.execute_script("document.body.style.zoom = ''")
                except Exception:
                    pass
            page.failures.append(f"screenshots in {shots}")
        try:  # the console stays clean (reading the log also empties it for the next notebook)
            errors = [e["message"][:200] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            page.check(not errors, f"browser console errors: {errors[:5]}")
        except Exception as exc:
            page.failures.append(f"could not read the browser console: {exc}")
        try:  # free the kernel: the next notebook gets its own
            driver.execute_script("const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                                  "if (w && w.sessionContext) w.sessionContext.shutdown();")
        except Exception:
            pass
    assert not page.failures, "\n".join(page.failures)
