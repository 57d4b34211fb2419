"""Take a PNG screenshot of TensorBoard's scalar charts for a log folder, in headless Chromium.

    python scripts/tb_screenshot.py LOGDIR --out PATH.png [--tags REGEX] [--runs REGEX]
        [--view scalars|timeseries] [--port N] [--width W --height H] [--smoothing S]
        [--retries N] [--min-hues N]

Starts ``tensorboard --logdir LOGDIR --host 127.0.0.1 --port N`` (N: a free port unless given),
waits until it answers HTTP and lists runs, checks that some run has a scalar tag matching
--tags (and a name matching --runs), runs ``chromium --headless --screenshot`` on the dashboard
and stops TensorBoard again whatever happens. The PNG is then decoded and refused (exit status
1, the file left in place to look at) if it is blank or shows lines in fewer than --min-hues
colours (default 2; 1 for a single run) across the page (see check_png); before giving up the
shot is retaken --retries times (default 1) in a fresh browser, with twice the virtual-time
budget each time (at most one virtual hour: virtual time costs little wall time).

Views:

* ``scalars`` (default): the SCALARS tab (TensorBoard's legacy scalar dashboard). The tag
  regex goes into its tag filter (a "Tags matching" section at the top; the other tag groups
  are still listed below it), the run regex into its run filter, whose list, left, is the
  colour legend.
* ``timeseries``: the TIME SERIES tab, with ``forceSVG=true``. By default that tab draws its
  line charts with WebGL, which comes out as empty chart cards in headless Chromium; the SVG
  renderer draws them. Its cards are made lazily, when an IntersectionObserver reports them
  on screen, and in headless Chromium 150 that report never came in 21 shots of 53 here,
  whatever the budget: the card stays empty (the run table's colour dots drawn, no lines). The
  check refuses such a shot, so give this view a few --retries; hence ``scalars`` (drawn in
  every try here) is the default.

Both are driven by URL parameters only (no DevTools protocol): smoothing, tag filter, run
filter, light mode. Chromium is found on PATH (chromium, chromium-browser, google-chrome) or
given with --chromium.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
VIEWS = ("scalars", "timeseries")
HEADER_CSS_PX = 64  # TensorBoard's orange top bar, excluded from the colour check
LINE_SPAN_PX = 100  # columns a colour must cover to count as a chart line (see check_png)
MAX_BUDGET_MS = 3_600_000  # the retries' doubling of --budget-ms stops at one virtual hour


class ScreenshotError(RuntimeError):
    """A step failed; the message says which and why."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tb_screenshot.py",
        description="PNG screenshot of TensorBoard's scalar charts in headless Chromium.",
    )
    p.add_argument("logdir", type=Path, help="folder given to tensorboard --logdir")
    p.add_argument("--out", type=Path, required=True, help="PNG file to write")
    p.add_argument("--tags", default="", help="regex of scalar tags to show (default: all)")
    p.add_argument("--runs", default="", help="regex of run names to show (default: all)")
    p.add_argument("--view", choices=VIEWS, default="scalars", help="dashboard (see --help)")
    p.add_argument("--port", type=int, default=0, help="TensorBoard port (default: a free one)")
    p.add_argument("--width", type=int, default=1400, help="window width in pixels")
    p.add_argument("--height", type=int, default=900, help="window height in pixels")
    p.add_argument("--smoothing", type=float, default=0.0, help="chart smoothing, 0 to 1")
    p.add_argument("--chromium", default=None, help="Chromium binary (default: from PATH)")
    p.add_argument(
        "--startup-timeout", type=float, default=60.0,
        help="seconds to wait for TensorBoard to serve the runs",
    )
    p.add_argument(
        "--budget-ms", type=int, default=20000,
        help="Chromium --virtual-time-budget: virtual ms the page may run before the shot",
    )
    p.add_argument(
        "--retries", type=int, default=1,
        help="shots to retake (with twice the budget) when the check finds no chart lines",
    )
    p.add_argument(
        "--chromium-timeout", type=float, default=120.0, help="wall-clock limit for Chromium"
    )
    p.add_argument(
        "--min-hues", type=int, default=2,
        help="colours of chart lines the shot must show (1 for a single run)",
    )
    args = p.parse_args(argv)
    if args.retries < 0 or args.budget_ms <= 0 or args.min_hues < 1:
        p.error("--retries must be >= 0, --budget-ms > 0 and --min-hues >= 1")
    if not 0 <= args.port <= 65535:
        p.error(f"--port must be 0..65535, got {args.port}")
    if args.width < 200 or args.height < 200:
        p.error(f"--width and --height must be at least 200, got {args.width}x{args.height}")
    if not 0.0 <= args.smoothing < 1.0:
        p.error(f"--smoothing must be in [0, 1), got {args.smoothing}")
    if args.out.suffix.lower() != ".png":
        p.error(f"--out must end in .png, got {args.out}")
    for name in ("tags", "runs"):
        try:
            re.compile(getattr(args, name))
        except re.error as err:
            p.error(f"--{name} is not a valid regex ({err}): {getattr(args, name)!r}")
    return args


