"""The README and docs/ against the code: a short README that links every page, links that
resolve, `reproci` command lines that the CLI would accept, and the README's two
fresh-machine commands intact. No training runs: it reads files and click's command objects."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from reproci import errors, verdicts
from reproci.cli import cli
from tests.helpers import params_of

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 200

RUN_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install -c constraints-dev.txt -e . "
               "&& .venv/bin/reproci run")
TEST_COMMAND = ("python3 -m venv .venv && .venv/bin/pip install -c constraints-dev.txt -e '.[test]' "
                "&& .venv/bin/python -m pytest -n auto --dist loadgroup")

SHELL_LANGS = {"bash", "console", "sh", "shell"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
SHELL_OPERATORS = {"&&", "||", "|", ";", ">", ">>", "<", "&", "2>", "2>&1"}


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def fenced_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of every fenced code block."""
    blocks, lang, start, body, fence = [], None, 0, [], None
    for number, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, lang, start, body = m.group(2), m.group(3).lower(), number + 1, []
        elif m and m.group(2).startswith(fence) and not m.group(3):
            blocks.append((lang, start, body))
            fence = None
        else:
            body.append(line)
    assert fence is None, "an unclosed code fence"
    return blocks


def prose(text: str) -> str:
    """The text outside fenced code blocks (links in code are not links)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
        elif fence is not None and m and m.group(2).startswith(fence) and not m.group(3):
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


# --- (1) the README is short and links every page; every relative link resolves -------------

def test_docs_pages_exist() -> None:
    assert DOCS, "docs/ has no pages"


def test_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/ (at most {README_MAX_LINES})"


def test_readme_links_every_docs_page() -> None:
    targets = {(README.parent / t.split("#")[0]).resolve() for t in LINK.findall(prose(README.read_text()))
               if not re.match(r"^[a-z]+:", t) and not t.startswith("#")}
    missing = [rel(p) for p in DOCS if p.resolve() not in targets]
    assert not missing, f"README.md does not link to {', '.join(missing)}"


def broken_links(page: Path) -> list[str]:
    """Relative links of a page (outside code) whose file, or heading, does not exist."""
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page.resolve()
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{rel(page)}: broken links: {'; '.join(broken)}"


# --- (2) every `reproci` command line in a shell block is one the CLI accepts ----------------

SYNOPSIS = re.compile(r"^reproci ([a-z][\w-]*)(?: ([a-z][\w-]*))?(.*)$")
SYNOPSIS_OPTION = re.compile(r"(?:(?<=^)|(?<=[\s\[/|]))(--?[A-Za-z][\w-]*)")


def command_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, text) of each line that runs reproci: every line of a shell block
    (continuations joined; in a console block, and in an untagged block, only `$ ` lines)."""
    out = []
    for lang, start, body in fenced_blocks(page.read_text()):
        prompted = lang not in SHELL_LANGS or lang == "console"
        if lang not in SHELL_LANGS and lang != "":
            continue
        pending, first = "", None
        for offset, line in enumerate(body):
            if prompted and not pending:
                if not line.startswith("$ "):
                    continue  # output, or a synopsis (see synopsis_lines)
                line = line[2:]
            first = start + offset if not pending else first
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            text, pending = pending + line, ""
            if re.search(r"(^|[\s/])reproci(\s|$)", text):
                out.append((first, text))
    return out


def synopsis_lines(page: Path) -> list[tuple[int, list[str]]]:
    """(line number, [verb, sub-verb?, option, ...]) of each synopsis line of an untagged
    block, such as `reproci merge SHARD... --output FILE [--summary FILE]`."""
    out = []
    for lang, start, body in fenced_blocks(page.read_text()):
        if lang:
            continue
        for offset, line in enumerate(body):
            m = SYNOPSIS.match(line.strip())
            if not m:
                continue
            words = [m.group(1)]
            rest = m.group(3)
            if m.group(2):
                group = cli.commands.get(m.group(1))
                if isinstance(group, click.Group):
                    words.append(m.group(2))
                else:
                    rest = f" {m.group(2)}{rest}"
            out.append((start + offset, words + SYNOPSIS_OPTION.findall(rest)))
    return out


