"""scripts/tb_screenshot.py: argument parsing, URL building, run/tag matching and the PNG check.

The end-to-end test (TensorBoard + headless Chromium) is marked slow and skipped without
Chromium on PATH (.ci/run installs Debian's chromium). It keeps the pictures it took in
.ci/artifacts/tensorboard_{scalars,timeseries}.png (ignored by git, left behind by CI).
docs/img/tensorboard_scalars.png, linked from the README, is a copy of the first; to retake it:

    python -m pytest -m slow tests/test_tb_screenshot.py -k end_to_end
    cp .ci/artifacts/tensorboard_scalars.png docs/img/
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tb_screenshot.py"
ARTIFACTS = ROOT / ".ci" / "artifacts"
DOCS_IMG = ROOT / "docs" / "img" / "tensorboard_scalars.png"
SHOT_SIZE = (1000, 700)  # width, height of the end-to-end shots and the docs picture


def _load_module():
    spec = importlib.util.spec_from_file_location("tb_screenshot", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tbs = _load_module()


def _save_png(path: Path, rgb: np.ndarray) -> Path:
    from matplotlib import image as mpimg

    mpimg.imsave(str(path), rgb.astype(np.uint8))
    return path


LINE_COLOURS = ((31, 119, 180), (220, 40, 40), (40, 160, 60), (150, 60, 200))


def _chart_like(h: int = 300, w: int = 400, colours=LINE_COLOURS) -> np.ndarray:
    """White page, grey text-ish block and axis, and a coloured polyline per colour."""
    img = np.full((h, w, 3), 255, dtype=np.uint8)
    img[:64] = (245, 124, 0)  # orange header, ignored by the colour check
    img[80:90, 20:200] = (60, 60, 60)
    img[100:280, 50] = (120, 120, 120)
    img[279, 50:380] = (120, 120, 120)
    xs = np.arange(60, 380)
    for k, colour in enumerate(colours):
        ys = (200 - 60 * np.sin(xs / 40 + k) - 10 * k).astype(int)
        for dy in range(3):
            img[ys + dy, xs] = colour
    return img


def test_parse_args_defaults_and_options(tmp_path):
    args = tbs.parse_args([str(tmp_path), "--out", str(tmp_path / "s.png")])
    assert args.logdir == tmp_path and args.out == tmp_path / "s.png"
    assert (args.view, args.port, args.width, args.height) == ("scalars", 0, 1400, 900)
    assert (args.tags, args.runs, args.smoothing, args.retries) == ("", "", 0.0, 1)
    assert args.min_hues == 2
    args = tbs.parse_args(
        ["logs", "--out", "a.png", "--tags", "^test/acc$", "--runs", "seed=0", "--port", "6111",
         "--width", "1000", "--height", "700", "--view", "timeseries", "--smoothing", "0.5"]
    )
    assert (args.tags, args.runs, args.port, args.width, args.height) == (
        "^test/acc$", "seed=0", 6111, 1000, 700)
    assert args.view == "timeseries" and args.smoothing == 0.5


@pytest.mark.parametrize(
    "extra",
    [
        [],  # --out missing
        ["--out", "a.jpg"],
        ["--out", "a.png", "--tags", "("],
        ["--out", "a.png", "--runs", "[x"],
        ["--out", "a.png", "--port", "70000"],
        ["--out", "a.png", "--width", "10"],
        ["--out", "a.png", "--smoothing", "1.5"],
        ["--out", "a.png", "--view", "images"],
        ["--out", "a.png", "--min-hues", "0"],
    ],
)
def test_parse_args_refuses_bad_values(extra, capsys):
    with pytest.raises(SystemExit) as exc:
        tbs.parse_args(["logs", *extra])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_build_url_scalars_puts_filters_in_the_fragment():
    url = tbs.build_url(6006, "scalars", "^(test/acc|privacy/epsilon)$", "seed=0", 0.0)
    base, fragment = url.split("#")
    assert base == "http://127.0.0.1:6006/?darkMode=false"
    parts = fragment.split("&")
    assert parts[0] == "scalars"
    kv = dict(p.split("=", 1) for p in parts[1:])
    assert kv["_smoothingWeight"] == "0"
    assert unquote(kv["tagFilter"]) == "^(test/acc|privacy/epsilon)$"
    assert unquote(kv["regexInput"]) == "seed=0"
    # filters are fully escaped, so '&', '=' and '#' in a regex cannot break the fragment
    assert "/" not in kv["tagFilter"] and "=" not in kv["regexInput"]


def test_build_url_timeseries_uses_query_and_svg():
    url = tbs.build_url(7000, "timeseries", "test/acc", "logit", 0.25)
    assert url.endswith("#timeseries")
    query = url.split("?", 1)[1].split("#")[0]
    kv = dict(p.split("=", 1) for p in query.split("&"))
    assert kv["forceSVG"] == "true" and kv["darkMode"] == "false" and kv["smoothing"] == "0.25"
    assert unquote(kv["tagFilter"]) == "test/acc" and unquote(kv["runFilter"]) == "logit"


def test_build_url_without_filters_and_unknown_view():
    assert tbs.build_url(1, "scalars") == (
        "http://127.0.0.1:1/?darkMode=false#scalars&_smoothingWeight=0")
    assert "tagFilter" not in tbs.build_url(1, "timeseries")
    with pytest.raises(ValueError):
        tbs.build_url(1, "images")


def test_matching_scalars_filters_runs_and_tags():
    tags_by_run = {
        "a,seed=0/tb": {"test/acc": {}, "test/loss": {}, "privacy/epsilon": {}},
        "a,seed=1/tb": {"test/acc": {}},
        "b,seed=0/tb": {"diagnostics_nonprivate/train_acc": {}},
    }
    got = tbs.matching_scalars(tags_by_run, r"^(test/acc|privacy/epsilon)$", "seed=0")
    assert got == {"a,seed=0/tb": ["privacy/epsilon", "test/acc"]}
    assert tbs.matching_scalars(tags_by_run, "", "") == {
        k: sorted(v) for k, v in tags_by_run.items()}
    assert tbs.matching_scalars(tags_by_run, "nope", "") == {}


def test_chromium_command_has_headless_screenshot_flags(tmp_path):
    cmd = tbs.chromium_command("/usr/bin/chromium", "http://x/", tmp_path / "o.png", 800, 600,
                               5000, str(tmp_path / "p"))
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking",
                 "--window-size=800,600", "--virtual-time-budget=5000",
                 f"--screenshot={tmp_path / 'o.png'}"):
        assert flag in cmd
    assert cmd[0] == "/usr/bin/chromium" and cmd[-1] == "http://x/"


def test_check_png_accepts_a_chart(tmp_path):
    stats = tbs.check_png(_save_png(tmp_path / "chart.png", _chart_like()))
    assert stats["background"] == "#ffffff"
    assert stats["hues"] >= 3 and stats["content_fraction"] > 0.01
    assert (stats["width"], stats["height"]) == (400, 300)


def test_check_png_refuses_blank(tmp_path):
    blank = np.full((300, 400, 3), 255, dtype=np.uint8)
    with pytest.raises(tbs.ScreenshotError, match="looks blank"):
        tbs.check_png(_save_png(tmp_path / "blank.png", blank))


def test_check_png_refuses_page_without_chart_lines(tmp_path):
    img = _chart_like()
    img[64:] = 255  # keep only the header ...
    img[80:90, 20:200] = (60, 60, 60)  # ... grey text ...
    img[100:280, 50] = (120, 120, 120)  # ... and empty grey axes
    img[279, 50:380] = (120, 120, 120)
    img[120:130, 300:310] = (245, 124, 0)  # one orange checkbox: a single hue
    with pytest.raises(tbs.ScreenshotError, match="no chart lines"):
        tbs.check_png(_save_png(tmp_path / "empty_chart.png", img))


def test_check_png_refuses_empty_chart_next_to_coloured_legend(tmp_path):
    """The TIME SERIES tab's undrawn card: grey frame, run table with colour dots, no lines."""
    img = np.full((300, 400, 3), 255, dtype=np.uint8)
    img[:64] = (245, 124, 0)
    img[100:280, 150] = img[279, 150:380] = (120, 120, 120)  # empty axes
    for k, colour in enumerate([(66, 80, 102), (18, 181, 203), (229, 37, 146), (124, 179, 66)]):
        img[100 + 30 * k:112 + 30 * k, 20:32] = colour  # a dot per run in the legend ...
        img[100 + 30 * k:108 + 30 * k, 60:68] = colour  # ... and in the card's data table
    img[95:110, 10:15] = img[150:160, 300:340] = (245, 124, 0)  # check box, slider knob
    with pytest.raises(tbs.ScreenshotError, match="no chart lines"):
        tbs.check_png(_save_png(tmp_path / "legend_only.png", img))


