#!/usr/bin/python3
"""Renders a memkit-bench results.json as a self-contained HTML page (plots embedded as data
URIs, opens from disk) and, with --markdown, as a Markdown summary with PNG plots beside it
(docs/RESULTS.md and docs/results/).

    memkit_report.py RESULTS_DIR [--html FILE] [--markdown FILE --png-dir DIR]

Every ratio is peer / memkit: above 1, memkit is faster (or uses less memory). Plots are drawn
with matplotlib from whatever rows the run has: a suite that did not run gives no plot, and the
page says so.
"""
import argparse
import base64
import html
import io
import json
import math
import os
import sys
from collections import OrderedDict, defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# What each suite answers, and what its article measured (quoted with units and machine).
SEEDS = OrderedDict([
    ("reserve-commit", {
        "seed": "000 \u201cReserve and commit\u201d",
        "question": "Does a contiguous array that reserves address space and commits pages on demand "
                    "(dyn_array) beat std::vector on peak memory, append throughput and worst-case append "
                    "latency, and how close does it come to the fastest way to write the same bytes?",
        "article": "The article ran on an AMD Ryzen 7 2700X with 16 GB of DDR4 (Linux: Debian, kernel 5.10.0-20), "
                   "building at -O0, -O1 and -O2. Its tables of total time (seconds) and throughput (Hz) for "
                   "DynArray and std::vector at lengths 10^3 to 10^9 are typeset as MathML, and the numbers are "
                   "not in this project's copy of the article, so none is quoted here.",
    }),
    ("gpa-degen", {
        "seed": "001 Zig GeneralPurposeAllocator PR #17383",
        "question": "Does freeing stay cheap when one block is kept in every bucket (the pattern that made "
                    "Zig's GPA walk a list of tens of thousands of buckets), in memkit's general allocator "
                    "and its drop-in malloc?",
        "article": "The PR's degenerate case (arocc, Debug, Windows): 481.263 s \u00b1 5.440 s before the change and "
                   "19.639 s \u00b1 0.037 s after (\u201c24.51 \u00b1 0.28 times faster\u201d); with "
                   "c_allocator about 3 seconds. Machine not stated in the PR.",
    }),
    ("malloc-workloads", {
        "seed": "001 (the drop-in malloc against whole allocators)",
        "question": "Is memkit's drop-in malloc as fast and as small as glibc, jemalloc, mimalloc and tcmalloc "
                    "on allocation-heavy workloads, loaded the same way (LD_PRELOAD)?",
        "article": "The seed gives no figures for these workloads; they follow mimalloc-bench's kinds of "
                   "workload (not its parameters).",
    }),
    ("block-heap", {
        "seed": "002 \u201cReady, Set, Allocate! (Part 6)\u201d",
        "question": "Does a block heap over a fixed 32 MB region in 4 KB blocks keep allocation time bounded "
                    "in the article's three tests (sizes, exhaustion, worst-case fragmentation)?",
        "article": "Pentium-4 3.0 GHz, 32-bit, 512 MB RAM, Windows XP SP3: the worst-case test took "
                   "\u201c390.5 milliseconds, to complete 1 time\u201d (one repetition, that is 8,192 allocate+free "
                   "pairs: about 48 \u00b5s per pair) up to \u201c1 hour 5 minutes 12 seconds 634.8 "
                   "milliseconds, to complete 10000 times\u201d.",
    }),
    ("small-vector", {
        "seed": "003 \u201cMemory allocation made right\u201d",
        "question": "With lengths drawn from chi-squared (8 degrees of freedom), how much faster is a small "
                    "vector with N inline elements than std::vector, Boost's small_vector and Abseil's "
                    "InlinedVector?",
        "article": "Google Benchmark on \u201c8 X 2200 MHz CPU s\u201d: PushBackVector_BaseSize0 56440 ns; "
                   "BaseSize8 18255 ns vs PushBackSmallVector 9183 ns; 12: 21918 vs 6073 ns; 16: 13196 vs "
                   "1776 ns; 32: 12384 vs 2435 ns (wall time per iteration).",
    }),
    ("vector-growth", {
        "seed": "004 \u201cCustom Vector Allocation\u201d",
        "question": "Does growing a vector in place through the allocator (realloc / resize) beat std::vector's "
                    "allocate-copy-free on push_back workloads over 1, 2 and 3 vectors?",
        "article": "Linux, 2014 (machine not stated): 1 vector: std::vector 0.0579 seconds, cVector without "
                   "realloc 0.0280 seconds, with realloc 0.0236 seconds; 2 vectors: 0.0860 / 0.0721 / 0.0495 "
                   "seconds; 3 vectors: 0.1291 / 0.0856 / 0.0618 seconds.",
    }),
    ("real-programs", {
        "seed": "real programs (Debian packages)",
        "question": "Do whole programs (sqlite3, python3, g++, redis, z3) run faster and smaller on memkit's "
                    "drop-in malloc than on the allocators they would otherwise use?",
        "article": "No seed figures: these are programs from Debian's packages with their outputs checked.",
    }),
])