def invocations(text: str) -> list[list[str]]:
    """The argument lists that follow each `reproci` (or `python -m reproci.cli`) in a line."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    out, i = [], 0
    while i < len(tokens):
        t = tokens[i]
        start = None
        if t == "reproci" or t.endswith("/reproci"):
            start = i + 1
        elif t == "-m" and i + 1 < len(tokens) and tokens[i + 1] == "reproci.cli":
            start = i + 2
        if start is None:
            i += 1
            continue
        end = start
        while end < len(tokens) and tokens[end] not in SHELL_OPERATORS:
            end += 1
        out.append(tokens[start:end])
        i = end
    return out


def option_names(command: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for param in params_of(command):
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def check_invocation(args: list[str]) -> str | None:
    """Why these arguments name no real command or an option it does not take (None: fine)."""
    if not args:
        return "no command after reproci"
    if args[0] in ("--version", "-h", "--help"):
        return None
    command: click.Command | None = cli.commands.get(args[0])
    if command is None:
        return f"unknown command {args[0]!r} (known: {', '.join(sorted(cli.commands))})"
    name, rest = args[0], args[1:]
    if isinstance(command, click.Group):
        if not rest or rest[0] in ("-h", "--help"):
            return None
        sub = command.commands.get(rest[0])
        if sub is None:
            return f"unknown command 'reproci {name} {rest[0]}' (known: {', '.join(sorted(command.commands))})"
        command, name, rest = sub, f"{name} {rest[0]}", rest[1:]
    known = option_names(command)
    for token in rest:
        if not token.startswith("-") or token == "-":
            continue
        option = token.split("=", 1)[0]
        if option not in known:
            return f"'reproci {name}' has no option {option} (it takes {', '.join(sorted(known))})"
    return None


def command_problems(page: Path) -> list[str]:
    problems = []
    for number, text in command_lines(page):
        for args in invocations(text):
            why = check_invocation(args)
            if why:
                problems.append(f"{rel_or_name(page)}:{number}: {why}: {text.strip()}")
    for number, args in synopsis_lines(page):
        why = check_invocation(args)
        if why:
            problems.append(f"{rel_or_name(page)}:{number}: {why} (synopsis)")
    return problems


def rel_or_name(page: Path) -> str:
    return rel(page) if page.resolve().is_relative_to(ROOT) else page.name


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_shown_commands_are_accepted(page: Path) -> None:
    problems = command_problems(page)
    assert not problems, "\n".join(problems)


def test_the_page_checks_can_fail(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[gone](nowhere.md), [self](#page), [bad](#no-such-heading), "
                    "[web](https://example.com)\n\n"
                    "```bash\nreproci run --image x --bogus 1   # comment --fine\nreproci golden remove NAME\n"
                    "reproci report \\\n  --nope\n```\n\n"
                    "```console\n$ reproci models --all\nreproci --output is output here\n```\n\n"
                    "```\n$ reproci frobnicate\nreproci merge SHARD... [--sumary FILE]\n"
                    "reproci · local (local)\n```\n\n"
                    "```python\nreproci run --ignored-in-python\n```\n")
    assert sorted(broken_links(page)) == ["#no-such-heading (no heading #no-such-heading in page.md)",
                                          "nowhere.md (no such file)"]
    problems = "\n".join(command_problems(page))
    for expected in ("no option --bogus", "'reproci golden remove'", "'reproci report' has no option --nope",
                     "'reproci models' has no option --all", "unknown command 'frobnicate'",
                     "'reproci merge' has no option --sumary"):
        assert expected in problems, (expected, problems)
    assert len(command_problems(page)) == 6, problems


def test_the_command_check_can_fail() -> None:
    assert check_invocation(["run", "--image", "x", "--model", "conv", "-j", "2"]) is None
    assert check_invocation(["golden", "update", "--image", "x", "--steps", "4"]) is None
    assert check_invocation(["images", "build", "cpu-torch2.13", "--force"]) is None
    assert check_invocation(["report", "--format=html"]) is None
    assert check_invocation(["run", "--no-such-flag"]) is not None
    assert check_invocation(["golden", "show", "NAME", "--image", "x"]) is not None
    assert check_invocation(["images", "remove", "x"]) is not None
    assert check_invocation(["frobnicate"]) is not None
    assert invocations('x && .venv/bin/reproci report >> "$GITHUB_STEP_SUMMARY"  # note --bogus') == [["report"]]
    assert invocations("python -m reproci.cli merge a --output m.json | tee log") == [
        ["merge", "a", "--output", "m.json"]]


def test_every_page_shows_commands_where_expected() -> None:
    """The parser finds the commands the README shows (so the check above is not vacuous)."""
    verbs = {args[0] for _, text in command_lines(README) for args in invocations(text) if args}
    assert {"run", "golden", "report", "images"} <= verbs, verbs


# --- (3) the README's two fresh-machine commands, and its contract tables ----------------------

def test_readme_keeps_its_two_fresh_machine_commands() -> None:
    text = README.read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert RUN_COMMAND in lines, "the README's set-up-and-run command changed"
    assert TEST_COMMAND in lines, "the README's test command changed (.ci/run runs it verbatim)"
    fresh = [line for line in lines if line.startswith("python3 -m venv")]
    assert fresh == [RUN_COMMAND, TEST_COMMAND], f"expected exactly the two fresh-machine commands, found {fresh}"


def test_the_adoption_path_starts_with_an_install_that_works_before_a_release() -> None:
    """No release is published yet: the README's first line for a user's repository installs from
    the repository the generated workflows call (a git URL), not a `reproci==` pin that finds
    nothing, and says where the pinned release comes in."""
    from packaging.requirements import Requirement

    from reproci import scaffold

    text = README.read_text()
    block = text.split("## Use reproci in your repository\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    installs = [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("pip install")]
    args = next(a for a in installs if "reproci" in a[-1])
    assert args[:2] == ["pip", "install"] and len(args) == 3, args
    requirement = Requirement(args[2])
    assert (requirement.name, requirement.url) == ("reproci", f"git+https://github.com/{scaffold.REPOSITORY}")
    assert "No release is published yet" in text and "docs/github-actions.md#before-the-first-release" in text


def test_the_adoption_path_installs_a_cpu_only_torch_before_reproci() -> None:
    """reproci depends on torch: in a fresh environment pip picks torch's CUDA build (5.5 GB with
    its nvidia-* wheels) unless a CPU-only torch is installed first, from PyTorch's CPU index."""
    block = README.read_text().split("## Use reproci in your repository\n", 1)[1].split("```bash\n", 1)[1]
    installs = [shlex.split(line, comments=True) for line in block.split("```", 1)[0].splitlines()
                if line.startswith("pip install")]
    assert installs[0] == ["pip", "install", "torch", "--index-url", "https://download.pytorch.org/whl/cpu"], installs
    assert "reproci" in installs[1][-1], installs


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert TEST_COMMAND in [line.strip() for line in ci], ".ci/run no longer runs the README's test command"


