"""The documentation site (``mkdocs.yml``, ``docs/``): every code block of its pages runs; it builds
with no warning; its API reference covers every public name and hides the engine's internals; and
its pages render in a real browser (headless Chromium, where one is installed)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import types
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Pages of measurements and of the engine's internals, quoting code rather than teaching it.
NOT_PROGRAMS = {"design.md", "benchmarks.md"}
NOT_RUN = "<!-- not run:"  # a block's marker, on the line above it, with the reason
PUBLIC_MODULES = [
    "monadl",
    "monadl.nn",
    "monadl.data",
    "monadl.data.sst",
    "monadl.checkpoint",
    "monadl.gradcheck",
    "monadl.distributed",
    "monadl.interop",
]
# What the reference must not show: the engine's internals (issue 31).
INTERNALS = [
    "monadl.SGD.update_owned",
    "monadl.SGD.update_folded",
    "monadl.SGD.folded_rate",
    "monadl.Executor.PROGRAMS",
    "monadl.Executor.SEEN",
    "monadl.Executor.BODIES",
    "monadl.Executor.evaluate",
    "monadl.Executor.publish",
    "monadl.Executor.dispatcher",
    "monadl.ArrayWeight.head",
]


def code_blocks(page: Path) -> list[tuple[int, str]]:
    """The ``python`` fenced blocks of ``page`` to run, with their first lines' numbers (from 1),
    leaving out those marked ``<!-- not run: why -->`` on the line above."""
    blocks: list[tuple[int, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            end = start
            while lines[end].strip() != "```":
                end += 1
            if not (i > 0 and lines[i - 1].startswith(NOT_RUN)):
                blocks.append((start + 1, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return blocks


PAGES = sorted(
    p for p in DOCS.rglob("*.md") if p.name not in NOT_PROGRAMS and "_tools" not in p.parts and code_blocks(p)
)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_code_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's blocks run in order in one namespace, as a reader would paste them (in a temporary
    working directory: a block may write a file); their asserts check what the text says."""
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType(f"docs_page_{page.stem.replace('-', '_')}")  # dataclasses look it up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for line, code in code_blocks(page):
        try:
            exec(compile(code, f"{page}:{line}", "exec"), module.__dict__)
        except Exception as error:
            raise AssertionError(
                f"{page.relative_to(ROOT)}: the block at line {line} failed: {error!r}"
            ) from error


def test_not_run_blocks_are_few_and_say_why() -> None:
    """Blocks left out of the run are marked one by one, with a reason (not a page at a time)."""
    marked = [
        (page.name, line)
        for page in DOCS.rglob("*.md")
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith(NOT_RUN)
    ]
    assert all(line.endswith("-->") and len(line) > len(NOT_RUN) + 10 for _, line in marked), marked
    assert {name for name, _ in marked} <= {"distributed.md", "gpu.md", "pytorch-weights.md"}, marked


# ------------------------------------------------------------------------------------------ the site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as CI builds it: strict (a warning fails), Python's warnings errors."""
    pytest.importorskip("mkdocs", reason="the site's tools come with the dev extra (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def inventory(site: Path) -> set[str]:
    """The names the site documents, from its Sphinx inventory (``objects.inv``)."""
    header, _, body = site.joinpath("objects.inv").read_bytes().partition(b"zlib.\n")
    assert header.startswith(b"# Sphinx inventory version 2"), header[:40]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_reference_documents_every_public_name(site: Path, module: str) -> None:
    """Every name of a public module's ``__all__`` has an entry (a new export without a place in
    the reference fails here), under the name users import it by."""
    names = inventory(site)
    exported = (
        sys.modules[module].__all__ if module in sys.modules else __import__(module, fromlist=["_"]).__all__
    )
    missing = [name for name in exported if f"{module}.{name}" not in names]
    if module == "monadl":  # the checkpoint functions are documented in their module's page
        missing = [name for name in missing if f"monadl.checkpoint.{name}" not in names]
    assert not missing, f"{module}: not in the reference: {missing}"
    assert {"monadl.cli", "monadl.data.sst", "monadl.AnyLayer"} <= names


def test_reference_hides_internals(site: Path) -> None:
    names = inventory(site)
    shown = [name for name in INTERNALS if name in names or name.replace("monadl.", "monadl.dsl.") in names]
    assert not shown, f"internals in the reference: {shown}"
    page = site.joinpath("reference", "optimizers", "index.html").read_text(encoding="utf-8")
    assert "update_owned" not in page and "glibc" not in page


def test_reference_signatures_keep_aliases(site: Path) -> None:
    """Annotations as the source writes them: ``Array``, not NumPy's types expanded (a signature
    that scrolls sideways)."""
    page = site.joinpath("reference", "ops", "index.html").read_text(encoding="utf-8")
    assert "AnyArray" in page
    assert "numpy.ndarray[tuple" not in page and "dtype[numpy.floating" not in page


def test_changelog_page_holds_the_changelog(site: Path) -> None:
    page = site.joinpath("changelog", "index.html").read_text(encoding="utf-8")
    assert "deprecation policy" in page and "Removed" in page


# ----------------------------------------------------------------------------------------- a browser


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The site on a loopback HTTP server (a thread; stopped after the module's tests)."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files without a line on stderr per request."""

    def log_message(self, *args: object) -> None:
        pass


def browse(url: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on ``url``, as root may run it, without reaching out to the network."""
    browser = chromium()
    assert browser is not None
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,1600",
        *flags,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(chromium() is None, reason="no Chromium here (Debian: apt-get install chromium)")
@pytest.mark.parametrize(
    ("path", "title", "text"),
    [
        ("getting-started/", "Getting started", "A classifier, step by step"),
        ("reference/layers/", "Layers and weights", "train_blocking"),
        ("process-wide-effects/", "Process-wide effects", "MONADL_TUNE_MALLOC"),
    ],
)
def test_pages_render_in_a_browser(served: str, tmp_path: Path, path: str, title: str, text: str) -> None:
    """The page as Chromium builds it (after its scripts ran) has its title and text and no error
    page; its screenshot is a picture, not a blank page."""
    dom = browse(f"{served}/{path}", tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f"<title>{title} - monadl</title>" in dom.stdout, dom.stdout[:500]
    assert text in dom.stdout
    for error in ("404 - Not found", "Traceback (most recent call last)", "Could not collect"):
        assert error not in dom.stdout, error
    shot = tmp_path / "page.png"
    done = browse(f"{served}/{path}", tmp_path, f"--screenshot={shot}", "--hide-scrollbars")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    image = pytest.importorskip("matplotlib.image").imread(str(shot))
    assert image.shape[:2] == (1600, 1280) and float(image.std()) > 0.05, (image.shape, image.std())
