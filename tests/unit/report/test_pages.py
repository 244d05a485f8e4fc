"""The Markdown and HTML pages rendered from the JSON report: tables, verdict, failure details,
inline SVG plots, no network resources; the HTML is also rendered by a headless Chromium."""
import json
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from html import escape
from html import unescape as html_unescape
from html.parser import HTMLParser

import numpy as np
import pytest

from pytest_modeldiff.metrics.klstats import kl_stats, kld_histogram
from pytest_modeldiff.report.data import CANDIDATE_COLUMNS, _finite, candidate_rows, cell
from pytest_modeldiff.report.pages import html_report, markdown_report, write_html, write_markdown
from pytest_modeldiff.report.plots import histogram_svg, scatter_svg

SVG_NS = "{http://www.w3.org/2000/svg}"


def row(metric, value, threshold, passed=True):
    return {"metric": metric, "value": value, "threshold": threshold, "passed": passed}


def check(name, status="passed", rows=(), details=(), reason=None, **extra):
    return {"name": name, "status": status, "value": None, "threshold": None, "threshold_source": None,
            "rows": list(rows), "details": list(details), "reason": reason, **({"extra": extra} if extra else {})}


def candidate(name, kld_scale, size_bytes, checks, seed=0):
    """A compared candidate with llama-perplexity statistics from synthetic per-token numbers."""
    rng = np.random.default_rng(seed)
    n = 200
    ref_nll = rng.uniform(1, 4, n)
    kld = kld_scale * rng.lognormal(0, 0.5, n)
    stats = kl_stats(ref_nll, ref_nll + rng.normal(0, kld_scale, n), kld, rng.random(n) < 0.9, rng.random(n))
    return {"name": name, "path": f"/models/{name}.gguf", "runner": "llamacpp", "quant_type": name.upper(),
            "quant_class": "q8", "size": {"bytes": size_bytes, "params": 10 ** 9, "bpw": size_bytes * 8 / 1e9},
            "positions": n, "sequences": 4, "timings": {}, "quality": None,
            "metrics": {"nmse": 1e-3 * kld_scale, "max_abs": 0.5}, "kl_stats": stats.to_dict(),
            "kld_histogram": kld_histogram(kld), "checks": checks}


def layers(limit):
    return [{"name": name, "rfn_mean": rfn, "rfn_max": rfn, "cos_err": 1e-6, "sqnr_db": 40.0, "isolated_rfn": None,
             "threshold": limit, "threshold_source": "default", "passed": rfn <= limit, "kept": False}
            for name, rfn in (("embd", 1e-3), ("0", 2e-3), ("1", 0.04), ("norm", 0.05))]


def build_report() -> dict:
    """Three candidates: one passing (every plot), one failing (details, a `|` in a metric), one that
    could not be compared; round-tripped through JSON like the real report."""
    good = candidate("q8_0", 1e-3, 8_500_000_000, [
        check("weights", rows=[row("tensors within their limits", "39/39", "all")],
              weights={"layers": {"0": 4e-3, "1": 5e-3}}, limits_source="default"),
        check("kld", rows=[row("kld mean, all 200 positions", "0.001", "<= 0.01"),
                           row("kld mean, last position of 4 sequences", "0.0009", "<= 0.01")]),
        check("layers", rows=[row("rfn, worst of 4 states", "0.05", "<= 0.1")], layers=layers(0.1),
              first_offending=None, largest_jump="1", kept=0, source="in-memory"),
        check("tokens", "skipped", reason="the candidate has no tokenizer"),
    ])
    broken = candidate("broken", 0.2, 4_000_000_000, [
        check("kld", "failed", rows=[row("kld mean, all 200 positions", "0.2", "<= 0.01", False)],
              details=["sequence 'code' position 3 after 'x | y': kld 0.9"]),
        check("max_abs", rows=[row("max |diff|, all 200 positions", "2.5", "<= 5")]),
        check("layers", "failed", rows=[row("rfn, worst of 4 states", "0.05", "<= 0.01", False)],
              layers=layers(0.01), first_offending="1", largest_jump="1", kept=0, source="in-memory"),
    ], seed=1)
    report = {"format": "pytest-modeldiff report v2",
              "environment": {"versions": {"python": "3.11", "numpy": "2.0"}, "settings": {"eval_rows": 8},
                              "models_sha256": {"/models/ref": "ab" * 32}},
              "reference": {"path": "/models/ref", "runner": "hf", "quant_type": "bfloat16",
                            "size": {"bytes": 16_000_000_000, "params": 8 * 10 ** 9, "bpw": 16.0}},
              "candidates": [good, broken, {"name": "missing", "error": "FileNotFoundError: /models/missing.gguf"}]}
    return json.loads(json.dumps(_finite(report), allow_nan=False))


