"""The documentation site (``mkdocs.yml``, ``docs/``): every code block of its pages runs; it builds
with no warning; its API reference covers every public name and hides the engine's internals; and
its pages render in a real browser (headless Chromium, where one is installed)."""

from __future__ import annotations

import functools
import http.server
import os
import re
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
# A block of PyTorch code beside monadl's (its marker on the line above it, saying what it shows):
# run where PyTorch is installed, in a namespace of its own (test_page_pytorch_code_runs).
PYTORCH = "<!-- PyTorch:"
FENCE = re.compile(r"```python(\s+title=\"[^\"]*\")?")  # a block's first line, titled or not
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
# What the reference must not show: the engine's internals.
INTERNALS = [
    "monadl.SGD.update_owned",
    "monadl.Executor.PROGRAMS",
    "monadl.Executor.SEEN",
    "monadl.Executor.BODIES",
    "monadl.Executor.evaluate",
    "monadl.Executor.publish",
    "monadl.Executor.dispatcher",
    "monadl.ArrayWeight.head",
]


def fenced_blocks(page: Path) -> list[tuple[int, str, str]]:
    """The ``python`` fenced blocks of ``page`` (titled or not): their first lines' numbers (from
    1), their code, and their marker (the line above them where it is an HTML comment, else "")."""
    blocks: list[tuple[int, str, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if FENCE.fullmatch(lines[i].strip()):
            start = i + 1
            end = start
            while lines[end].strip() != "```":
                end += 1
            above = lines[i - 1].strip() if i > 0 else ""
            marker = above if above.startswith("<!--") else ""
            blocks.append((start + 1, "\n".join(lines[start:end]) + "\n", marker))
            i = end
        i += 1
    return blocks


def code_blocks(page: Path) -> list[tuple[int, str]]:
    """The ``python`` fenced blocks of ``page`` to run, with their first lines' numbers (from 1),
    leaving out those marked ``<!-- not run: why -->`` on the line above, and PyTorch's."""
    return [
        (line, code)
        for line, code, marker in fenced_blocks(page)
        if not marker.startswith((NOT_RUN, PYTORCH))
    ]


def pytorch_blocks(page: Path) -> list[int]:
    """The first lines of the PyTorch blocks of ``page``."""
    return [line for line, _, marker in fenced_blocks(page) if marker.startswith(PYTORCH)]


PAGES = sorted(
    p for p in DOCS.rglob("*.md") if p.name not in NOT_PROGRAMS and "_tools" not in p.parts and code_blocks(p)
)
TORCH_PAGES = [p for p in PAGES if pytorch_blocks(p)]


def _page_module(page: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType(f"docs_page_{page.stem.replace('-', '_')}")  # dataclasses look it up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _run(page: Path, line: int, code: str, namespace: dict[str, object]) -> None:
    try:
        exec(compile(code, f"{page}:{line}", "exec"), namespace)
    except Exception as error:
        raise AssertionError(
            f"{page.relative_to(ROOT)}: the block at line {line} failed: {error!r}"
        ) from error


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_code_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's blocks run in order in one namespace, as a reader would paste them (in a temporary
    working directory: a block may write a file); their asserts check what the text says."""
    monkeypatch.chdir(tmp_path)
    module = _page_module(page, monkeypatch)
    for line, code in code_blocks(page):
        _run(page, line, code, module.__dict__)


@pytest.mark.parametrize("page", TORCH_PAGES, ids=[str(p.relative_to(DOCS)) for p in TORCH_PAGES])
def test_page_pytorch_code_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's PyTorch blocks run too, where PyTorch is installed: in order, in a namespace of
    their own that starts as a copy of the page's at the first of them (both sides of a comparison
    use the same names), the page's other blocks in theirs."""
    pytest.importorskip("torch", reason="PyTorch is not installed: the pages' PyTorch blocks are not run")
    monkeypatch.chdir(tmp_path)
    module = _page_module(page, monkeypatch)
    theirs: dict[str, object] | None = None
    for line, code, marker in fenced_blocks(page):
        if marker.startswith(PYTORCH):
            theirs = dict(module.__dict__) if theirs is None else theirs
            _run(page, line, code, theirs)
        elif not marker.startswith(NOT_RUN):
            _run(page, line, code, module.__dict__)


def test_the_block_markers() -> None:
    """PyTorch's blocks are found, titled fences too, and never run with the page's own."""
    page = DOCS / "from-pytorch.md"
    titled = [(line, marker) for line, _, marker in fenced_blocks(page) if marker.startswith(PYTORCH)]
    assert titled and all(line in pytorch_blocks(page) for line, _ in titled)
    assert not {line for line, _ in code_blocks(page)} & set(pytorch_blocks(page))
    assert all("import torch" not in code for _, code in code_blocks(page))


def test_not_run_blocks_are_few_and_say_why() -> None:
    """Blocks left out of the run are marked one by one, with a reason (not a page at a time)."""
    marked = [
        (page.name, line)
        for page in DOCS.rglob("*.md")
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith(NOT_RUN)
    ]
    assert all(line.endswith("-->") and len(line) > len(NOT_RUN) + 10 for _, line in marked), marked
    # (add-an-op.md: code that goes into the library, which would register ops in the tests' process)
    assert {name for name, _ in marked} <= {
        "distributed.md",
        "gpu.md",
        "pytorch-weights.md",
        "add-an-op.md",
    }, marked
    pytorch = [
        line.strip() for page in DOCS.rglob("*.md") for line in page.read_text(encoding="utf-8").splitlines()
    ]
    pytorch = [line for line in pytorch if line.startswith(PYTORCH)]
    assert all(line.endswith("-->") and len(line) > len(PYTORCH) + 10 for line in pytorch), pytorch


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


def inventory_pages(site: Path) -> dict[str, str]:
    """Each name the site documents, with the page that documents it (``reference/nn/``)."""
    header, _, body = site.joinpath("objects.inv").read_bytes().partition(b"zlib.\n")
    assert header.startswith(b"# Sphinx inventory version 2"), header[:40]
    pages: dict[str, str] = {}
    for line in zlib.decompress(body).decode().splitlines():
        name, _, _, uri, *_ = line.split(" ")
        pages.setdefault(name, uri.split("#", 1)[0])
    return pages


def reference_index_rows() -> dict[str, str]:
    """The reference index's table: each page it links (``nn.md``) and what its row says."""
    rows: dict[str, str] = {}
    for line in (DOCS / "reference" / "index.md").read_text(encoding="utf-8").splitlines():
        found = re.fullmatch(r"\| \[[^]]+\]\(([\w-]+\.md)\) \| (.+) \|", line)
        if found:
            rows[found[1]] = found[2]
    return rows


def nav_reference_pages() -> list[str]:
    """The pages of the API reference in mkdocs.yml's nav, but its index."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    return re.findall(r"^\s+- [^:\n]+: reference/([\w-]+\.md)$", text, re.MULTILINE)


def test_reference_index_lists_every_reference_page() -> None:
    """The index has a row for every page of the reference, in the nav's order, and the nav
    holds every page of docs/reference/."""
    pages = sorted(p.name for p in (DOCS / "reference").glob("*.md") if p.name != "index.md")
    assert sorted(nav_reference_pages()) == pages
    assert list(reference_index_rows()) == nav_reference_pages()


def test_reference_index_names_what_its_pages_document(site: Path) -> None:
    """Every name the index's row of a page gives (in backquotes) is documented on that page: a
    row names no object that moved or went away."""
    documented = inventory_pages(site)
    wrong = []
    for page, row in reference_index_rows().items():
        where = f"reference/{page.removesuffix('.md')}/"
        for name in re.findall(r"`([\w.]+)`", row):
            pages = {uri for full, uri in documented.items() if full == name or full.endswith(f".{name}")}
            if where not in pages:
                wrong.append(f"{page}: {name} (documented on {sorted(pages) or 'no page'})")
    assert not wrong, wrong


def test_reference_index_names_every_module_layer(site: Path) -> None:
    """The row of the modules' page names every class of ``monadl.nn`` (a new layer included)."""
    import monadl.nn

    row = reference_index_rows()["nn.md"]
    classes = [name for name in monadl.nn.__all__ if isinstance(getattr(monadl.nn, name), type)]
    unnamed = [name for name in classes if f"`{name}`" not in row and name not in ("Buffer", "BufferState")]
    assert not unnamed, unnamed


def _reference_pages(site: Path) -> dict[str, str]:
    return {
        path.parent.name: path.read_text(encoding="utf-8")
        for path in sorted(site.joinpath("reference").glob("*/index.html"))
    }


def test_reference_shows_each_overload_once(site: Path) -> None:
    """An overloaded function shows its overloads and not also the implementation's signature
    (which repeated them, merged)."""
    shown = 0
    for name, page in _reference_pages(site).items():
        for block in page.split('<div class="doc doc-object')[1:]:
            head, overloads, rest = block.partition('<div class="doc-overloads">')
            if not overloads:
                continue
            shown += 1
            listed, _, after = rest.partition("</div>          </div>")
            signatures = re.findall(r"<pre>(.*?)</pre>", listed, re.DOTALL)
            contents = after.split('<div class="doc doc-contents', 1)[0]
            assert "doc-signature" not in contents, f"{name}: {head[:200]}: the implementation's too"
            assert len(signatures) == len(set(signatures)) >= 2, f"{name}: {head[:200]}"
    assert shown > 30  # (the elementwise ops, reductions, losses, ...)


def test_reference_topics_stand_above_their_objects(site: Path) -> None:
    """A page's topics are h2 headings, the functions and classes under them h3 and their members
    h4: a topic is never the size of the objects it groups."""
    for name, page in _reference_pages(site).items():
        levels = re.findall(r'<h(\d) id="[^"]+" class="doc doc-heading"', page)
        assert levels and min(levels) >= "3", f"{name}: object headings at levels {sorted(set(levels))}"
    topics = re.findall(r'<h2 id="([^"]+)"', _reference_pages(site)["ops"])
    assert "reductions" in topics and "losses-and-probabilities" in topics
    css = (DOCS / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert ".md-typeset h2 {" in css and ".md-typeset h3.doc-heading" in css


def test_the_reliability_page_pins_its_counts_of_the_bad_input_table() -> None:
    """The bad-input table grows with the library: where the page counts its rows, it names the
    commit of that count, or the count is the table's now."""
    import test_bad_input_table

    rows = len(test_bad_input_table.ROWS)
    text = (DOCS / "reliability.md").read_text(encoding="utf-8")
    for paragraph in re.split(r"\n\s*\n", text):
        pinned = re.search(r"`[0-9a-f]{7,40}`", paragraph)
        for count in re.findall(r"(\d[\d,]*) (?:rows|tests)\b", paragraph):
            assert pinned or int(count.replace(",", "")) == rows, (
                f"reliability.md: {count} rows, not the table's {rows}, and no commit: {paragraph[:300]}"
            )


def test_files_the_docs_name_exist() -> None:
    """The examples, docs pages and tests the site's pages name are in the repository."""
    named = {
        (page.name, found)
        for page in DOCS.rglob("*.md")
        if page.name not in NOT_PROGRAMS
        for found in re.findall(
            r"`((?:examples|tests|docs)/[\w/.-]+\.(?:py|md))", page.read_text(encoding="utf-8")
        )
    }
    missing = sorted((page, path) for page, path in named if not (ROOT / path).exists())
    assert named and not missing, missing


def test_install_extras_named_in_the_docs_exist() -> None:
    """The extras the docs and the README tell users to install are pyproject.toml's, by their
    current names (``cuda12``/``cuda13``, not the older ``cuda``)."""
    import tomllib

    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "optional-dependencies"
        ]
    )
    assert {"cuda12", "cuda13"} <= extras
    named: dict[str, set[str]] = {}
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        if path.name in NOT_PROGRAMS or path.name == "changelog.md":
            continue
        text = path.read_text(encoding="utf-8")
        for found in re.findall(r"(?:\.|monadl|`)\[([\w,-]+)\]", text):
            for extra in found.split(","):
                named.setdefault(extra, set()).add(path.name)
    unknown = {extra: pages for extra, pages in named.items() if extra not in extras}
    assert not unknown, unknown
    recommended = {extra for extra, pages in named.items() if pages - {"gpu.md"}}
    assert "cuda" not in recommended, named["cuda"]


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
        ("from-pytorch/", "Coming from PyTorch", "The same model, side by side"),
        ("tutorials/transformer/", "A Transformer language model", "perplexity"),
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