MEMKIT_MARKERS = ("memkit", "dyn_array", "virtual_arena", "block_heap")


def is_memkit(subject):
    s = subject.lower()
    if s.startswith(("std::", "boost", "absl", "glibc", "jemalloc", "mimalloc", "tcmalloc", "physical")):
        return False
    return any(m in s for m in MEMKIT_MARKERS)


def num(value, default=float("nan")):
    try:
        v = float(value)
    except (TypeError, ValueError):
        return default
    return v


def param_number(text):
    try:
        return float(str(text).replace("_", "").split()[0])
    except (ValueError, IndexError):
        return None


def fmt(v, digits=3):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-2:
        return f"{v:.{digits}g}"
    return f"{v:.{digits}g}" if abs(v) < 100 else f"{v:.0f}"


def ratio_words(r, quantity="time"):
    if not (r and r > 0 and math.isfinite(r)):
        return "not comparable"
    memory = quantity in ("memory", "faults")
    if r >= 1:
        return "memkit smaller" if memory else "memkit faster"
    return "memkit larger" if memory else "memkit slower"


# ---- plotting ------------------------------------------------------------------------------

class Plots:
    """Collects figures as PNG bytes with a caption."""

    def __init__(self):
        self.items = []  # (suite, name, caption, png bytes)

    def add(self, suite, name, caption, fig):
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        self.items.append((suite, name, caption, buf.getvalue()))

    def of(self, suite):
        return [i for i in self.items if i[0] == suite]


def rows_of(suite, experiment=None):
    return [r for r in suite.get("rows", []) if experiment is None or r.get("experiment") == experiment]


def metric(row, name):
    m = row.get("metrics", {}).get(name)
    if not isinstance(m, dict):
        return None
    return m


def series(rows, x_param, metric_name, filt=None):
    """{subject: [(x, value, low, high)]} sorted by x."""
    out = defaultdict(list)
    for r in rows:
        if filt and not filt(r):
            continue
        x = param_number(r.get("parameters", {}).get(x_param))
        m = metric(r, metric_name)
        if x is None or m is None or m.get("value") is None:
            continue
        out[r["subject"]].append((x, num(m["value"]), num(m.get("low")), num(m.get("high"))))
    for k in out:
        out[k].sort()
    return out


def line_plot(plots, suite_name, name, caption, data, xlabel, ylabel, logx=True, logy=True, scale=1.0):
    if not data:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for subject, points in sorted(data.items(), key=lambda kv: (not is_memkit(kv[0]), kv[0])):
        xs = [p[0] for p in points]
        ys = [p[1] * scale for p in points]
        style = "-o" if is_memkit(subject) else "--s"
        ax.plot(xs, ys, style, label=subject, markersize=4, linewidth=2 if is_memkit(subject) else 1.2)
        lows = [p[2] * scale for p in points]
        highs = [p[3] * scale for p in points]
        if all(math.isfinite(v) for v in lows + highs) and points:
            ax.fill_between(xs, lows, highs, alpha=0.15)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    plots.add(suite_name, name, caption, fig)
    return True