def table_first_cells(text: str, heading: str) -> set[str]:
    section = text.split(f"### {heading}\n", 1)[1].split("\n#", 1)[0]
    return {row.split("|")[1].strip() for row in section.splitlines() if row.startswith("|")}


def test_readme_lists_every_exit_code_and_verdict() -> None:
    text = README.read_text()
    codes = {str(v) for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert codes <= table_first_cells(text, "Exit codes"), codes - table_first_cells(text, "Exit codes")
    assert set(verdicts.ALL) <= table_first_cells(text, "Verdicts"), set(verdicts.ALL) - table_first_cells(text, "Verdicts")


def test_readme_names_the_report_extra() -> None:
    text = README.read_text()
    first_html = text.index("--format html")
    assert "[report]" in text[first_html:first_html + 600], "say where the HTML report is shown that it needs the [report] extra"


def test_reference_lists_every_option() -> None:
    text = (ROOT / "docs" / "reference.md").read_text()
    commands = []
    for name, command in cli.commands.items():
        if isinstance(command, click.Group):
            commands += [(f"{name} {sub}", c) for sub, c in command.commands.items()]
        else:
            commands.append((name, command))
    missing = []
    for name, command in commands:
        if f"reproci {name}" not in text and f"`{name.split()[-1]}`" not in text:
            missing.append(f"command {name}")
        for param in params_of(command):
            if isinstance(param, click.Option) and not param.hidden:
                if not any(opt in text for opt in param.opts if opt.startswith("--")):
                    missing.append(f"{name} {param.opts[0]}")
    assert not missing, f"docs/reference.md does not mention: {', '.join(missing)}"
