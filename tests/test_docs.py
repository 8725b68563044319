"""The docs stay true (issue 37, item 8): README.md and docs/*.md name no ``make`` target the
Makefile lacks, no file or folder of this repository that does not exist, and no command-line
flag the command's argparse parser does not know.

What is checked, in code spans, fenced code blocks and Markdown links:

- ``make TARGET`` (and ``make -C DIR TARGET``): TARGET is a rule of the Makefile. ``VAR=value``
  words after it are fine.
- Paths: a word whose first part is a top-level entry of the repository (``peercache/...``,
  ``experiments/...``, ``docs/...``, ``Makefile``...) must exist; so must a relative path ending in
  a source-like file name or ``/`` (``tools/nixl.py``, ``launch/guest/``: found as the tail of a
  path of the repository), a bare source file name (``local.yaml``: some file of the repository has
  that name), and a relative Markdown link (from the document's folder; its ``#anchor`` must be a
  heading of the target). Globs (``*``) and braces (``{a,b}``) must match something. Not checked:
  what runs produce (``data/raw/``, ``data/tidy/``, ``results/``, ``reports/``, ``figures/<run>``
  of a run not in the repository), ``.venv*``, absolute and home paths, URLs, and words with a
  ``<placeholder>``.
- Flags: after ``peercache-bench serve|drive|meta``, ``peercache-lab SUBCOMMAND`` or
  ``python -m peercache.MODULE [SUBCOMMAND]`` in a code span or a block line (``\\``-continued),
  every ``-x`` / ``--flag`` up to the end of the command (``|``, ``;``, ``&&``, ``&``, ``#``, ``--``)
  is an option of that command's parser, and a subcommand word is one the parser has. The parsers
  are built in-process: ``peercache.bench.cli.build_parser()``, ``peercache.lab.cli.build_parser()``,
  and for ``python -m`` the parser the module's ``__main__`` code builds (captured at its
  ``parse_args``, before it does anything).

Each failure names the document, the line and what is missing. ``test_checks_fire`` runs every
check on a made-up document with a bogus target, file, link, anchor, flag and subcommand.
"""
from __future__ import annotations

import argparse
import fnmatch
import functools
import os
import re
import runpy
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Paths that runs write (never in the repository): not checked.
RUN_OUTPUTS = ("data/raw/", "data/tidy/", "results/", "reports/", "build/", ".venv")
#: Other projects' paths the docs cite (SGLang's sources): not checked.
FOREIGN = ("sglang/",)
#: File name endings that mark a relative path (``tools/nixl.py``) as one of this repository.
SOURCE_EXT = (".py", ".c", ".h", ".ipynb", ".yaml", ".yml", ".toml", ".smk", ".sh", ".md", ".png",
              ".svg", ".csv", ".json")
#: ... and a bare file name (``local.yaml``); not .md, .json or .csv, which runs write too (report.md).
BARE_EXT = (".py", ".c", ".h", ".ipynb", ".yaml", ".yml", ".toml", ".smk", ".sh")
#: A duration: "9 min 34 s", "about 11 minutes", "took 402", "in about 460 s".
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s*(?:min(?:utes?)?|s|seconds?|hours?|h)\b(?!/)"
                    r"|\b(?:took|takes|in about)\s+\d")


