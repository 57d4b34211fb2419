"""The README runs as written (issue 32): each of its command blocks, in README order, in one fresh
working folder, with this interpreter; and every link it gives resolves.

What is run, and what is not:

- every ```bash block, line by line as one bash script (`set -euo pipefail`), except the install
  line's virtual environment and `pip install` (the package is installed already: only the
  command after its last `&&` runs) and `python -m pytest` lines (the test suite itself; CI runs
  it);
- every ```python block, as a script;
- ```text blocks are console output, not commands.

`python -m X` becomes `sys.executable -m X`, `python -c` `sys.executable -c`, and
`python scripts/X.py` runs the repository's script. The Development block lints the checkout, so
it runs in the repository root; every other block runs in a temporary folder shared by all blocks,
so a block that needs a file an earlier block wrote (Score new rows: Your own data's run and CSV)
finds it there. Each block is checked for exit status 0 and one or two lines of its output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PY = f'"{sys.executable}"'

FIRST_BLOCK = ('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && '
               "python -m dptrain experiment=logit\npython -m pytest\n")

# section title -> patterns its blocks' output must contain (regular expressions)
EXPECT = {
    "Install and run (two commands)": [r"test accuracy: 0\.8\d+", r"privacy: epsilon = 0\.99\d*, delta = 1e-05"],
    "Presets and overrides": [r"privacy: epsilon = 0\.(49|50?)\d*,", r"(?m)^privacy:\n  enabled: true"],
    "Your own data": [r"privacy: epsilon = 0\.99\d*, delta = 1e-05", r"outputs in \S*runs/people "],
    "Coefficients and confidence intervals": [r"coefficients: 2 terms, ", r"(?m)^  educ +0\.1\d*"],
    "Sweeps, TensorBoard and a summary": [r"4 runs, 4 settings, 1 seed each"],
    "Private hyperparameter search (`task=tune`)": [r"tune: selected .*epsilon 0\.99\d* for the whole search"],
    "Releasing small-cell statistics (MOS, DP-MOS and baselines)": [
        r"MOS is NOT differentially private", r"release written: .*end to end.* at epsilon 12, delta 1e-06",
        r"(?m)^release: epsilon 12, delta 1e-06 in all .*release.epsilon_per_statistic=4"],  # the total first
    "One-shot releases: tables, TopDown, synthetic data": [
        r"tables: 91 marginals", r"topdown: nation 1, state 4, county 300", r"synthetic: \d+ rows .*\(mst\)",
        r"published log_laplace: \(0\.1, 4\)-er_ee"],
    "Score new rows": [r"(?m)^score,probability,label,label_01$", r"(?m)^-?[\d.]+,[\d.e-]+,(<=50K|>50K),[01]$"],
    "One person, many rows": [r"privacy: epsilon = 0\.8\d*, delta = 1e-06 .*; per person_id \(at most 5 rows each\)"],
    "Python API": [r"accuracy 0\.\d+ at epsilon (0\.99\d*|1\.0000)", r"guarantee: \("],
    "Auditing a run": [r"audit: m = 1000 canaries"],
    "GPUs and scale-out": [r"train loop: .* for \d+ steps"],
    "Development": [r"All checks passed"],
}
IN_REPO = {"Development"}  # lints the checkout: run in the repository root
# four Adult runs and four diffprivlib fits (about 20 s on 2 cores); the fast suite runs the same sweep and
# summary already (tests/test_summarize_sweep.py::test_readme_sweep_as_written)
SLOW = {"Sweeps, TensorBoard and a summary"}


@dataclass(frozen=True)
class Block:
    section: str
    lang: str
    text: str


def readme_blocks(text: str | None = None) -> list[Block]:
    """The README's fenced blocks in order, each with the title of the section it is in."""
    text = README.read_text(encoding="utf-8") if text is None else text
    blocks, section = [], ""
    for m in re.finditer(r"(?m)^## ([^\n]+)$|^```(\w*)\n(.*?)^```$", text, flags=re.S):
        if m.group(1) is not None:
            section = m.group(1).strip()
        else:
            blocks.append(Block(section, m.group(2), m.group(3)))
    return blocks


def bash_script(block: str) -> str:
    """One ```bash block as the script this test runs: see the module's docstring."""
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith("python3 -m venv "):
            line = line.rsplit("&& ", 1)[1]  # the install line: only its last command
        if line.startswith("python -m pytest"):
            continue
        line = re.sub(r"\bpython scripts/(\S+\.py)", lambda m: f'{PY} "{REPO / "scripts" / m.group(1)}"', line)
        line = re.sub(r"\bpython -([mc]) ", rf"{PY} -\1 ", line)
        assert not re.search(r"(^|[;&|(]\s*)python3? ", line), f"a python command this test does not rewrite: {line}"
        lines.append(line)
    return "\n".join(lines)


def _run(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if block.lang == "python":
        cmd = [sys.executable, "-c", block.text]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", bash_script(block.text)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


RUNNABLE = [b for b in readme_blocks() if b.lang in ("bash", "python")]


def test_readme_blocks_are_the_ones_this_test_knows():
    """Every block is a command (bash, python) or console output (text), the first block is the
    install-and-run pair, and every section with commands has expected output here."""
    blocks = readme_blocks()
    assert {b.lang for b in blocks} <= {"bash", "python", "text"}, "fence each block as bash, python or text"
    assert blocks[0].lang == "bash" and blocks[0].text == FIRST_BLOCK
    assert [b.section for b in RUNNABLE if b.section not in EXPECT] == [], "a new command block: add it to EXPECT"
    assert set(EXPECT) == {b.section for b in RUNNABLE}, "a block left the README: remove it from EXPECT"
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 230, "the README is a front door: keep it short"


def test_bash_script_rewrites_the_python_commands():
    script = bash_script('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && '
                         "python -m dptrain experiment=logit\npython -m pytest -m slow\n"
                         "python scripts/survey_table.py survey.csv\npython -c 'print(1)'\n")
    assert script.splitlines() == [f"{PY} -m dptrain experiment=logit",
                                   f'{PY} "{REPO}/scripts/survey_table.py" survey.csv', f"{PY} -c 'print(1)'"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("index", [
    pytest.param(i, marks=[pytest.mark.slow] if b.section in SLOW else [], id=f"{i}-{b.section.split(' (')[0]}")
    for i, b in enumerate(RUNNABLE)])
def test_readme_block_runs_as_written(index, workdir):
    """Block `index` (with the blocks before it that it needs, when run alone) exits 0 and prints
    its section's expected lines."""
    block = RUNNABLE[index]
    if block.section == "Score new rows" and not (workdir / "runs" / "people" / "model.pt").exists():
        for before in RUNNABLE[:index]:  # selected alone (-k): the own-data run it scores first
            if before.section == "Your own data":
                assert _run(before, workdir).returncode == 0
    res = _run(block, REPO if block.section in IN_REPO else workdir)
    out = res.stdout + res.stderr
    assert res.returncode == 0, (block.section, res.stdout[-2000:], res.stderr[-3000:])
    for pattern in EXPECT[block.section]:
        assert re.search(pattern, out), (block.section, pattern, out[-3000:])


def _slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"(?m)^#+ (.+)$", text)}


@pytest.mark.parametrize("page", [README, *sorted(REPO.joinpath("docs").glob("*.md"))], ids=lambda p: p.name)
def test_links_resolve(page):
    """Every relative link of the README and of docs/ names a file that exists and, with #anchor,
    a heading of that file."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: links that do not resolve: {broken}"
