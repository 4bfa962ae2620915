"""The README's Python blocks run as written (issue 37), the trained-run ones on the shared tiny run."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_the_readmes_python_blocks_run(tiny_run, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block.replace('"runs/default"', repr(str(tiny_run))), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "172512128" in printed and "[UNK:" in printed