def md_cells(line: str) -> list[str]:
    """A Markdown table line's cells, split at unescaped pipes."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_markdown_has_the_candidate_table_failures_and_errors():
    report = build_report()
    md = markdown_report(report)
    lines = md.splitlines()
    assert lines[0].startswith("## ") and "**FAILED: broken: kld, layers; missing: error**" in lines
    tables = [md_cells(line) for line in lines if line.startswith("|")]
    escape = lambda text: text.replace("|", "\\|")
    assert [escape(h) for h, _ in CANDIDATE_COLUMNS] in tables
    for values in candidate_rows(report):  # the reference and both compared candidates
        assert [escape(cell(v)) for v in values] in tables
    assert all(len(cells) in (len(CANDIDATE_COLUMNS), 4) for cells in tables)  # no `|` broke a row
    assert ["kld mean, all 200 positions", "0.2", "<= 0.01", "FAIL"] in tables
    assert ["max \\|diff\\|, all 200 positions", "2.5", "<= 5", "ok"] in tables
    assert ["tokens", "skipped", "the candidate has no tokenizer", "skipped"] in tables
    assert "sequence 'code' position 3 after 'x | y': kld 0.9" in lines  # details verbatim, in a code block
    assert "FileNotFoundError: /models/missing.gguf" in lines
    assert "Mean    KLD:" in md and "<svg" not in md and "HTML report" in md
    assert len(lines) < 300


def test_markdown_verdict_when_everything_passed():
    report = build_report()
    report["candidates"] = report["candidates"][:1]
    assert "**all checks passed**" in markdown_report(report).splitlines()


def test_nan_statistics_render():
    """The JSON spells NaN as "nan": the statistics block and plots still render."""
    report = build_report()
    report["candidates"] = [candidate("nan", float("nan"), 10 ** 9, [check("kld", "failed")])]
    report = json.loads(json.dumps(_finite(report), allow_nan=False))
    assert "nan" in markdown_report(report)
    page = html_report(report)
    assert page.count("<svg") == 1  # the histogram (all NaN); no point for the scatter


class Structure(HTMLParser):
    """Checks that every element is closed in order; collects the text and each SVG's title."""
    VOID = {"meta", "br", "hr", "img", "input", "link", "wbr"}

    def __init__(self):
        super().__init__()
        self.open, self.text, self.svg_titles, self.in_title = [], [], [], False

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)
        self.in_title = tag == "title" and self.open[-2:-1] == ["svg"]

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1:]}>"
        self.open.pop()
        self.in_title = False

    def handle_data(self, data):
        self.text.append(data)
        if self.in_title:
            self.svg_titles.append(data)


def test_html_is_well_formed_self_contained_and_has_one_svg_per_plot():
    report = build_report()
    page = html_report(report)
    assert page.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in page
    parser = Structure()
    parser.feed(page)
    parser.close()
    assert parser.open == []
    titles = parser.svg_titles
    assert page.count("<svg") == len(titles) == 6
    assert sum("per-token KLD" in t for t in titles) == 2  # both compared candidates
    assert sum("per-layer rfn" in t for t in titles) == 2 and sum("weights per layer" in t for t in titles) == 1
    assert sum(t.startswith("size vs KLD") for t in titles) == 1
    assert re.findall(r"https?://[^\s\"'<>]*", page) == ["http://www.w3.org/2000/svg"] * 6
    assert "<script" not in page.lower() and "src=" not in page.lower() and "@import" not in page
    text = "".join(parser.text)
    assert "FAILED: broken: kld, layers; missing: error" in text and "FileNotFoundError" in text
    assert "max |diff|" in text and "sequence 'code' position 3 after 'x | y'" in text
    assert '<td data-label="status" class="fail">FAIL</td>' in page
    assert '<td data-label="status" class="ok">ok</td>' in page
    assert '<td data-label="verdict" class="ok">pass</td>' in page  # the candidates table's verdicts too
    assert '<td data-label="verdict" class="fail">FAIL: kld, layers</td>' in page
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    # every label explained: the candidates table's headings, the gate, the histogram's caption
    for heading, _ in CANDIDATE_COLUMNS:
        assert f"<dt>{escape(heading)}</dt><dd>" in page
    assert "Gate <b>broken</b>: the default limits fail conversions that are wrong" in page
    assert "(below" not in page and "tokens drawn in log-spaced bins from 1e-08 to 100 nats" in text
    assert "reference runs in float32 whatever it stores" in text
    assert re.search(r"<details>\s*<summary>", page) and "ab" * 32 in text