# --- the repository ---------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def repo_files() -> tuple[str, ...]:
    """Every file of the working tree that git tracks or would track (others' new files too)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             cwd=ROOT, capture_output=True, check=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return tuple(sorted(f for f in files if (ROOT / f).exists()))


@functools.lru_cache(maxsize=None)
def repo_dirs() -> frozenset[str]:
    dirs = set()
    for f in repo_files():
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return frozenset(dirs)


@functools.lru_cache(maxsize=None)
def top_level() -> frozenset[str]:
    return frozenset(f.split("/")[0] for f in repo_files())


@functools.lru_cache(maxsize=None)
def make_targets(makefile: Path = ROOT / "Makefile") -> frozenset[str]:
    """The targets the Makefile defines (rules and .PHONY names; pattern and variable targets left out)."""
    targets = set()
    for line in makefile.read_text().splitlines():
        if line.startswith(("\t", "#", " ")):
            continue
        m = re.match(r"([^:=#]+?)\s*::?(?![=])(.*)", line)
        if not m:
            continue
        names = m.group(1).split()
        if names == [".PHONY"]:
            targets.update(m.group(2).split())
            continue
        targets.update(n for n in names if "$" not in n and "%" not in n)
    return frozenset(targets)


def headings_anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    anchors, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda x: x.group(1) or "", m.group(1)).lower()
            anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


# --- the documents ----------------------------------------------------------------

@dataclass
class Code:
    line: int      #: the line of the document where this piece starts
    text: str      #: a code span's text, or one logical line of a code block (continuations joined)
    block: bool


def code_pieces(text: str) -> list[Code]:
    """Inline code spans and the logical lines of fenced code blocks, with their line numbers."""
    pieces: list[Code] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"\s*(```+|~~~+)", line)
        if fence:
            j, buf, start = i + 1, "", None
            while j < len(lines) and not lines[j].lstrip().startswith(fence.group(1)):
                cur = lines[j]
                if start is None:
                    start = j + 1
                if cur.rstrip().endswith("\\"):
                    buf += cur.rstrip()[:-1] + " "
                else:
                    pieces.append(Code(start, buf + cur, True))
                    buf, start = "", None
                j += 1
            if buf:
                pieces.append(Code(start or j, buf, True))
            i = j + 1
            continue
        # Spans may run over a line break (a paragraph's soft wrap): join the paragraph's lines.
        para_start, para = i, [line]
        while i + 1 < len(lines) and lines[i + 1].strip() and not re.match(r"\s*(```|~~~)", lines[i + 1]):
            i += 1
            para.append(lines[i])
        joined = "\n".join(para)
        for m in re.finditer(r"(`+)(.+?)\1", joined, re.S):
            pieces.append(Code(para_start + joined.count("\n", 0, m.start()) + 1,
                               m.group(2).replace("\n", " ").strip(), False))
        i += 1
    return pieces


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline Markdown link outside code."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        out += [(n, m.group(1)) for m in re.finditer(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line)]
    return out


# --- checks -----------------------------------------------------------------------

def check_make(doc: str, pieces: list[Code], targets: frozenset[str]) -> list[str]:
    errors = []
    for p in pieces:
        for m in re.finditer(r"(?:^|[\s;&|(`])make((?:\s+-C\s+\S+)?(?:\s+[\w.\-/=:$(){}'\"]+)*)", p.text):
            for word in m.group(1).split():
                if word == "-C" or "=" in word or word.startswith("-"):
                    continue
                if re.fullmatch(r"[A-Za-z][\w.\-]*", word) and word not in targets:
                    errors.append(f"{doc}:{p.line}: `make {word}`: the Makefile has no target '{word}'")
                break
    return errors


def _expand_braces(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",")
            for x in _expand_braces(path[:m.start()] + alt + path[m.end():])]


def _exists_repo_path(path: str) -> bool:
    """A root-relative path (glob and braces allowed) names a file or folder of the repository."""
    path = path.rstrip("/")
    files, dirs = repo_files(), repo_dirs()
    for alt in _expand_braces(path):
        if any(c in alt for c in "*?["):
            if not (fnmatch.filter(files, alt) or fnmatch.filter(dirs, alt)):
                return False
        elif alt not in dirs and alt not in files and not (ROOT / alt).exists():
            return False
    return True


def _exists_tail(path: str) -> bool:
    """A relative path names the tail of a path of the repository (``tools/nixl.py``, ``launch/guest/``)."""
    tail = path.rstrip("/")
    for alt in _expand_braces(tail):
        pat = alt if any(c in alt for c in "*?[") else None
        candidates = repo_dirs() if path.endswith("/") else repo_files()
        if pat:
            ok = any(fnmatch.fnmatch(c, "*/" + pat) or fnmatch.fnmatch(c, pat) for c in (*repo_files(), *repo_dirs()))
        else:
            ok = any(c == alt or c.endswith("/" + alt) for c in candidates)
        if not ok:
            return False
    return True


def path_problem(word: str) -> str | None:
    """Why a word that looks like a path of this repository names nothing here (None: fine or not a path)."""
    word = word.strip("\"'`,;()[]")
    if "=" in word:                                   # TESTBED=experiments/..., --out=path
        word = word.split("=", 1)[1].strip("\"'")
    word = re.sub(r"#.*$", "", word)                  # an anchor
    word = re.sub(r":\d+(-\d+)?$", "", word)          # file:line
    if (not word or "://" in word or any(c in word for c in "<>$~@%") or word.startswith(("/", "-", "."))
            and not word.startswith(("./", ".ci", ".gitignore"))):
        return None
    word = word.removeprefix("./")
    if word.startswith(RUN_OUTPUTS + FOREIGN) or word in {r.rstrip("/") for r in RUN_OUTPUTS}:
        return None
    first = word.split("/", 1)[0]
    if first == "figures" and "/" in word:
        run = word.split("/")[1]
        if not _exists_repo_path("figures/" + run):   # figures/<run> of a run: written by make run
            return None
    if not re.fullmatch(r"[\w.\-/*{},?]+", word):
        return None
    if first in top_level() and ("/" in word or word == first):
        return None if _exists_repo_path(word) else "no such file or folder in this repository"
    if "/" in word:
        if word.endswith("/") or word.endswith(SOURCE_EXT):
            if re.fullmatch(r"[\d./]+", word.rstrip("/")):
                return None
            return None if _exists_tail(word) else "no file or folder of this repository ends so"
        return None
    if word.endswith(BARE_EXT) and not any(c in word for c in "*{"):
        return None if any(f.rsplit("/", 1)[-1] == word for f in repo_files()) else \
            "no file of this repository has this name"
    return None


def check_paths(doc: str, doc_dir: Path, pieces: list[Code], doc_links: list[tuple[int, str]]) -> list[str]:
    errors = []
    for p in pieces:
        for word in p.text.replace("\\|", " ").split():
            why = path_problem(word)
            if why:
                errors.append(f"{doc}:{p.line}: `{word}`: {why}")
    for line, target in doc_links:
        if re.match(r"[a-z][\w+.-]*:", target) or target.startswith("//"):
            continue                                  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        path = (doc_dir / file).resolve() if file else None
        if path is not None:
            try:
                rel = path.relative_to(ROOT).as_posix()
            except ValueError:
                errors.append(f"{doc}:{line}: link ({target}): outside the repository")
                continue
            if not path.exists():
                errors.append(f"{doc}:{line}: link ({target}): {rel} does not exist")
                continue
        target_file = path if path is not None else None
        if anchor and (target_file is None or target_file.suffix == ".md"):
            anchors = headings_anchors(target_file) if target_file else None
            if anchors is not None and anchor not in anchors:
                errors.append(f"{doc}:{line}: link ({target}): no heading '#{anchor}' in "
                              f"{target_file.relative_to(ROOT).as_posix()}")
    return errors


def check_self_anchors(doc: str, doc_path: Path | None, text: str, doc_links) -> list[str]:
    """Links to '#anchor' in the same document."""
    if doc_path is None:
        return []
    anchors = None
    errors = []
    for line, target in doc_links:
        if target.startswith("#"):
            if anchors is None:
                anchors = headings_anchors(doc_path)
            if target[1:] not in anchors:
                errors.append(f"{doc}:{line}: link ({target}): no such heading in this document")
    return errors


# --- the commands' parsers ---------------------------------------------------------

class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


@functools.lru_cache(maxsize=None)
def module_parser(module: str) -> argparse.ArgumentParser | str:
    """The parser ``python -m MODULE`` builds (captured when its code first parses), or why there is none."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return f"no module {module}"

    def capture(self, args=None, namespace=None):
        raise _Captured(self)

    saved_argv, saved = sys.argv[:], argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = capture
    sys.argv = [module]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # runpy: the module is imported already
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except _Captured as c:
        return c.parser
    except SystemExit:
        return f"{module} exits without parsing its arguments"
    finally:
        argparse.ArgumentParser.parse_known_args = saved
        sys.argv = saved_argv
    return f"{module} parses no arguments"


