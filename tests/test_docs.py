"""The README and the docs state what the code does; the docs build without a warning.

Each check runs or parses the thing the docs describe rather than looking for a string:
CI's own extraction of the README's test command, tox's configuration as tox reads it
(an INI file), the package's declared requirements, the commands' ``--help``, and the
errors and log lines the docs show as samples, produced for real.
"""

from __future__ import annotations

import configparser
import hashlib
import importlib.metadata
import re
import shlex
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.version import Version

from celery_fair.cli import fair, main
from celery_fair.config import SETTINGS, FairConfig, settings_table
from celery_fair.errors import ConfigurationError

from .components import components_table

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
DOCS = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md")}


def _between(marker: str) -> str:
    start = README.index(f"<!-- {marker} -->") + len(f"<!-- {marker} -->")
    return README[start:README.index(f"<!-- /{marker} -->")].strip()


def _blocks(text: str, after: str) -> list[str]:
    """The fenced code blocks of ``text`` that follow the first line containing ``after``."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text[text.index(after):], re.M | re.S)


def test_readme_settings_table_is_generated_from_the_code():
    assert _between("settings-table") == settings_table()


def test_ci_runs_the_readme_test_command_on_the_whole_suite():
    # CI's own extraction, run as CI runs it: the line of .ci/run that sets `cmd`.
    [extract] = [line for line in CI.splitlines() if line.startswith("cmd=$(")]
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", f'{extract}\nprintf %s "$cmd"'],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip()
    assert command == "\n".join(_blocks(_between("test-command"), "")).strip()
    # ... and CI then runs exactly that, under bash.
    assert any(shlex.split(line)[:2] == ["bash", "-euo"] and line.endswith('"$cmd"')
               for line in CI.splitlines() if line.strip().startswith("bash "))
    # The command makes a venv, installs the package with its test extra, and runs pytest
    # in that venv with no selection: the whole suite (pyproject's testpaths), in two
    # xdist processes that each take whole files.
    steps = [shlex.split(step) for step in command.split("&&")]
    assert steps[0][:3] == ["python3", "-m", "venv"]
    venv = steps[0][3]
    install = next(s for s in steps if "install" in s)
    assert install[0] == f"{venv}/bin/pip" and "-e" in install and ".[test]" in install
    assert steps[-1] == [f"{venv}/bin/python", "-m", "pytest", "-n", "2", "--dist", "loadfile"]


def _tox() -> configparser.ConfigParser:
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    return tox


def _tox_deps(tox: configparser.ConfigParser) -> dict[str, list[Requirement]]:
    """``deps`` of [testenv] by factor (``celery53: celery[redis]>=5.3,<5.4``), as tox
    reads factor-conditional lines."""
    deps: dict[str, list[Requirement]] = {}
    for line in tox["testenv"]["deps"].strip().splitlines():
        factor, _, requirement = line.strip().partition(":")
        deps.setdefault(factor.strip(), []).append(Requirement(requirement.strip()))
    return deps


def _celery_minors(requirement: Requirement) -> list[int]:
    return [m for m in range(0, 20) if Version(f"5.{m}.0") in requirement.specifier]


def test_tox_has_an_env_per_supported_celery_minor_pinned_to_it():
    tox = _tox()
    envs = [e.strip() for e in tox["tox"]["envlist"].split(",")]
    deps = _tox_deps(tox)
    [declared] = [Requirement(r) for r in importlib.metadata.requires("celery-fair") or []
                  if Requirement(r).name == "celery" and not Requirement(r).marker]
    supported = _celery_minors(declared)
    celery_envs = [e for e in envs if e.startswith("celery")]
    pinned = {}
    for env in celery_envs:
        [celery] = [r for r in deps[env] if r.name == "celery"]
        assert "redis" in celery.extras
        [minor] = _celery_minors(celery)  # each env pins exactly one minor version
        assert env == f"celery5{minor}"
        pinned[minor] = env
    # From the oldest supported minor to the one this suite runs on, none skipped.
    running = Version(importlib.metadata.version("celery")).minor
    assert sorted(pinned) == list(range(supported[0], running + 1))
    assert set(pinned) <= set(supported)
    for env in ("lint", "type", "docs"):
        assert f"testenv:{env}" in tox and env in envs


def test_ci_runs_the_oldest_supported_celery_with_tox_pins():
    deps = _tox_deps(_tox())
    oldest = min((e for e in deps if e.startswith("celery")), key=lambda e: int(e[6:]))
    installs = [shlex.split(line.strip()) for line in CI.splitlines()
                if "/bin/pip" in line and "install" in line and "celery" in line]
    [args] = installs
    installed = {str(Requirement(a)) for a in args if re.match(r"^[a-z]", a) and ">=" in a}
    assert installed == {str(r) for r in deps[oldest]}


#: ``celery -A proj fair COMMAND ARGS...`` as the docs write it (ARGS: words, options, [...]).
DOCUMENTED = re.compile(r"celery -A \w+ fair (\w+)((?: [\[\]\w.,-]+)*)")


def _documented_options() -> set[tuple[str, str]]:
    found = set()
    for text in (README, *DOCS.values()):
        for command, rest in DOCUMENTED.findall(text):
            found.update((command, opt) for opt in re.findall(r"--[\w-]+", rest))
    return found


def test_documented_cli_options_exist(app: Celery):
    documented = _documented_options()
    assert ("limit", "--concurrency") in documented and ("status", "--json") in documented
    obj = CLIContext(app=app, no_color=True, workdir=None)
    for command, option in sorted(documented):
        result = CliRunner().invoke(fair, [command, "--help"], obj=obj)
        assert result.exit_code == 0, (command, result.output)
        assert re.search(rf"(^|[\s,]){re.escape(option)}\b", result.output), (command, option)
    demo = CliRunner().invoke(main, ["demo", "--help"]).output
    for option in set(re.findall(r"celery-fair demo((?: --[\w-]+(?: [\w.]+)?)*)",
                                 "\n".join((README, *DOCS.values())))):
        for name in re.findall(r"--[\w-]+", option):
            assert name in demo, name


def test_the_settings_page_sample_error_is_the_real_error(redis_server: Any):
    code, shown = _blocks(DOCS["settings.md"], "an unknown `fair_*` key is an error")[:2]
    app = Celery("sample", broker=redis_server.url, set_as_current=False)
    exec(compile(code, "settings.md", "exec"), {"app": app})
    with pytest.raises(ConfigurationError) as info:
        FairConfig.from_app(app)
    real = f"{type(info.value).__module__}.{type(info.value).__name__}: {info.value}"
    assert " ".join(real.split()) == " ".join(shown.split())


@pytest.fixture(scope="module")
def built_docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # What `tox -e docs` runs: any warning (a broken reference, a bad docstring, a page in
    # no toctree, a setting linked that the code does not have) fails the build.
    tmp = tmp_path_factory.mktemp("docs")
    out = tmp / "html"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp / "doctrees"), str(ROOT / "docs"), str(out)],
        capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def test_docs_build_with_warnings_as_errors(built_docs: Path):
    out = built_docs
    # The reference pages are generated from the code: every setting and every command.
    settings = (out / "settings.html").read_text(encoding="utf-8")
    assert all(f'id="confval-{s.name}"' in settings for s in SETTINGS)
    cli = (out / "cli.html").read_text(encoding="utf-8")
    for group, section in ((fair, "celery-a-proj-fair"), (main, "celery-fair")):
        assert all(f'<section id="{section}-{name}"' in cli for name in group.commands)


class _Resources(HTMLParser):
    """What a page loads: script and stylesheet URLs, and what its module scripts import."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self.imports: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "script":
            self._in_script = True
            if found.get("src"):
                self.scripts.append(str(found["src"]))
        elif tag == "link" and "stylesheet" in str(found.get("rel")):
            self.styles.append(str(found.get("href")))

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.imports += re.findall(r"""\bimport\b[^;'"]*?\bfrom\s*['"]([^'"]+)""", data)