def test_pages_are_written(tmp_path):
    report = build_report()
    write_markdown(tmp_path / "out" / "report.md", report)
    write_html(tmp_path / "out" / "report.html", report)
    assert (tmp_path / "out" / "report.md").read_text() == markdown_report(report)
    assert (tmp_path / "out" / "report.html").read_text() == html_report(report)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["report.html", "report.md"]


def test_histogram_and_scatter_svg():
    hist = ET.fromstring(histogram_svg("kld <1>", [1e-3, 1e-2, 1e-1, 1.0], [2, 0, 5], "KLD"))
    assert len(hist.findall(f"{SVG_NS}rect")) == 2  # empty bins draw nothing
    assert hist.find(f"{SVG_NS}title").text == "kld <1>"
    scatter = ET.fromstring(scatter_svg("size vs KLD", [("a", 1.0, 0.01), ("b & c", 4.0, 0.1), ("c", 10.0, 1e-3),
                                                         ("zero", 2.0, 0.0)], "GB", "KLD"))
    assert len(scatter.findall(f"{SVG_NS}circle")) == 3  # a zero has no place on a log axis
    assert "b & c" in [t.text for t in scatter.iter(f"{SVG_NS}text")]


def test_scatter_axes_fit_the_points():
    """Three sizes between 0.088 and 0.145 GB: the x axis spans about that, not 0.01 .. 1, and
    the points spread over the plot's width."""
    points = [("q8_0", 0.1448, 0.0057), ("q4_k_m", 0.1055, 0.069), ("q2_k", 0.0882, 0.56)]
    svg = ET.fromstring(scatter_svg("size vs KLD", points, "GB", "KLD"))
    xs = sorted(float(c.get("cx")) for c in svg.iter(f"{SVG_NS}circle"))
    width = float(svg.get("viewBox").split()[2])
    assert xs[-1] - xs[0] > 0.7 * width
    ticks = [float(t.text) for t in svg.iter(f"{SVG_NS}text") if t.get("y") == t.get("y") and
             re.fullmatch(r"[\d.e-]+", t.text or "")]
    x_ticks = [v for v in ticks if 0.05 < v < 0.3]
    assert len(x_ticks) >= 3 and min(ticks) >= 0.001 and 0.07 <= min(x_ticks) and max(x_ticks) <= 0.2


# --------------------------------------------------------------------------- headless Chromium
def chromium(tmp_path, *args, page=None) -> subprocess.CompletedProcess:
    """Chromium with every network fetch sent to a dead proxy: the page must need none.
    ``page``: the file to open (default: the test report written to report.html)."""
    binary = shutil.which("chromium")
    if binary is None:
        pytest.skip("chromium is not installed (CI installs Debian's chromium package)")
    if page is None:
        page = tmp_path / "report.html"
        write_html(page, build_report())
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9", *args,
                           page.as_uri()], capture_output=True, text=True, timeout=60, check=True)


def test_chromium_builds_the_dom(tmp_path):
    dom = chromium(tmp_path, "--dump-dom").stdout
    assert dom.count("<svg") == 6 and "<h2>Candidates</h2>" in dom
    for values in candidate_rows(build_report()):
        assert re.sub(r"<td[^>]*>", "<td>", dom).count("".join(f"<td>{cell(v)}</td>" for v in values)) == 1


# Measures a page in an iframe: the document's scroll width against the viewport, per table
# which columns have a cell inside the viewport (cells hidden by CSS, like the header row on
# phones, do not count), cells outside it or with clipped content, each plot's width.
MEASURE = """
function measure(doc) {
  const win = doc.defaultView, de = doc.documentElement, vw = de.clientWidth;
  const shown = c => win.getComputedStyle(c).display !== "none" && c.getClientRects().length > 0;
  const tables = [...doc.querySelectorAll("table")].map(t => {
    const rows = [...t.rows], columns = Math.max(...rows.map(r => r.cells.length));
    const seen = new Array(columns).fill(false);
    let clipped = 0, outside = 0, right = 0;
    for (const r of rows) [...r.cells].forEach((c, j) => {
      if (!shown(c)) return;
      const b = c.getBoundingClientRect();
      if (b.width > 0 && b.left >= -0.5 && b.right <= vw + 0.5) seen[j] = true; else outside++;
      if (c.scrollWidth > c.clientWidth + 1) clipped++;
      right = Math.max(right, b.right);
    });
    return {columns, visible: seen.filter(Boolean).length, outside, clipped, right};
  });
  const room = e => { const cs = win.getComputedStyle(e);
    return e.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight); };
  const plots = [...doc.querySelectorAll("svg")].map(s => [s.getBoundingClientRect().width, room(s.parentElement)]);
  return {viewport: vw, scrollWidth: de.scrollWidth, tables, plots};
}
"""
WIDTHS = (1280, 390)  # a laptop window; a phone (iPhone 12-15 portrait)