def build_url(
    port: int, view: str = "scalars", tags: str = "", runs: str = "", smoothing: float = 0.0
) -> str:
    """The dashboard URL with smoothing, tag filter and run filter set in its parameters."""
    base = f"http://127.0.0.1:{port}/"
    smoothing_text = f"{smoothing:g}"
    if view == "scalars":
        # The legacy dashboards keep their state in the fragment: #plugin&key=value&...
        parts = ["scalars", f"_smoothingWeight={smoothing_text}"]
        if tags:
            parts.append(f"tagFilter={quote(tags, safe='')}")
        if runs:
            parts.append(f"regexInput={quote(runs, safe='')}")
        return f"{base}?darkMode=false#" + "&".join(parts)
    if view == "timeseries":
        # The time-series tab reads query parameters; forceSVG avoids its WebGL renderer.
        query = ["darkMode=false", "forceSVG=true", f"smoothing={smoothing_text}"]
        if tags:
            query.append(f"tagFilter={quote(tags, safe='')}")
        if runs:
            query.append(f"runFilter={quote(runs, safe='')}")
        return f"{base}?" + "&".join(query) + "#timeseries"
    raise ValueError(f"unknown view {view!r}; expected one of {VIEWS}")


def find_chromium(explicit: str | None = None) -> str:
    if explicit:
        path = shutil.which(explicit)
        if path is None:
            raise ScreenshotError(f"Chromium binary not found: {explicit}")
        return path
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise ScreenshotError(
        f"no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}); "
        "install it (Debian: apt-get install chromium) or pass --chromium"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium_command(chromium: str, url: str, out: Path, width: int, height: int,
                     budget_ms: int, profile_dir: str) -> list[str]:
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        # Shared memory in the profile's folder, not /dev/shm (64 MB in a default container).
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-extensions",
        "--disable-sync",
        "--no-first-run",
        "--no-default-browser-check",
        "--mute-audio",
        "--hide-scrollbars",
        # Software GL, in case a chart falls back to WebGL (the SVG/canvas charts do not need it).
        "--use-angle=swiftshader",
        "--enable-unsafe-swiftshader",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile_dir}",
        f"--window-size={width},{height}",
        f"--virtual-time-budget={budget_ms}",
        f"--screenshot={out}",
        url,
    ]


def _get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


