#!/usr/bin/python3
"""Opens a rendered benchmark report in headless Chromium as a reader would, and fails when the
page logs a console error, an image does not decode, or a section or plot is missing.

    check_report.py RESULTS_DIR [--chromium PATH] [--screenshot FILE]

Expected content comes from RESULTS_DIR/results.json: the summary table, the machine section, one
section per suite that ran, and at least one plot for each suite that recorded rows.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0"]

# Suites whose rows the report plots (tools/report/memkit_report.py's PLOTTERS).
PLOTTED = {"reserve-commit", "block-heap", "small-vector", "vector-growth", "gpa-degen", "malloc-workloads",
           "real-programs"}

# Plots a suite must show when its rows hold what they draw: {suite: [(plot id, row predicate)]}.
def _process(r, kind):
    return r.get("parameters", {}).get("process") == kind


REQUIRED_PLOTS = {
    "malloc-workloads": [("ratios-time", lambda r: _process(r, "warm")),
                         ("ratios-peak_rss", lambda r: _process(r, "warm")),
                         ("ratios-minor_faults", lambda r: _process(r, "warm")),
                         ("ratios-time-fresh", lambda r: _process(r, "fresh"))],
    "block-heap": [("sizes", lambda r: r.get("experiment") == "sizes"),
                   ("exhaustion", lambda r: r.get("experiment") == "exhaustion")],
}


def run_chromium(chromium, page, extra, timeout=120):
    with tempfile.TemporaryDirectory(prefix="memkit-report-check-") as profile:
        cmd = [chromium, *FLAGS, f"--user-data-dir={profile}", *extra, "file://" + os.path.abspath(page)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return proc


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("results_dir")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--screenshot")
    args = ap.parse_args(argv)
    page = os.path.join(args.results_dir, "report.html")
    with open(os.path.join(args.results_dir, "results.json")) as fh:
        data = json.load(fh)
    problems = []
    proc = run_chromium(args.chromium, page, ["--virtual-time-budget=5000", "--dump-dom"])
    dom = proc.stdout
    if proc.returncode != 0 or "</html>" not in dom:
        problems.append(f"chromium exited {proc.returncode} without a page: {proc.stderr[-2000:]}")
    # Console messages are logged as CONSOLE lines; errors (uncaught exceptions, console.error) fail.
    for line in proc.stderr.splitlines():
        if "CONSOLE" in line and ("ERROR" in line.split("CONSOLE")[0] or "Uncaught" in line or "Error" in line):
            problems.append("console: " + line.strip())
    if 'id="summary-table"' not in dom:
        problems.append("missing section: the summary table")
    if 'id="machine"' not in dom:
        problems.append("missing section: machine and build")
    m = re.search(r'data-broken-images="(\d+)"', dom)
    if not m:
        problems.append("the page's image check did not run (no data-broken-images on <body>)")
    elif m.group(1) != "0":
        problems.append(f"{m.group(1)} image(s) did not decode")
    sections = re.split(r'(?=<h2 id=")', dom)
    for s in data.get("suites", []):
        name = s["name"]
        section = next((x for x in sections if x.startswith(f'<h2 id="suite-{name}"')), None)
        if section is None:
            problems.append(f"missing section for suite {name}")
            continue
        if name in PLOTTED and s.get("rows") and 'class="plot"' not in section:
            problems.append(f"missing plot for suite {name} ({len(s['rows'])} rows recorded)")
        for plot_id, wanted in REQUIRED_PLOTS.get(name, []):
            if any(wanted(r) and r.get("metrics") for r in s.get("rows", [])) and \
                    f'id="plot-{name}-{plot_id}"' not in section:
                problems.append(f"missing plot {plot_id} for suite {name}")
    if args.screenshot:
        shot = run_chromium(args.chromium, page, ["--window-size=1200,4000", f"--screenshot={args.screenshot}"])
        if shot.returncode != 0:
            problems.append(f"screenshot failed: {shot.stderr[-500:]}")
    plots = dom.count('class="plot"')
    if problems:
        print(f"check_report: {page}: {len(problems)} problem(s)")
        for p in problems:
            print("  " + p)
        return 1
    print(f"check_report: {page}: {len(data.get('suites', []))} suite sections and {plots} plots render "
          "without console errors")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