def layout(tmp_path, page: str) -> dict:
    """The page rendered by headless Chromium in an iframe of each width (Chromium keeps its
    window at least ~500 px wide, an iframe can be narrower): {width: measure(...)}."""
    frames = "".join(f'<iframe id="w{w}" style="display:block;width:{w}px;height:900px;border:0" '
                     f'srcdoc="{escape(page, quote=True)}"></iframe>' for w in WIDTHS)
    host = tmp_path / "host.html"
    host.write_text(f"""<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">{frames}
<script>{MEASURE}
window.addEventListener("load", () => {{
  const out = {{}};
  for (const w of {list(WIDTHS)}) out[w] = measure(document.getElementById("w" + w).contentDocument);
  const pre = document.createElement("pre");
  pre.id = "measured"; pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
}});
</script></body></html>""")
    dom = chromium(tmp_path, "--dump-dom", "--window-size=1800,1000", "--virtual-time-budget=5000", page=host).stdout
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return {int(w): m for w, m in json.loads(html_unescape(found.group(1))).items()}


def test_chromium_page_fits_1280_and_phone_width_with_every_column_visible(tmp_path):
    report = build_report()
    report["candidates"][0]["name"] = "a-rather-long-candidate-name-without-spaces-q4_k_m-imatrix"
    for width, m in layout(tmp_path, html_report(report)).items():
        assert m["scrollWidth"] <= m["viewport"] <= width, (width, m)  # no horizontal scrolling
        assert len(m["tables"]) == 3
        for table in m["tables"]:  # the candidates table (16 columns) and each candidate's checks
            assert table["visible"] == table["columns"] and table["outside"] == table["clipped"] == 0, (width, table)
            assert table["right"] <= m["viewport"]
        assert len(m["plots"]) == 6
        for plot_width, room in m["plots"]:  # the full width of the page's content
            assert plot_width >= room - 1, (width, plot_width, room)


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, the pixel bytes without the per-row filter byte) of an 8-bit PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunks[kind] = chunks.get(kind, b"") + data[at + 8:at + 8 + length]
        at += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert depth == 8
    stride = 1 + width * {0: 1, 2: 3, 4: 2, 6: 4}[color]
    raw = zlib.decompress(chunks[b"IDAT"])
    return width, height, b"".join(raw[r * stride + 1:(r + 1) * stride] for r in range(height))


def test_chromium_screenshot_is_not_blank(tmp_path):
    chromium(tmp_path, f"--screenshot={tmp_path / 'page.png'}", "--window-size=1200,1600")
    data = (tmp_path / "page.png").read_bytes()
    width, height, pixels = png_pixels(data)
    assert (width, height) == (1200, 1600) and len(data) > 10_000
    # a blank page filters to a handful of byte values; text, tables and colours give many
    assert len(set(pixels[::7])) > 32


def test_attribution_and_long_context_sections():
    """--modeldiff-attribution's table and bars, the long-context probe's buckets (HTML and Markdown)."""
    units = [{"name": n, "kld": k, "share": k / 0.0136} for n, k in (("embd", 1e-3), ("0", 0.01), ("1", 2e-3),
                                                                      ("norm", 1e-4), ("head", 5e-4))]
    probe = {"length": 128, "window": 32, "source": "twice the sliding window 32", "kld_mean": 0.4,
             "buckets": [{"start": 0, "stop": 32, "kld_mean": 3e-6, "kld_max": 1e-5},
                         {"start": 32, "stop": 128, "kld_mean": 0.6, "kld_max": 2.0}]}
    cand = candidate("q4_k_m", 0.05, 4_000_000_000, [
        check("layers", rows=[row("rfn, worst of 4 states", "0.05", "<= 0.45")], layers=layers(0.45),
              attribution={"units": units, "total_kld": 0.015, "sum_kld": 0.0136, "largest": units[1],
                           "positions": 200, "seconds": 12.5, "direction": "KL(reference || swapped)"}),
        check("long_context", status="failed", rows=[row("KLD mean, positions 32-127", "0.6", "<= 4 x early",
                                                         False)], long_context=probe)])
    report = json.loads(json.dumps(_finite({"format": "pytest-modeldiff report v2", "environment": {},
                                            "candidates": [cand]})))
    page = html_report(report)
    assert "per-layer attribution" in page and "KLD added by each unit" in page and "12.5 s" in page
    assert "long-context probe: 128 tokens" in page and "32-127" in page
    md = markdown_report(report)
    assert "per-layer attribution (12.5 s):" in md and "| 0 | 0.01 | 73.5 % |" in md
    assert "long-context probe (128 tokens):" in md