def ratio_bars(plots, suite_name, name, caption, groups, ylabel):
    """groups: {group: {peer: (ratio, low, high)}} with ratio = peer / memkit."""
    if not groups:
        return False
    peers = sorted({p for g in groups.values() for p in g})
    fig, ax = plt.subplots(figsize=(max(7.5, 1.1 * len(groups) + 2), 4.4))
    width = 0.8 / max(1, len(peers))
    labels = list(groups)
    for i, peer in enumerate(peers):
        xs, ys, errs_low, errs_high = [], [], [], []
        for j, g in enumerate(labels):
            if peer not in groups[g]:
                continue
            r, lo, hi = groups[g][peer]
            xs.append(j + i * width - 0.4 + width / 2)
            ys.append(r)
            errs_low.append(max(0.0, r - lo) if math.isfinite(lo) else 0.0)
            errs_high.append(max(0.0, hi - r) if math.isfinite(hi) else 0.0)
        ax.bar(xs, ys, width, label=peer, yerr=[errs_low, errs_high], capsize=2)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_yscale("log")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax.text(0.01, 0.98, "above 1: memkit faster / smaller; below 1: memkit slower / larger",
            transform=ax.transAxes, fontsize=7, va="top")
    plots.add(suite_name, name, caption, fig)
    return True


