"""mypy --strict must accept every snippet in ``snippets/accept`` and reject every one in ``snippets/reject``.

In the manner of the ``returns`` project's typesafety tests: each rejected snippet is one mistake,
pinned to its message. A reject snippet holds

- ``# expect: <substring of the message>``, optionally ending in the error code, ``[operator]``;
  several ``# expect:`` lines all apply to the same error (to keep lines short);
- ``# error`` at the end of each line where mypy must report it.

It passes when mypy reports errors on exactly the marked lines, and on each marked line an error
whose message contains every expected substring and has the expected code. An accept snippet passes
when mypy reports no error in it (it states types with ``typing.assert_type``).

mypy runs once over all snippets (the module-scoped fixture); each snippet is one test case, so a new
file is a new case. The project's ``mypy.ini`` excludes the snippets directory, so ``mypy monadl
tests`` does not see the rejected ones; they are checked here only, by explicit path.
"""

from __future__ import annotations

import configparser
import contextlib
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from mypy import api

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CONFIG = ROOT / "mypy.ini"
SNIPPETS = HERE / "snippets"
ACCEPT = sorted((SNIPPETS / "accept").glob("*.py"))
REJECT = sorted((SNIPPETS / "reject").glob("*.py"))

# mypy's line format (no --pretty, no column numbers): "path:line: error: message  [code]"
REPORT = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<severity>error|note): (?P<message>.*)$")
MYPY_CODE = re.compile(r"^(?P<message>.*?)  \[(?P<code>[a-z][a-z0-9-]*)\]$")
EXPECT_CODE = re.compile(r"^(?P<message>(?:.*?\s)?)\[(?P<code>[a-z][a-z0-9-]*)\]$")
EXPECT = re.compile(r"#\s*expect:\s*(?P<text>.*?)\s*$")
MARK = re.compile(r"#\s*error\s*$")


@dataclass(frozen=True)
class Error:
    line: int
    message: str
    code: str | None

    def __str__(self) -> str:
        return f"{self.line}: {self.message}" + (f"  [{self.code}]" if self.code else "")


@dataclass(frozen=True)
class MypyRun:
    errors: dict[Path, list[Error]]
    output: str


def split_code(text: str, pattern: re.Pattern[str]) -> tuple[str, str | None]:
    """``"message [code]"`` as ``("message", "code")``; ``(text, None)`` without a code."""
    m = pattern.match(text)
    if m is None:
        return text, None
    return m["message"].rstrip(), m["code"]


def parse(output: str) -> dict[Path, list[Error]]:
    """The errors of mypy's report, by resolved file path (notes are left out)."""
    errors: dict[Path, list[Error]] = defaultdict(list)
    for line in output.splitlines():
        m = REPORT.match(line)
        if m is None or m["severity"] != "error":
            continue
        message, code = split_code(m["message"], MYPY_CODE)
        errors[Path(m["path"]).resolve()].append(Error(int(m["line"]), message, code))
    return dict(errors)


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> MypyRun:
    """One mypy --strict run over all snippets, with the project's configuration and a fresh cache."""
    cache = tmp_path_factory.mktemp("mypy_cache")
    args = [
        "--strict",
        "--config-file",
        str(CONFIG),
        "--cache-dir",
        str(cache),
        "--show-absolute-path",
        "--show-error-codes",
        "--no-pretty",
        "--no-color-output",
        "--no-error-summary",
        *(str(p) for p in ACCEPT + REJECT),
    ]
    with contextlib.chdir(ROOT):  # so that `import monadl` finds this checkout
        stdout, stderr, status = api.run(args)
    assert status in (0, 1) and not stderr, f"mypy failed to run (status {status}):\n{stdout}\n{stderr}"
    return MypyRun(parse(stdout), stdout)


def expectations(path: Path) -> tuple[list[str], str | None, set[int]]:
    """A reject snippet's expected substrings, expected code, and marked lines."""
    lines = path.read_text().splitlines()
    substrings: list[str] = []
    codes: set[str] = set()
    for line in lines:
        m = EXPECT.search(line)
        if m is None:
            continue
        text, code = split_code(m["text"], EXPECT_CODE)
        if code is not None:
            codes.add(code)
        if text:
            substrings.append(text)
    marked = {n for n, line in enumerate(lines, start=1) if MARK.search(line)}
    assert substrings, f"{path.name}: no '# expect: <message>' line"
    assert len(codes) <= 1, f"{path.name}: several expected codes {sorted(codes)}"
    assert marked, f"{path.name}: no line marked '# error'"
    return substrings, (codes.pop() if codes else None), marked


def test_snippets_are_found() -> None:
    assert len(ACCEPT) >= 5 and len(REJECT) >= 10, (ACCEPT, REJECT)


def test_snippet_module_names_are_unique() -> None:
    """mypy names a file outside a package after its stem: two equal stems stop the whole run."""
    stems = [p.stem for p in ACCEPT + REJECT]
    assert len(stems) == len(set(stems)), sorted(s for s in stems if stems.count(s) > 1)


def test_project_mypy_config_excludes_snippets() -> None:
    """`mypy monadl examples tests` must not check the snippets (the rejected ones do not type-check)."""
    config = configparser.ConfigParser()
    config.read(CONFIG)
    exclude = re.compile(config["mypy"]["exclude"])
    for path in ACCEPT + REJECT:
        assert exclude.search(path.relative_to(ROOT).as_posix()), path


def test_no_errors_outside_snippets(mypy_run: MypyRun) -> None:
    """The library itself type-checks under the same run (else snippet results mean little)."""
    snippets = set(ACCEPT + REJECT)
    elsewhere = {p: e for p, e in mypy_run.errors.items() if p not in snippets}
    assert not elsewhere, mypy_run.output


@pytest.mark.parametrize("path", ACCEPT, ids=[p.stem for p in ACCEPT])
def test_accepted(path: Path, mypy_run: MypyRun) -> None:
    text = path.read_text()
    assert not EXPECT.search(text) and not any(MARK.search(line) for line in text.splitlines()), (
        f"{path.name}: an accept snippet has '# expect:' or '# error' marks"
    )
    errors = mypy_run.errors.get(path, [])
    assert not errors, f"mypy rejected {path.name}:\n" + "\n".join(map(str, errors))


@pytest.mark.parametrize("path", REJECT, ids=[p.stem for p in REJECT])
def test_rejected(path: Path, mypy_run: MypyRun) -> None:
    substrings, code, marked = expectations(path)
    errors = mypy_run.errors.get(path, [])
    report = "\n".join(map(str, errors)) or "(no errors)"
    assert errors, f"mypy accepted {path.name}, expected: {substrings} [{code}] on lines {sorted(marked)}"
    stray = [e for e in errors if e.line not in marked]
    assert not stray, f"{path.name}: errors on lines not marked '# error':\n{report}"
    for line in sorted(marked):
        assert any(
            e.line == line and all(s in e.message for s in substrings) and code in (None, e.code)
            for e in errors
        ), f"{path.name}:{line}: no error containing {substrings} [{code}]; mypy reported:\n{report}"