def _log_tail(log_path: Path, n: int = 20) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def wait_for_tensorboard(port: int, proc: subprocess.Popen, log_path: Path,
                         timeout: float) -> list[str]:
    """Poll until TensorBoard answers and its run list is non-empty and unchanged twice."""
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    last: list[str] | None = None
    answered = False
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ScreenshotError(
                f"tensorboard exited with status {proc.returncode} before answering on port "
                f"{port}; its output ends with:\n{_log_tail(log_path)}"
            )
        try:
            runs = _get_json(f"{base}/data/runs")
            answered = True
        except (urllib.error.URLError, OSError, ValueError):
            runs = None
        if runs:
            if runs == last:
                return list(runs)
            last = runs
        time.sleep(0.5)
    if not answered:
        raise ScreenshotError(
            f"tensorboard did not answer HTTP on 127.0.0.1:{port} within {timeout:g} s; "
            f"its output ends with:\n{_log_tail(log_path)}"
        )
    raise ScreenshotError(
        f"tensorboard answered but listed no (stable) runs within {timeout:g} s: "
        "is the log folder right and does it hold event files?"
    )


def matching_scalars(tags_by_run: dict, tags: str, runs: str) -> dict[str, list[str]]:
    """{run: [tag, ...]} of the runs matching ``runs`` and their tags matching ``tags``.

    Both are searched (not anchored), like TensorBoard's filters."""
    tag_re, run_re = re.compile(tags), re.compile(runs)
    found = {}
    for run, run_tags in sorted(tags_by_run.items()):
        if not run_re.search(run):
            continue
        hits = sorted(t for t in run_tags if tag_re.search(t))
        if hits:
            found[run] = hits
    return found