def plot_reserve_commit(plots, s):
    rows = rows_of(s, "build")
    growth = series(rows, "elements", "peak_rss_growth")
    line_plot(plots, s["name"], "peak-rss", "Peak RSS against length, log axes: " +
              ("growth over the child's baseline, min-max shaded." if growth else "the child's ru_maxrss."),
              growth or series(rows, "elements", "peak_rss"), "elements appended", "peak RSS (bytes)")
    line_plot(plots, s["name"], "appends-per-s", "Appends per second against length, log axes (higher is better).",
              series(rows, "elements", "appends_per_s"), "elements appended", "appends per second")
    # Append latency: the histogram rows hold counts per power-of-two bucket, ">=Xns".
    hist = rows_of(s, "append-latency-histogram")
    if hist:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        drawn = False
        for r in hist:
            buckets = []
            for k, m in r.get("metrics", {}).items():
                if k.startswith(">=") and k.endswith("ns"):
                    buckets.append((num(k[2:-2]), num(m.get("value"), 0.0)))
            buckets.sort()
            total = sum(c for _, c in buckets)
            if total <= 0:
                continue
            xs, ys, seen = [], [], 0.0
            for lower, count in buckets:
                seen += count
                xs.append(max(lower, 0.1) * 2)  # upper edge of [lower, 2*lower)
                ys.append(1 - seen / total)
            ys = [max(y, 0.5 / total) for y in ys]
            ax.step(xs, ys, where="post", label=r["subject"], linewidth=2 if is_memkit(r["subject"]) else 1.2)
            drawn = True
        if drawn:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("append latency (ns, upper edge of the power-of-two bucket)")
            ax.set_ylabel("fraction of appends slower (1 - CDF)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
            elements = hist[0].get("parameters", {}).get("elements", "?")
            plots.add(s["name"], "append-latency", f"Append latency distribution at {elements} elements: fraction of "
                      "appends slower than x (complementary CDF, log axes); the tail is the worst appends.", fig)
        else:
            plt.close(fig)


def warm_rows(rows):
    """The warm-process rows where a suite measured both kinds (results without a "process"
    parameter measured fresh processes only and are kept whole)."""
    if any(r.get("parameters", {}).get("process") == "warm" for r in rows):
        return [r for r in rows if r.get("parameters", {}).get("process") == "warm"]
    return rows


def plot_block_heap(plots, s):
    for experiment, x, caption in (("exhaustion", "repetitions", "Test 2 (exhaustion): time per allocate+free "
                                    "against repetitions, in warm processes (the heap served a mixed phase first)."),
                                   ("worst-case", "repetitions", "Test 3 (worst case): time per allocate+free "
                                    "against repetitions, per region size.")):
        rows = warm_rows(rows_of(s, experiment))
        data = series(rows, x, "alloc+free")
        if experiment == "worst-case":
            data = defaultdict(list)
            for r in rows:
                xv = param_number(r.get("parameters", {}).get(x))
                m = metric(r, "alloc+free")
                if xv is None or m is None:
                    continue
                data[r["subject"] + " " + r.get("parameters", {}).get("region", "")].append(
                    (xv, num(m.get("value")), num(m.get("low")), num(m.get("high"))))
            for k in data:
                data[k].sort()
        line_plot(plots, s["name"], experiment, caption, data, x, "time per allocate+free (ns)")
    rows = warm_rows(rows_of(s, "sizes"))
    line_plot(plots, s["name"], "sizes", "Test 1 (sizes): time per allocate+free (loop) against the request size, "
              "in warm processes (the heap served a mixed phase first).",
              series(rows, "size", "alloc+free (loop)"), "request size (bytes)", "time per allocate+free (ns)")


def plot_small_vector(plots, s):
    rows = rows_of(s, "push-back-chi-squared-lengths")
    elements = sorted({r.get("parameters", {}).get("element", "") for r in rows})
    for e in elements:
        data = series(rows, "N", "time_per_push_back", lambda r, e=e: r.get("parameters", {}).get("element") == e)
        line_plot(plots, s["name"], "time-vs-n-" + "".join(c for c in e if c.isalnum()),
                  f"Time per push_back against the inline capacity N ({e} elements).", data, "N (inline elements)",
                  "time per push_back (ns)", logx=False, logy=True)


def plot_vector_growth(plots, s):
    for experiment in sorted({r.get("experiment") for r in rows_of(s)}):
        rows = rows_of(s, experiment)
        data = series(rows, "vectors", "per_push_back")
        if not data:
            data = series(rows, "vectors", "cpu_time")
        line_plot(plots, s["name"], experiment, f"{experiment}: time per push_back against the number of vectors.",
                  data, "vectors grown together", "time per push_back (ns)", logx=False, logy=False)


def plot_gpa_degen(plots, s):
    rows = rows_of(s)
    line_plot(plots, s["name"], "time-vs-rounds", "Time per operation against rounds (flat is the goal).",
              series(rows, "rounds", "time"), "rounds", "time per operation (ns)", logx=True, logy=True)


def peer_ratio_groups(rows, group_key, metric_name, memkit_subject_pred):
    """Per group (workload), peer / memkit for `metric_name` with the spread when rows have it."""
    by_group = defaultdict(dict)
    for r in rows:
        g = (r.get("parameters", {}).get(group_key) if group_key else None) or r.get("experiment")
        m = None
        for name in (metric_name,) if isinstance(metric_name, str) else metric_name:
            m = m or metric(r, name)
        if m is None or m.get("value") in (None, 0):
            continue
        by_group[g][r["subject"]] = m
    groups = OrderedDict()
    for g, subjects in by_group.items():
        memkit = [k for k in subjects if memkit_subject_pred(k)]
        if not memkit:
            continue
        mk = subjects[memkit[0]]
        mv = num(mk["value"])
        out = {}
        for peer, m in subjects.items():
            if is_memkit(peer):
                continue
            pv = num(m["value"])
            lo = num(m.get("low")) / num(mk.get("high")) if m.get("low") is not None and mk.get("high") else float("nan")
            hi = num(m.get("high")) / num(mk.get("low")) if m.get("high") is not None and mk.get("low") else float("nan")
            out[peer] = (pv / mv, lo, hi)
        if out:
            groups[g] = out
    return groups


def plot_malloc_workloads(plots, s):
    # The quoted figures come from warm processes (time, peak RSS net of the process baseline, minor
    # faults); fresh processes are drawn for comparison. Older results have no "process" parameter.
    pred = lambda k: k.startswith("memkit (LD_PRELOAD)")  # noqa: E731
    time_metrics = ("time", "time_per_free")
    for name, metric_name, label, quantity, process in (
            ("ratios-time", time_metrics, "time", "time", "warm"),
            ("ratios-peak_rss", "peak_rss", "peak RSS net of the process baseline", "memory", "warm"),
            ("ratios-minor_faults", "minor_faults", "minor page faults", "memory", "warm"),
            ("ratios-time-fresh", time_metrics, "time", "time", "fresh")):
        rows = [r for r in rows_of(s) if r.get("parameters", {}).get("process", process) == process]
        groups = peer_ratio_groups(rows, None, metric_name, pred)
        ratio_bars(plots, s["name"], name,
                   f"Allocator workloads in {process} processes: peer / memkit {label} (drop-in, LD_PRELOAD); bars above 1: memkit "
                   f"{'faster' if quantity == 'time' else 'smaller'}. Whiskers: min-max over repetitions where stored.",
                   groups, f"peer / memkit {label}")


def plot_real_programs(plots, s):
    rows = [r for r in rows_of(s) if r.get("parameters", {}).get("process", "warm") == "warm"]
    if not rows:
        return
    # Wall time first (the suite's headline), then memory and faults; derived metrics (the suite's
    # own ratios and the extremes) are not plotted as quantities.
    present = {k for r in rows for k in r.get("metrics", {})}
    metric_names = [k for k in ("time", "wall_time", "peak_rss", "page_faults") if k in present]
    if not metric_names:
        metric_names = sorted(k for k in present if not k.endswith(("_min", "_max")) and "_vs_" not in k)[:2]
    for metric_name in metric_names:
        groups = peer_ratio_groups(rows, "program", metric_name, is_memkit)
        ratio_bars(plots, s["name"], "ratios-" + "".join(c for c in metric_name if c.isalnum()),
                   f"Real programs: peer / memkit {metric_name}; above 1: memkit better.", groups,
                   f"peer / memkit {metric_name}")


PLOTTERS = {
    "reserve-commit": plot_reserve_commit,
    "block-heap": plot_block_heap,
    "ready-set-allocate": plot_block_heap,
    "small-vector": plot_small_vector,
    "small-vector-lengths": plot_small_vector,
    "vector-growth": plot_vector_growth,
    "gpa-degen": plot_gpa_degen,
    "malloc-workloads": plot_malloc_workloads,
    "real-programs": plot_real_programs,
}


def seed_info(name):
    aliases = {"ready-set-allocate": "block-heap", "small-vector-lengths": "small-vector"}
    return SEEDS.get(aliases.get(name, name))


# ---- page ----------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0;font-size:0.9em}th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}.met{color:#11772d;font-weight:bold}.missed{color:#b00020;font-weight:bold}
.banner{background:#fff3cd;border:1px solid #e0c060;padding:0.6em;margin:1em 0}
figure{margin:1em 0}figcaption{font-size:0.85em;color:#555}img{max-width:100%}
.quote{border-left:3px solid #ccc;padding-left:0.8em;color:#444}code{background:#f5f5f5;padding:0 3px}
"""


def figure_row_html(suite_name, f):
    met = bool(f.get("met"))
    text = f.get("text") or fmt(num(f.get("measured"))) + f.get("unit", "")
    target = f"{f.get('relation', '')} {fmt(num(f.get('target')))}{f.get('unit', '')}"
    quote = f.get("seed_quote")
    name = html.escape(f.get("name", "")) + (f"<br><small>the seed: {html.escape(quote)}</small>" if quote else "")
    return (f"<tr><td>{html.escape(suite_name)}</td><td>{name}</td>"
            f"<td>{html.escape(text)}</td><td>{html.escape(target)}</td>"
            f"<td class='{'met' if met else 'missed'}'>{'met' if met else 'missed'}</td></tr>")


def load_sentence(data):
    """What a reader must know when the machine was busy (1-minute load above 1.5 at either end)."""
    m = data.get("machine", {})
    start, end = m.get("load_average_at_start") or [], m.get("load_average_at_end") or []
    if not any(x and x[0] > 1.5 for x in (start, end)):
        return ""
    ends = f"load average {', '.join(fmt(x) for x in start) or '?'} at the start"
    if end:
        ends += f" and {', '.join(fmt(x) for x in end)} at the end"
    return (f"The machine was shared with other builds and tests and loaded during this run ({ends}, on "
            f"{m.get('cores', '?')} cores): absolute times are noisy; ratios are of subjects measured side by side, "
            "interleaved.")


def build_html(data, plots, results_dir):
    suites = data.get("suites", [])
    out = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
           "<title>memkit benchmark report</title>", f"<style>{CSS}</style></head><body>",
           "<h1 id='top'>memkit benchmark report</h1>"]
    status = data.get("status", "?")
    out.append(f"<p>Profile <b>{html.escape(str(data.get('profile')))}</b>, {html.escape(str(data.get('date')))}, "
               f"status <b>{html.escape(status)}</b>, {fmt(num(data.get('elapsed_seconds')))} s of "
               f"about {fmt(num(data.get('estimated_seconds')))} s estimated. Raw rows: "
               f"<code>results.json</code>, <code>results.csv</code> beside this page.</p>")
    if status != "complete":
        out.append(f"<div class='banner'>This run did not complete ({html.escape(status)}): the page shows what "
                   "it measured before it stopped.</div>")
    sentence = load_sentence(data)
    if sentence:
        out.append(f"<div class='banner'>{html.escape(sentence)}</div>")
    out.append("<p>Every ratio is <b>peer / memkit</b>: above 1, memkit is faster (or uses less memory); "
               "ranges are min-max over repetitions. A figure is checked against the target the project set.</p>")

    # Summary of targets.
    out.append("<h2 id='summary'>Summary: every target</h2>")
    total = sum(len(s.get("figures", [])) for s in suites)
    met = sum(1 for s in suites for f in s.get("figures", []) if f.get("met"))
    out.append(f"<p>{met} of {total} figures met their targets"
               f"{' (informational run: targets do not set the exit status)' if data.get('informational') else ''}."
               "</p>")
    out.append("<table id='summary-table'><tr><th>suite</th><th>figure</th><th>measured</th><th>target</th>"
               "<th>verdict</th></tr>")
    for s in suites:
        for f in s.get("figures", []):
            out.append(figure_row_html(s["name"], f))
    out.append("</table>")

    # Machine and build.
    m, b, p = data.get("machine", {}), data.get("build", {}), data.get("peers", {})
    out.append("<h2 id='machine'>Machine and build</h2><table>")
    for k, v in (("CPU", m.get("cpu")), ("cores", m.get("cores")),
                 ("memory", f"{num(m.get('memory_bytes'), 0) / 2**30:.1f} GiB"), ("kernel", m.get("kernel")),
                 ("transparent huge pages", m.get("transparent_huge_pages")),
                 ("load average at start", ", ".join(fmt(x) for x in (m.get("load_average_at_start") or []))),
                 ("load average at end", ", ".join(fmt(x) for x in (m.get("load_average_at_end") or []))),
                 ("compiler", b.get("compiler")), ("build type and flags", f"{b.get('build_type')}: {b.get('cxx_flags')}"),
                 ("git commit", f"{b.get('git_commit', '?')}{' (with uncommitted changes)' if b.get('git_dirty') else ''}")):
        out.append(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>")
    out.append("</table><p>Peer libraries and toolchain (Debian package versions):</p><table>")
    for k, v in sorted(p.items()):
        out.append(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>")
    out.append("</table>")

    # One section per seed/suite, in the seeds' order, then anything else that ran.
    ran = {s["name"]: s for s in suites}
    order = [n for n in SEEDS if n in ran or n not in ("ready-set-allocate",)]
    names = list(SEEDS) + [n for n in ran if n not in SEEDS and seed_info(n) is None]
    seen = set()
    for name in names:
        s = ran.get(name)
        if s is None:
            alias = {"block-heap": "ready-set-allocate", "small-vector": "small-vector-lengths"}.get(name)
            s = ran.get(alias) if alias else None
        if s is not None and s["name"] in seen:
            continue
        info = seed_info(name) or {"seed": name, "question": s.get("description", "") if s else "", "article": ""}
        out.append(f"<h2 id='suite-{html.escape(name)}'>{html.escape(info['seed'])}: <code>{html.escape(name)}</code></h2>")
        out.append(f"<p><b>Question.</b> {html.escape(info['question'])}</p>")
        if info.get("article"):
            out.append(f"<p class='quote'><b>The article.</b> {html.escape(info['article'])}</p>")
        if s is None:
            out.append("<p><i>This suite did not run in this report's run: no figures and no plot.</i></p>")
            continue
        seen.add(s["name"])
        out.append(f"<p>{len(s.get('rows', []))} rows, {fmt(num(s.get('seconds')))} s"
                   f"{'' if s.get('finished') else ' (interrupted: partial)'}.</p>")
        figures = s.get("figures", [])
        if figures:
            out.append("<table><tr><th>suite</th><th>figure (ours)</th><th>measured</th><th>target</th>"
                       "<th>verdict</th></tr>")
            for f in figures:
                out.append(figure_row_html(s["name"], f))
            out.append("</table>")
        else:
            out.append("<p>No target figures recorded.</p>")
        facts = s.get("facts", {})
        if facts:
            out.append("<ul>" + "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>"
                                        for k, v in facts.items()) + "</ul>")
        mine = plots.of(s["name"])
        if not mine:
            out.append("<p><i>No plot: this run recorded no rows that this suite's plots use.</i></p>")
        for _, pname, caption, png in mine:
            uri = "data:image/png;base64," + base64.b64encode(png).decode()
            out.append(f"<figure class='plot' id='plot-{html.escape(s['name'])}-{html.escape(pname)}'>"
                       f"<img alt='{html.escape(caption)}' src='{uri}'><figcaption>{html.escape(caption)}"
                       "</figcaption></figure>")
        notes = s.get("notes", [])
        if notes:
            out.append("<details><summary>Notes from the suite</summary><ul>" +
                       "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul></details>")
    # Marks on <body> how many images failed to decode, for tools/report/check_report.py (and says so
    # on the console, where a reader's browser shows it).
    out.append("<script>window.addEventListener('load',function(){var broken=0;"
               "document.querySelectorAll('img').forEach(function(i){if(!i.complete||i.naturalWidth===0)broken++;});"
               "document.body.setAttribute('data-broken-images',String(broken));"
               "if(broken)console.error(broken+' plot image(s) did not decode');});</script>")
    out.append("</body></html>")
    return "\n".join(out)


def build_markdown(data, plots, png_dir, md_path):
    rel = os.path.relpath(png_dir, os.path.dirname(os.path.abspath(md_path)))
    m, b = data.get("machine", {}), data.get("build", {})
    lines = ["# Benchmark results", "",
             "Generated by `tools/bench` (memkit-bench and tools/report/memkit_report.py) from one run; "
             "every ratio is peer / memkit (above 1: memkit faster or smaller), ranges are min-max over "
             "repetitions.", "",
             f"- profile `{data.get('profile')}`, {data.get('date')}, status: {data.get('status')}",
             f"- machine: {m.get('cpu')}, {m.get('cores')} cores, {num(m.get('memory_bytes'), 0) / 2**30:.1f} GiB, "
             f"{m.get('kernel')}, THP `{m.get('transparent_huge_pages')}`, load average at start "
             f"{', '.join(fmt(x) for x in (m.get('load_average_at_start') or []))}"
             + (f", at end {', '.join(fmt(x) for x in m['load_average_at_end'])}" if m.get("load_average_at_end") else ""),
             f"- build: {b.get('compiler')}, {b.get('build_type')} `{b.get('cxx_flags')}`, commit "
             f"`{str(b.get('git_commit', '?'))[:12]}`{' (uncommitted changes)' if b.get('git_dirty') else ''}", "",
             ] + ([load_sentence(data), ""] if load_sentence(data) else []) + [
             "## Summary: every target", "",
             "| suite | figure | measured | target | verdict |", "|---|---|---|---|---|"]

    def figure_line(suite_name, f):
        text = f.get("text") or fmt(num(f.get("measured")))
        name = f.get("name", "").replace("|", "/")
        if f.get("seed_quote"):
            name += f" (the seed: {f['seed_quote']})"
        return (f"| {suite_name} | {name} | {text.replace('|', '/')} | "
                f"{f.get('relation')} {fmt(num(f.get('target')))}{f.get('unit', '')} | "
                f"{'met' if f.get('met') else '**missed**'} |")

    for s in data.get("suites", []):
        for f in s.get("figures", []):
            lines.append(figure_line(s["name"], f))
    lines.append("")
    os.makedirs(png_dir, exist_ok=True)
    for s in data.get("suites", []):
        info = seed_info(s["name"]) or {"seed": s["name"], "question": s.get("description", ""), "article": ""}
        lines += [f"## {info['seed']}: `{s['name']}`", "", f"**Question.** {info['question']}", ""]
        if info.get("article"):
            lines += [f"> **The article.** {info['article']}", ""]
        lines.append(f"{len(s.get('rows', []))} rows, {fmt(num(s.get('seconds')))} s.")
        lines.append("")
        facts = s.get("facts", {})
        if facts:
            lines += [f"- **{k}**: {v}" for k, v in facts.items()] + [""]
        for suite, name, caption, png in plots.of(s["name"]):
            fname = f"{suite}-{name}.png"
            with open(os.path.join(png_dir, fname), "wb") as fh:
                fh.write(png)
            lines += [f"![{caption}]({rel}/{fname})", "", f"*{caption}*", ""]
    with open(md_path, "w") as fh:
        fh.write("\n".join(lines))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results_dir")
    ap.add_argument("--html", help="output page (default RESULTS_DIR/report.html)")
    ap.add_argument("--markdown", help="also write a Markdown summary here")
    ap.add_argument("--png-dir", help="where the Markdown summary's PNG plots go")
    args = ap.parse_args(argv)
    path = os.path.join(args.results_dir, "results.json")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as e:
        print(f"memkit-report: cannot read {path}: {e}", file=sys.stderr)
        return 1
    plots = Plots()
    for s in data.get("suites", []):
        plotter = PLOTTERS.get(s["name"])
        if plotter:
            try:
                plotter(plots, s)
            except Exception as e:  # a plot that cannot be drawn must not lose the page
                s.setdefault("notes", []).append(f"plot failed: {type(e).__name__}: {e}")
    html_path = args.html or os.path.join(args.results_dir, "report.html")
    with open(html_path, "w") as fh:
        fh.write(build_html(data, plots, args.results_dir))
    if args.markdown:
        build_markdown(data, plots, args.png_dir or os.path.join(os.path.dirname(args.markdown), "results"),
                       args.markdown)
    print(f"memkit-report: wrote {html_path} ({len(plots.items)} plots)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
