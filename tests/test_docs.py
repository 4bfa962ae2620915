"""README.md and docs/ cannot go stale silently: their Python blocks run as written (the trained-run
ones on the shared tiny run), every command they write names only flags its script defines and config
keys its config has, and no page holds a machine's absolute path."""

import ast
import pathlib
import re
import shlex

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ABSL_FLAGS = {"help", "helpfull", "helpshort", "verbosity", "v", "logtostderr", "alsologtostderr", "flagfile"}


def _text(page: pathlib.Path) -> str:
    return page.read_text(encoding="utf-8")


def test_the_python_blocks_run(tiny_run, tmp_path, capsys):
    """Each as written; "runs/default" is the shared tiny run, "runs/from_python" a new workdir, and the
    config trained from Python the tiny run's (the default config's model: test_cli, make run)."""
    blocks = [(page.name, block) for page in PAGES for block in re.findall(r"```python\n(.*?)```", _text(page), re.S)]
    expected = ["README.md"] * 3 + ["evaluation.md"] + ["operations.md"] * 2 + ["scaling.md"]
    assert [name for name, _ in blocks] == expected
    assert sum(block.count("config = default.get_config()") for _, block in blocks) == 1
    for name, block in blocks:
        block = block.replace('"runs/default"', repr(str(tiny_run)))
        block = block.replace(
            "config = default.get_config()", "from tests.helpers import tiny_config; config = tiny_config()"
        )
        exec(compile(block.replace('"runs/from_python"', repr(str(tmp_path))), name, "exec"), {})
    printed = capsys.readouterr().out
    assert "172512128" in printed and "[UNK:" in printed and "20 True" in printed
    assert "['embed', 'final_ln', 'layers', 'readout'] ['opt_state', 'rng', 'step'] {'next_index': " in printed
    shown = re.findall(r"^    ((?:Δ|The lead of) .*)$", _text(REPO / "docs" / "scaling.md"), re.M)  # what it prints
    assert len(shown) == 4 and set(shown) <= set(printed.splitlines())


def commands() -> list[tuple[str, list[str]]]:
    """(page, argv after ``python``) of every command line a page writes: the lines of its fenced and
    indented blocks that start with ``python`` (continuation backslashes joined) and its inline
    ``python …`` code spans."""
    found = []
    for page in PAGES:
        text = re.sub(r"\\\n\s*", " ", _text(page))
        lines = re.findall(r"`(python3? [^`]+)`", text)
        lines += [line.strip() for line in text.splitlines() if re.match(r"(    |\$ )?python3? ", line)]
        for line in lines:
            line = line.removeprefix("$ ").split("  #")[0].split(" # ")[0]
            line = line.split(" 2>&1")[0].split(" | ")[0].split(" && ")[0].split("; ")[0]
            try:
                argv = shlex.split(line)[1:]
            except ValueError:
                continue
            if argv and (argv[0] == "-m" or argv[0].endswith(".py")):
                found.append((page.name, argv))
    return found


def _defined_flags(source: str) -> set[str]:
    """The flag names a script defines: absl's ``flags.DEFINE_*("name", ...)`` and
    ``config_flags.DEFINE_config_file("name", ...)``, argparse's ``add_argument("--name", ...)``."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = node.args[0].value
            if func.startswith("DEFINE_") and isinstance(first, str):
                names.add(first)
            elif func == "add_argument" and isinstance(first, str) and first.startswith("--"):
                names.add(first[2:].replace("-", "_"))
    return names


def _script(argv: list[str]) -> pathlib.Path:
    if argv[0] == "-m":
        module = REPO / (argv[1].replace(".", "/") + ".py")
        return module if module.is_file() else REPO / argv[1].replace(".", "/") / "__main__.py"
    return REPO / argv[0]


def _config_flags(source: str) -> dict[str, str]:
    """The script's config-file flags and their default files."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "DEFINE_config_file" and len(node.args) > 1:
            found[node.args[0].value] = node.args[1].value
    return found


def _has_key(config, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False
        node = node[part]
    return True


def test_every_command_names_existing_flags_and_config_keys():
    import importlib.util

    problems, checked = [], 0
    for page, argv in commands():
        script = _script(argv)
        if not script.is_file():
            problems.append(f"{page}: {' '.join(argv)}: no such script {script.relative_to(REPO)}")
            continue
        source = script.read_text(encoding="utf-8")
        defined, config_files = _defined_flags(source), _config_flags(source)
        args = argv[2:] if argv[0] == "-m" else argv[1:]
        given = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in args if a.startswith("--"))
        for name in given:
            base = name.split(".")[0]
            if base not in defined and base.removeprefix("no") not in defined and base not in ABSL_FLAGS:
                problems.append(f"{page}: {' '.join(argv)}: {script.name} defines no --{base}")
            elif "." in name and base in config_files:
                path = given.get(base) or config_files[base]
                if not (REPO / path).is_file():
                    continue  # a placeholder
                spec = importlib.util.spec_from_file_location("doc_config", REPO / path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                if not _has_key(module.get_config(), name.split(".", 1)[1]):
                    problems.append(f"{page}: {' '.join(argv)}: {path} has no key {name.split('.', 1)[1]}")
            checked += 1
    assert checked > 50 and not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_holds_a_machines_absolute_path(page):
    paths = re.findall(r"(?<![\w.])/(?:work|tmp|root|home|opt)/\S*", _text(page))
    assert paths == [], paths[:5]


def _paragraphs(text: str) -> list[list[str]]:
    """A page's prose paragraphs (code blocks and tables left out; each list item one paragraph)."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", re.sub(r"```.*?```", "", text, flags=re.S)):
        for n, line in enumerate(line for line in block.split("\n") if line.strip()):
            if line.lstrip().startswith("|"):
                break
            if n == 0 or re.match(r"\s*([-*]|\d+\.) ", line):
                paragraphs.append([])
            paragraphs[-1].append(line)
    return paragraphs


def test_pages_read_as_pages_not_a_diary():
    """No prose paragraph over eight lines, "trained again" at most twice in all, docs/scaling.md at most
    250 lines and docs/performance.md at most 200 (provenance lives in results/, history in git)."""
    long = [f"{page.name}: {p[0][:60]}" for page in PAGES for p in _paragraphs(_text(page)) if len(p) > 8]
    assert long == []
    assert sum(_text(page).count("trained again") for page in PAGES) <= 2
    lines = {page.name: _text(page).count("\n") for page in PAGES}
    assert lines["scaling.md"] <= 250 and lines["performance.md"] <= 200, lines
    sample = "a\nb\n\n- c\n- d\n  e\n\n| t |\n\n```\nx\n```\nf"
    assert _paragraphs(sample) == [["a", "b"], ["- c"], ["- d", "  e"], ["f"]]