def check_png(path: Path, *, min_content_fraction: float = 0.01, min_hues: int = 2,
              header_px: int = HEADER_CSS_PX, min_span_px: int = LINE_SPAN_PX) -> dict:
    """Decode the PNG and refuse a blank one or one without chart lines.

    Blank: fewer than ``min_content_fraction`` of the pixels differ from the most common
    (background) colour. Chart lines: below the top ``header_px`` rows, saturated pixels
    (HSV saturation > 0.35, value > 0.25) are sorted into 24 hue bins (15 degrees each); a bin
    counts as a line colour when it holds 0.02 % of the pixels and they cover at least
    ``min_span_px`` columns (at most half the width), and ``min_hues`` bins must count. A run's
    line crosses the plot (a few hundred columns); its legend dot, check box or table dot, the
    orange check boxes and slider knobs cover a few dozen, so an empty chart card next to a
    coloured run legend (the TIME SERIES tab's empty cards) is refused. A heuristic: it catches
    blank, error and no-data pages and undrawn charts; it cannot tell one run's line from a
    smoothing slider dragged far right (orange track), so one run needs ``min_hues=1`` and the
    slider can stand in for one line colour. Returns the measured numbers ("hues": the line
    colours counted)."""
    import numpy as np
    from matplotlib import image as mpimg
    from matplotlib.colors import rgb_to_hsv

    if not path.is_file() or path.stat().st_size == 0:
        raise ScreenshotError(f"no screenshot written at {path}")
    try:
        img = mpimg.imread(str(path))
    except Exception as err:  # any decode failure means a bad file
        raise ScreenshotError(f"cannot decode {path} as PNG: {err}") from err
    if img.dtype != np.float32 and img.dtype != np.float64:
        img = img.astype(np.float64) / 255.0
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    rgb = np.round(img[..., :3] * 255).astype(np.int64)
    h, w = rgb.shape[:2]
    flat = (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]
    values, counts = np.unique(flat, return_counts=True)
    background = int(values[np.argmax(counts)])
    content_fraction = float(np.mean(flat != background))
    stats = {
        "width": w,
        "height": h,
        "background": f"#{background:06x}",
        "content_fraction": content_fraction,
        "colours": int(values.size),
    }
    if content_fraction < min_content_fraction:
        raise ScreenshotError(
            f"{path} looks blank: {content_fraction:.2%} of its pixels differ from the "
            f"background colour {stats['background']} (need {min_content_fraction:.0%})"
        )
    hsv = rgb_to_hsv(rgb[min(header_px, h - 1):] / 255.0)
    colourful = (hsv[..., 1] > 0.35) & (hsv[..., 2] > 0.25)
    # 24 bins of 15 degrees, shifted so that TensorBoard's theme orange (#f57c00, 30.4 deg)
    # sits in the middle of one bin instead of on an edge.
    hue_bin = ((hsv[..., 0] * 360.0 + 7.5) // 15).astype(np.int64) % 24
    min_pixels = max(1, int(0.0002 * colourful.size))
    min_span = max(1, min(min_span_px, w // 2))
    hues = 0
    for b in np.unique(hue_bin[colourful]):
        in_bin = colourful & (hue_bin == b)
        if in_bin.sum() >= min_pixels and np.count_nonzero(in_bin.any(axis=0)) >= min_span:
            hues += 1
    stats["hues"] = hues
    if hues < min_hues:
        raise ScreenshotError(
            f"{path} shows no chart lines: {hues} colour(s) cover {min_span} columns or more "
            f"(need {min_hues}); the charts were probably not drawn (try more --retries, "
            "--view scalars, or check --tags/--runs; one run: --min-hues 1)"
        )
    return stats


def _stop(proc: subprocess.Popen) -> None:
    """Stop the process group we started (tensorboard and its data server)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _run_chromium(cmd: list[str], out: Path, timeout: float) -> None:
    try:
        res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise ScreenshotError(f"chromium did not finish within {timeout:g} s") from err
    if res.returncode != 0 or not out.is_file():
        tail = "\n".join((res.stderr or "").splitlines()[-15:])
        raise ScreenshotError(
            f"chromium exited with status {res.returncode} and wrote "
            f"{'a' if out.is_file() else 'no'} screenshot; stderr ends with:\n{tail}"
        )


def take_screenshot(args: argparse.Namespace) -> dict:
    logdir = args.logdir
    if not logdir.is_dir():
        raise ScreenshotError(f"log folder not found: {logdir}")
    chromium = find_chromium(args.chromium)
    port = args.port or free_port()
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    with tempfile.TemporaryDirectory(prefix="tb_screenshot_") as tmp:
        log_path = Path(tmp) / "tensorboard.log"
        tb_cmd = [
            sys.executable, "-m", "tensorboard.main",
            "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
        ]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                tb_cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        try:
            runs = wait_for_tensorboard(port, proc, log_path, args.startup_timeout)
            tags_by_run = _get_json(f"http://127.0.0.1:{port}/data/plugin/scalars/tags")
            shown = matching_scalars(tags_by_run, args.tags, args.runs)
            if not shown:
                raise ScreenshotError(
                    f"no scalar tag matching --tags {args.tags!r} in a run matching --runs "
                    f"{args.runs!r} ({len(runs)} runs served, tags e.g. "
                    f"{sorted({t for v in tags_by_run.values() for t in v})[:8]})"
                )
            url = build_url(port, args.view, args.tags, args.runs, args.smoothing)
            budget = args.budget_ms
            for attempt in range(1 + args.retries):
                if out.exists():
                    out.unlink()
                _run_chromium(chromium_command(chromium, url, out, args.width, args.height,
                                               budget, str(Path(tmp) / f"profile{attempt}")),
                              out, args.chromium_timeout)
                try:
                    stats = check_png(out, min_hues=args.min_hues)
                    break
                except ScreenshotError as err:
                    if attempt == args.retries:
                        raise
                    budget = min(2 * budget, max(budget, MAX_BUDGET_MS))
                    print(f"tb_screenshot: {err}; retrying with --virtual-time-budget={budget}",
                          file=sys.stderr)
        finally:
            _stop(proc)
    stats.update(url=url, runs=len(shown), tags=sorted({t for v in shown.values() for t in v}))
    return stats


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        stats = take_screenshot(args)
    except ScreenshotError as err:
        print(f"tb_screenshot: error: {err}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.out} ({stats['width']}x{stats['height']}, "
        f"{args.out.stat().st_size / 1024:.0f} KB): {stats['runs']} runs x tags "
        f"{', '.join(stats['tags'])}; lines in {stats['hues']} colours, "
        f"{stats['content_fraction']:.0%} non-background pixels\nURL: {stats['url']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