def _bench_parser():
    from peercache.bench.cli import build_parser
    return build_parser()


def _lab_parser():
    from peercache.lab.cli import build_parser
    return build_parser()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return None


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


COMMAND = re.compile(r"(?:^|[\s;&|(`])(?:(peercache-bench|peercache-lab)|(?:\S*/)?python3?\s+(?:-\w+\s+)*-m\s+"
                     r"(peercache(?:\.\w+)*))(?=\s|$)")
SHELL_END = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", ")", "--"}


def check_flags(doc: str, pieces: list[Code], parser_for) -> list[str]:
    """Flags and subcommands after a known command; ``parser_for(name)`` gives its parser or why none."""
    errors = []
    for p in pieces:
        text = p.text.replace("\\|", "|")
        for m in COMMAND.finditer(text):
            name = m.group(1) or m.group(2)
            parser = parser_for(name)
            if isinstance(parser, str):
                errors.append(f"{doc}:{p.line}: `python -m {name}`: {parser}")
                continue
            try:
                words = shlex.split(text[m.end():], comments=True)
            except ValueError:
                words = text[m.end():].split()
            label = name if m.group(1) else f"python -m {name}"
            subs = _subparsers(parser)
            checked_sub = False
            for w in words:
                if w in SHELL_END or w.startswith((">", "<")) or w.endswith(";"):
                    break
                w = w.strip("[]")
                if w.startswith("-") and len(w) > 1 and not re.match(r"-\d", w):
                    flag = w.split("=", 1)[0]
                    if flag not in _options(parser):
                        errors.append(f"{doc}:{p.line}: `{label} ... {flag}`: {label} has no option {flag}")
                elif subs is not None and not checked_sub:
                    checked_sub = True
                    if re.fullmatch(r"[\w\-|]+", w) and not set(w.split("|")) <= set(subs):
                        bad = ", ".join(s for s in w.split("|") if s not in subs)
                        errors.append(f"{doc}:{p.line}: `{label} {w}`: {label} has no subcommand {bad} "
                                      f"(it has {', '.join(sorted(subs))})")
                        break
                    if w in subs:
                        label, parser = f"{label} {w}", subs[w]
                        subs = _subparsers(parser)
                        checked_sub = False
                    elif "|" in w:                     # 'parse perftest|perfstat|iperf3': the choices' union
                        break
    return errors


