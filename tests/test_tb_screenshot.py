"""scripts/tb_screenshot.py: argument parsing, URL building, run/tag matching and the PNG check.

The end-to-end test (TensorBoard + headless Chromium) is marked slow and skipped without
Chromium on PATH."""

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


def _chart_like(h: int = 300, w: int = 400) -> np.ndarray:
    """White page, grey text-ish block and axis, and four coloured polylines."""
    img = np.full((h, w, 3), 255, dtype=np.uint8)
    img[:64] = (245, 124, 0)  # orange header, ignored by the colour check
    img[80:90, 20:200] = (60, 60, 60)
    img[100:280, 50] = (120, 120, 120)
    img[279, 50:380] = (120, 120, 120)
    xs = np.arange(60, 380)
    for k, colour in enumerate([(31, 119, 180), (220, 40, 40), (40, 160, 60), (150, 60, 200)]):
        ys = (200 - 60 * np.sin(xs / 40 + k) - 10 * k).astype(int)
        for dy in range(3):
            img[ys + dy, xs] = colour
    return img


def test_parse_args_defaults_and_options(tmp_path):
    args = tbs.parse_args([str(tmp_path), "--out", str(tmp_path / "s.png")])
    assert args.logdir == tmp_path and args.out == tmp_path / "s.png"
    assert (args.view, args.port, args.width, args.height) == ("scalars", 0, 1400, 900)
    assert (args.tags, args.runs, args.smoothing, args.retries) == ("", "", 0.0, 1)
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
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
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


@pytest.mark.slow
@pytest.mark.skipif(
    not any(shutil.which(n) for n in tbs.CHROMIUM_NAMES), reason="no Chromium on PATH"
)
@pytest.mark.parametrize("view", ["scalars", "timeseries"])
def test_end_to_end_screenshot(tmp_path, view):
    _write_events(tmp_path / "logs")
    out = tmp_path / "shot.png"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "logs"), "--out", str(out),
         "--tags", "^test/acc$", "--view", view, "--width", "1000", "--height", "700"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "3 runs x tags test/acc" in res.stdout
    stats = tbs.check_png(out)
    assert (stats["width"], stats["height"]) == (1000, 700)