def test_docs_load_nothing_from_the_network_and_draw_mermaid_locally(built_docs: Path):
    # Offline, a page that fetched a script or stylesheet from a CDN would be broken.
    diagrams = []
    for page in sorted(built_docs.rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        found = _Resources()
        found.feed(html)
        remote = [url for url in found.scripts + found.styles + found.imports
                  if re.match(r"(https?:)?//", url)]
        assert not remote, (page.name, remote)
        if re.search(r'<pre\s+class="mermaid', html):
            diagrams.append(page.name)
            assert found.imports == ["./_static/mermaid/mermaid.mjs"], found.imports
        if found.imports:
            # The vendored Mermaid, ahead of the module sphinxcontrib-mermaid imports it from.
            local = [src.split("?")[0] for src in found.scripts]
            assert "_static/mermaid/mermaid.min.js" in local, (page.name, found.scripts)
            for url in ("_static/mermaid/mermaid.min.js", "_static/mermaid/mermaid.mjs"):
                assert (page.parent / url).is_file(), url
    assert "how-it-works.html" in diagrams
    # The copy is the version conf.py and SOURCE.txt name.
    static = ROOT / "docs" / "_static" / "mermaid"
    conf = (ROOT / "docs" / "conf.py").read_text(encoding="utf-8")
    [version] = re.findall(r'^mermaid_version = "([\d.]+)"', conf, re.M)
    assert (static / "SOURCE.txt").read_text(encoding="utf-8").startswith(f"Mermaid {version},")
    digest = hashlib.sha256((static / "mermaid.min.js").read_bytes()).hexdigest()
    assert f"sha256 {digest}" in (static / "SOURCE.txt").read_text(encoding="utf-8")


#: Tooling of the tests and the docs, which an installation of the example must not pull in.
TOOLING = {"pytest", "playwright", "sphinx", "furo", "myst-parser", "hypothesis", "psycopg",
           "pytest-timeout", "pytest-celery", "sphinx-click", "sphinxcontrib-mermaid"}


def _closure(name: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """The distributions ``pip install name[extras]`` installs (as installed here)."""
    seen: set[str] = set()
    todo = [(name, extras)]
    while todo:
        dist, wanted = todo.pop()
        key = dist.lower().replace("_", "-")
        if key in seen and not wanted:
            continue
        seen.add(key)
        for line in importlib.metadata.requires(dist) or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e})
                                         for e in wanted | {""}):
                todo.append((req.name, frozenset(req.extras)))
    return seen


def test_the_example_extra_installs_what_the_example_imports_and_no_tooling():
    installs = _closure("celery-fair", frozenset({"example"}))
    assert not installs & TOOLING, installs & TOOLING
    # Everything example_project/ imports comes with it (or with Python).
    import ast

    provided = importlib.metadata.packages_distributions()
    local = {p.name for p in (ROOT / "example_project").iterdir()} | {"celery_fair"}
    for source in (ROOT / "example_project").rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and not node.level
                     and node.module else [])
            for top in {n.split(".")[0] for n in names} - local - set(sys.stdlib_module_names):
                dists = {d.lower() for d in provided.get(top, [])}
                assert dists & installs, (source.name, top, dists)
    readme = (ROOT / "example_project" / "README.md").read_text(encoding="utf-8")
    assert 'pip install -e "..[example]"' in readme


def test_readme_lists_the_components_the_suite_needs():
    # Generated from tests/components.py, whose components the tests require.
    assert _between("components") == components_table()