def _all_options(parser: argparse.ArgumentParser) -> set[str]:
    """A parser's options and those of all its subcommands."""
    return _options(parser).union(*(_all_options(p) for p in (_subparsers(parser) or {}).values()))


#: Pages about our own commands: a code span that is a bare flag (`--tcp-poll-us US`) names an option
#: of these commands (any of their subcommands).
BARE_FLAG_COMMANDS = {
    "README.md": ("peercache-bench",),
    "docs/architecture.md": ("peercache-bench",),
    "docs/bench.md": ("peercache-bench",),
    "docs/directory.md": ("peercache-bench",),
    "docs/metrics.md": ("peercache-bench",),
    "docs/security.md": ("peercache-bench",),
    "docs/hicache.md": ("peercache-bench", "peercache.bench.hicache_drive"),
}


def check_bare_flags(doc: str, pieces: list[Code], commands, parser_for) -> list[str]:
    if not commands:
        return []
    known: set[str] = set()
    for c in commands:
        parser = parser_for(c)
        if not isinstance(parser, str):
            known |= _all_options(parser)
    errors = []
    for p in pieces:
        m = re.match(r"(--[A-Za-z][\w-]*)", p.text)
        if not p.block and m and m.group(1) not in known:
            errors.append(f"{doc}:{p.line}: `{p.text}`: {m.group(1)} is no option of "
                          f"{' or '.join(commands)}")
    return errors


def default_parser_for(name: str):
    if name == "peercache-bench":
        return _bench_parser()
    if name == "peercache-lab":
        return _lab_parser()
    return module_parser(name)


# --- the tests ----------------------------------------------------------------------

def check_doc(doc: str, text: str, doc_path: Path | None, targets=None, parser_for=default_parser_for) -> list[str]:
    pieces = code_pieces(text)
    doc_links = links(text)
    doc_dir = doc_path.parent if doc_path else ROOT / "docs"
    return (check_make(doc, pieces, targets if targets is not None else make_targets())
            + check_paths(doc, doc_dir, pieces, doc_links)
            + check_self_anchors(doc, doc_path, text, doc_links)
            + check_flags(doc, pieces, parser_for)
            + check_bare_flags(doc, pieces, BARE_FLAG_COMMANDS.get(doc, ()), parser_for))


@pytest.mark.parametrize("path", DOCS, ids=[p.relative_to(ROOT).as_posix() for p in DOCS])
def test_doc_names_only_what_exists(path: Path):
    errors = check_doc(path.relative_to(ROOT).as_posix(), path.read_text(), path)
    assert not errors, "\n".join(errors)