def test_check_png_min_hues_one_accepts_a_single_run(tmp_path):
    path = _save_png(tmp_path / "one.png", _chart_like(colours=LINE_COLOURS[:1]))
    with pytest.raises(tbs.ScreenshotError, match="no chart lines"):
        tbs.check_png(path)
    assert tbs.check_png(path, min_hues=1)["hues"] == 1


def test_check_png_refuses_missing_and_corrupt(tmp_path):
    with pytest.raises(tbs.ScreenshotError, match="no screenshot"):
        tbs.check_png(tmp_path / "missing.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png at all")
    with pytest.raises(tbs.ScreenshotError, match="cannot decode"):
        tbs.check_png(bad)


def test_main_reports_missing_logdir(tmp_path, capsys):
    assert tbs.main([str(tmp_path / "nope"), "--out", str(tmp_path / "s.png")]) == 1
    assert "log folder not found" in capsys.readouterr().err


def _write_events(logdir: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    for name, slope in (("run_a", 0.002), ("run_b", 0.001), ("run_c", 0.0005)):
        w = SummaryWriter(str(logdir / name))
        for step in range(0, 200, 10):
            w.add_scalar("test/acc", 0.5 + slope * step, step)
            w.add_scalar("privacy/epsilon", slope * step * 10, step)
        w.close()


def _assert_tensorboard_chart(path: Path) -> dict:
    """A light-mode TensorBoard page of SHOT_SIZE with chart lines in 2 colours or more."""
    stats = tbs.check_png(path, min_hues=2)
    assert (stats["width"], stats["height"]) == SHOT_SIZE
    assert stats["background"] == "#ffffff"  # darkMode=false
    assert 0.05 < stats["content_fraction"] < 0.9 and stats["colours"] > 100
    from matplotlib import image as mpimg

    top = np.round(mpimg.imread(str(path))[:56, :, :3] * 255).astype(int)
    orange = np.all(top == (0xF5, 0x7C, 0x00), axis=-1).mean()
    assert orange > 0.6, f"top bar is {orange:.0%} TensorBoard orange"
    return stats


def test_docs_image_is_a_tensorboard_chart():
    """The README's picture (a copy of the end-to-end test's scalars shot) shows chart lines."""
    _assert_tensorboard_chart(DOCS_IMG)
    assert DOCS_IMG.stat().st_size < 200_000


@pytest.mark.slow
@pytest.mark.skipif(
    not any(shutil.which(n) for n in tbs.CHROMIUM_NAMES),
    reason=f"no Chromium on PATH ({', '.join(tbs.CHROMIUM_NAMES)}); Debian: apt-get install "
    "chromium (.ci/run does when apt-get works)",
)
@pytest.mark.parametrize("view", ["scalars", "timeseries"])
def test_end_to_end_screenshot(tmp_path, view):
    """Real TensorBoard and headless Chromium; the shot is kept in .ci/artifacts/.

    3 runs, filter ^test/acc$; lines in 2 colours at least (the SCALARS palette puts two of
    its three run colours in one hue bin). No wall-clock waits: the script polls TensorBoard
    (up to 300 s) and retakes a shot without chart lines in a fresh browser, 9 times (TIME
    SERIES left its card empty in 21 shots of 53 here: 0.4^10 = 1e-4 to fail)."""
    _write_events(tmp_path / "logs")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / f"tensorboard_{view}.png"
    res = subprocess.run(
        # a relative log folder (cwd tmp_path): the SCALARS tab prints it under the run list
        [sys.executable, str(SCRIPT), "logs", "--out", str(out), "--tags", "^test/acc$",
         "--view", view, "--width", str(SHOT_SIZE[0]), "--height", str(SHOT_SIZE[1]),
         "--retries", "9", "--startup-timeout", "300", "--chromium-timeout", "300"],
        cwd=tmp_path, capture_output=True, text=True, timeout=3600, check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 runs x tags test/acc" in res.stdout
    _assert_tensorboard_chart(out)