def test_readme_has_no_timings():
    """Timings go stale: they belong in docs/, beside the command and revision that measured them."""
    found = [f"README.md:{n}: {m.group(0)!r}" for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
             for m in TIMING.finditer(line)]
    assert not found, "the README carries timings:\n" + "\n".join(found)


def test_checks_fire(tmp_path):
    """Each check fails on a made-up document that names a bogus target, file, link, flag and subcommand."""
    (tmp_path / "Makefile").write_text(".PHONY: run test\nrun: setup\n\techo\n$(VENV)/.x: a\n\tb\n")
    targets = make_targets(tmp_path / "Makefile")
    assert {"run", "test", "setup"} - targets == {"setup"} and "$(VENV)/.x" not in targets
    text = "\n".join([
        "# Title",
        "Run `make run TESTBED=experiments/testbeds/local.yaml` then `make frobnicate`.",  # 2
        "See `experiments/testbeds/nonesuch.yaml` and `peercache/lab/nowhere/` and `local.yaml`.",  # 3
        "A renamed module: `tools/promscrape_old.py`; `data/raw/local/x/rep0/`, `data/tidy`, `sglang/srt/x.py` are fine.",  # 4
        "[ok](architecture.md#transports) [gone](missing.md) [bad anchor](bench.md#no-such-heading) [here](#title)",  # 5
        "```",
        "peercache-bench drive --discovery-addr 127.0.0.1:1 --no-such-flag 3 \\",  # 7
        "    --batch-size 32 | tee out",
        "python -m peercache.lab.pipeline validate --testbed FILE --connnect",  # 9
        "python -m peercache.lab.pipeline frobnicate --testbed FILE",  # 10
        "```",
        "`peercache-lab compare A B --tolerans 0.1` and `python -m peercache.lab.nonesuch --x`.",  # 12
        "`peercache-bench serve --readers 1 -- --not-ours`, `peercache-lab parse perftest|perfstat FILE`",  # 13
    ])
    text += "\nOptions: `--integrity`, `--tcp-poll-us US`, `--max-calls`, `--integrety`.\n"  # 14
    BARE_FLAG_COMMANDS["synthetic.md"] = ("peercache-bench",)
    try:
        errors = check_doc("synthetic.md", text, None, targets=targets)
    finally:
        del BARE_FLAG_COMMANDS["synthetic.md"]
    want = [
        "synthetic.md:2: `make frobnicate`",
        "synthetic.md:3: `experiments/testbeds/nonesuch.yaml`",
        "synthetic.md:3: `peercache/lab/nowhere/`",
        "synthetic.md:4: `tools/promscrape_old.py`",
        "synthetic.md:5: link (missing.md)",
        "synthetic.md:5: link (bench.md#no-such-heading)",
        "synthetic.md:7: `peercache-bench drive ... --no-such-flag`",
        "synthetic.md:9: `python -m peercache.lab.pipeline validate ... --connnect`",
        "synthetic.md:10: `python -m peercache.lab.pipeline frobnicate`",
        "synthetic.md:12: `peercache-lab compare ... --tolerans`",
        "synthetic.md:12: `python -m peercache.lab.nonesuch`",
        "synthetic.md:14: `--max-calls`",      # hicache_drive suite's, not peercache-bench's
        "synthetic.md:14: `--integrety`",
    ]
    for w in want:
        assert any(e.startswith(w) for e in errors), f"no error {w!r} in:\n" + "\n".join(errors)
    assert len(errors) == len(want), "\n".join(errors)
    # Each message names what is missing.
    assert any("has no option --no-such-flag" in e for e in errors)
    assert any("no heading '#no-such-heading' in docs/bench.md" in e for e in errors)
    assert any("has no target 'frobnicate'" in e for e in errors)
    # A link to a heading of the same document is checked against its headings.
    (tmp_path / "d.md").write_text("# Only\n[x](#other) [y](#only)\n")
    assert check_doc("d.md", (tmp_path / "d.md").read_text(), tmp_path / "d.md", targets=targets) == \
        ["d.md:2: link (#other): no such heading in this document"]


def test_readme_timing_check_fires():
    pattern_hits = [bool(TIMING.search(s))
                    for s in ("about 9 minutes", "9 min 34 s", "took 12 s", "in about 460 s", "10 GB/s", "128 KiB")]
    assert pattern_hits == [True, True, True, True, False, False]
