"""Human-readable pages rendered from the JSON report (``report.to_json``, "pytest-modeldiff report
v2"): a Markdown summary (GitHub-flavoured, for $GITHUB_STEP_SUMMARY) and a self-contained HTML page
with inline SVG plots. Both show, in order: the verdict, the reference and environment, the
multi-candidate table, then per candidate its checks, failure details and llama-perplexity
statistics."""
from __future__ import annotations

import math
import re
from html import escape
from pathlib import Path

from ..formats.atomic import write_atomic
from ..metrics.klstats import KLStats, lines
from . import plots
from .data import CANDIDATE_COLUMNS, candidate_rows, cell, failures

TITLE = "pytest-modeldiff report"
STATUS_WORD = {"passed": "ok", "failed": "FAIL", "skipped": "skipped", "error": "ERROR"}


# --------------------------------------------------------------------------- shared content
def verdict(report: dict) -> str:
    """"all checks passed" or "FAILED: <candidate>: <check>, ...; <candidate>: ..."."""
    failed = [f"{cand['name']}: {', '.join(failures(cand))}" for cand in report["candidates"] if failures(cand)]
    return f"FAILED: {'; '.join(failed)}" if failed else "all checks passed"


def _size(size: dict | None) -> str:
    return "size unknown" if not size else f"{size['bytes'] / 1e9:.4g} GB, {size['bpw']:.4g} BPW"


def _facts(report: dict) -> list[tuple[str, str]]:
    """(label, text) lines: the reference, then the environment's versions, settings and hashes."""
    ref, env = report.get("reference"), report.get("environment") or {}
    out = []
    if ref:
        kind = ref.get("type") or ref["quant_type"]
        out.append(("reference", f"{ref['path']} ({ref['runner']}, {kind}, {_size(ref.get('size'))})"))
    if env.get("versions"):
        out.append(("versions", ", ".join(f"{k} {v}" for k, v in env["versions"].items())))
    if env.get("settings"):
        out.append(("settings", ", ".join(f"{k}={v}" for k, v in env["settings"].items())))
    out += [(f"sha256 {path}", digest) for path, digest in (env.get("models_sha256") or {}).items()]
    return out


def _check_rows(check: dict) -> list[tuple[str, str, str, str]]:
    """``metric | value | threshold | status`` rows of one check; skipped/errored ones (and any
    without rows) as a single row carrying the reason."""
    if check["status"] in ("skipped", "error"):
        return [(check["name"], check["status"], check.get("reason") or "", STATUS_WORD[check["status"]])]
    if not check["rows"]:
        return [(check["name"], cell(check["value"]), cell(check["threshold"]), STATUS_WORD[check["status"]])]
    return [(r["metric"], r["value"], r["threshold"], "ok" if r["passed"] else "FAIL") for r in check["rows"]]


def _candidate_line(cand: dict) -> str:
    """The candidate's file, runner, type and size, then what failed."""
    parts = []
    if "path" in cand:
        kind = cand.get("type") or cand["quant_type"]
        parts.append(f"{cand['path']} ({cand['runner']}, {kind}, {_size(cand.get('size'))})")
    parts.append(f"FAILED {', '.join(failures(cand))}" if failures(cand) else "all checks passed")
    return ": ".join(parts)


def _numbers(value):
    """Undo the JSON's spelling of NaN/Inf as strings (report._finite) before formatting numbers."""
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    return [_numbers(v) for v in value] if isinstance(value, list) else value


def _kl_lines(cand: dict) -> list[str]:
    return lines(KLStats(**_numbers(cand["kl_stats"]))) if cand.get("kl_stats") else []


# --------------------------------------------------------------------------- Markdown
def markdown_report(report: dict) -> str:
    """A standalone GitHub-flavoured Markdown document starting with a ``## `` heading."""
    from ..checks.registry import DEFAULT_GATE, GATES

    gate = report.get("gate", DEFAULT_GATE)
    out = [f"## {TITLE}", "", f"**{verdict(report)}**", "", f"Gate `{gate}`: the default limits {GATES.get(gate, '')}.",
           ""]
    out += [f"- {label}: `{text}`" for label, text in _facts(report)]
    out += ["", "### Candidates", "", *_md_table([h for h, _ in CANDIDATE_COLUMNS],
                                                  [[cell(v) for v in row] for row in candidate_rows(report)])]
    for cand in report["candidates"]:
        out += ["", f"### {cand['name']}", "", _candidate_line(cand), ""]
        if "error" in cand:
            out += ["Error:", "", *_fenced(str(cand["error"]).splitlines()), ""]
        if cand.get("checks"):
            out += _md_table(["metric", "value", "threshold", "status"],
                             [row for check in cand["checks"] for row in _check_rows(check)])
        for check in cand.get("checks", []):
            if check["status"] == "failed" and check["details"]:
                out += ["", f"{check['name']} failed at:", "", *_fenced(check["details"])]
        if cand.get("kl_stats"):
            out += ["", "llama-perplexity statistics:", "", *_fenced(_kl_lines(cand))]
        for check in cand.get("checks", []):
            extra = _numbers(check.get("extra", {}))
            if (extra.get("attribution") or {}).get("units"):
                out += ["", f"per-layer attribution ({extra['attribution']['seconds']:.1f} s):", "",
                        *_md_table(["unit", "KLD added alone", "share of the sum"],
                                   _attribution_rows(extra["attribution"]))]
            if (extra.get("long_context") or {}).get("buckets"):
                out += ["", f"long-context probe ({extra['long_context']['length']} tokens):", "",
                        *_md_table(["positions", "KLD mean", "KLD max"], _bucket_rows(extra["long_context"]))]
    out += ["", "Plots (KLD histograms, per-layer rfn, size vs KLD) are in the HTML report.", ""]
    return "\n".join(out)


def _md_table(head: list[str], rows: list) -> list[str]:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
    return [line(head), "|" + "---|" * len(head), *(line(r) for r in rows)]


def _fenced(text_lines: list[str]) -> list[str]:
    """A code block whose fence is longer than any backtick run inside (details quote model text)."""
    longest = max((len(run) for t in text_lines for run in re.findall("`+", t)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *text_lines, fence]


# --------------------------------------------------------------------------- HTML
STYLE = """* { box-sizing: border-box; }
body { font-family: sans-serif; margin: 0 auto; padding: 1em; max-width: 1600px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.85em; max-width: 100%; }
th, td { border: 1px solid #999; padding: 2px 5px; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }  /* long names wrap at spaces: no column leaves the page */
th { background: #eee; }
td.num { white-space: nowrap; }  /* keep 1.2e-05 whole */
td.ok { background: #dff0d8; color: #1e6b1e; }
td.fail { background: #f8d7da; color: #a00; font-weight: bold; }
td.skip { color: #777; }
p.verdict { font-size: 1.2em; font-weight: bold; padding: 0.3em 0.6em; border-radius: 4px; }
p.verdict.pass { background: #dff0d8; } p.verdict.failed { background: #f8d7da; }
.pass { color: #1e6b1e; } .failed { color: #a00; }
code, li { overflow-wrap: anywhere; }
pre { background: #f6f6f6; padding: 0.5em; white-space: pre-wrap; overflow-wrap: anywhere; }
svg { display: block; margin: 0.5em 0; width: 100%; height: auto; }  /* plots scale to the page width */
dl.legend { font-size: 0.85em; color: #444; display: grid; grid-template-columns: max-content 1fr; gap: 0 1em; }
dl.legend dt { font-weight: bold; } dl.legend dd { margin: 0; overflow-wrap: anywhere; }
@media (max-width: 760px) {  /* phones: each table row becomes a card of "column: value" lines */
  table, tbody, tr, td { display: block; width: 100%; }
  thead { display: none; }
  tr { border: 1px solid #999; margin-bottom: 0.6em; }
  td { border: none; border-bottom: 1px solid #ddd; display: grid; grid-template-columns: 40% 1fr; gap: 0.5em;
       overflow-wrap: anywhere; }
  td::before { content: attr(data-label); font-weight: bold; color: #555; }
  td.num { white-space: normal; }
  dl.legend { grid-template-columns: 1fr; }
}"""
STATUS_CLASS = {"ok": "ok", "FAIL": "fail", "ERROR": "fail", "skipped": "skip", "pass": "ok"}

# What each label of the pages means (column headings of the candidates and check tables).
COLUMN_HELP = {
    "candidate": "the converted model (its file name); the first row is the reference",
    "type": "its storage type as run: GGUF file type or HF dtype (the reference runs in float32 whatever it stores)",
    "size GB": "size of the weights in GB (10^9 bytes)",
    "BPW": "bits per weight: 8 x size / number of parameters",
    "PPL": "perplexity on the evaluated text: exp(mean negative log-likelihood of the next tokens)",
    "PPL ratio": "PPL(candidate) / PPL(reference): 1.05 is 5 % worse",
    "KLD mean": "mean KL(reference || candidate) per token, nats (0: same distribution)",
    "KLD median": "median per-token KLD, nats",
    "KLD p99": "99th percentile of the per-token KLD, nats (llama-perplexity's 99.0% KLD)",
    "KLD max": "largest per-token KLD, nats",
    "same top": "fraction of tokens whose most likely next token is the same in both models",
    "RMS Δp": "root mean square of the change of the next token's probability, q - p",
    "NMSE": "mse(candidate logits - reference logits) / var(reference logits) (llama.cpp check-nmse.py)",
    "max |diff|": "largest absolute logit difference at any position",
    "same top / GB": "same top divided by size GB: quality per GB of weights",
    "verdict": "pass, or FAIL with the checks that failed (their tables are under the candidate)",
    "metric": "what is measured, and over which positions (all positions; the last one of each sequence)",
    "value": "the candidate's measurement",
    "threshold": "the limit it must stay within (<= at most, >= at least); where it came from is in the JSON",
    "status": "ok or FAIL against the threshold (skipped: the check does not apply, with the reason)",
}


def html_report(report: dict) -> str:
    """A self-contained HTML5 page: no scripts, no external resources, plots as inline SVG. It
    fits the window from phone width up: tables wrap (cards on phones), plots take the full width."""
    from ..checks.registry import DEFAULT_GATE, GATES

    ref_name = Path(report["reference"]["path"]).name if report.get("reference") else "reference"
    headline = verdict(report)
    gate = report.get("gate", DEFAULT_GATE)
    heads = [h for h, _ in CANDIDATE_COLUMNS]
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{TITLE}</title>",
           f"<style>\n{STYLE}\n</style>", "</head>", "<body>", f"<h1>{TITLE}</h1>",
           f'<p class="verdict {"failed" if headline.startswith("FAILED") else "pass"}">{escape(headline)}</p>',
           f"<p>Gate <b>{escape(gate)}</b>: the default limits {escape(GATES.get(gate, ''))}.</p>",
           "<details>", "<summary>Reference and environment</summary>", "<ul>",
           *(f"<li>{escape(label)}: <code>{escape(text)}</code></li>" for label, text in _facts(report)),
           "</ul>", "</details>", "<h2>Candidates</h2>",
           *_html_table(heads, [[cell(v) for v in row] for row in candidate_rows(report)], status_column=True),
           _legend(heads, "KL columns are llama-perplexity's statistics over the tokens that have a next token."),
           "<p>Each candidate's table below:</p>", _legend(["metric", "value", "threshold", "status"])]
    points = [(c["name"], c["size"]["bytes"] / 1e9, _numbers(c["kl_stats"]["kld_mean"]))
              for c in report["candidates"] if c.get("size") and c.get("kl_stats")]
    points = [p for p in points if 0 < p[1] < math.inf and 0 < p[2] < math.inf]  # log axes: no 0 or NaN
    if points:
        out.append(plots.scatter_svg(f"size vs KLD mean (reference {ref_name})", points, "size of the weights, GB "
                                     "(log scale)", "KLD mean, nats (log scale)"))
        out.append("<p>Size against error: lower left is better; a point's label is its candidate.</p>")
    for cand in report["candidates"]:
        out += _html_candidate(cand, ref_name)
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def _legend(heads: list[str], extra: str = "") -> str:
    """What each column heading means (COLUMN_HELP), visible under the table."""
    items = "".join(f"<dt>{escape(h)}</dt><dd>{escape(COLUMN_HELP[h])}</dd>" for h in heads if h in COLUMN_HELP)
    return f'<dl class="legend">{items}</dl>' + (f'<p class="legend">{escape(extra)}</p>' if extra else "")


def _histogram_caption(histogram: dict) -> str:
    """What the KLD histogram leaves out, in words."""
    low, high = histogram["edges"][0], histogram["edges"][-1]
    drawn = sum(histogram["counts"])
    parts = [f"{drawn} tokens drawn in log-spaced bins from {low:g} to {high:g} nats"]
    if histogram["below"]:
        parts.append(f"{histogram['below']} with KLD under {low:g} (0 included) not drawn")
    if histogram["above"]:
        parts.append(f"{histogram['above']} above {high:g} not drawn")
    if histogram["nan"]:
        parts.append(f"{histogram['nan']} NaN (non-finite logits) not drawn")
    return "; ".join(parts)


def _html_candidate(cand: dict, ref_name: str) -> list[str]:
    title = f"{Path(cand.get('path', cand['name'])).name} vs {ref_name}"
    out = [f"<h2>{escape(cand['name'])}</h2>",
           f'<p class="verdict {"failed" if failures(cand) else "pass"}">{escape(_candidate_line(cand))}</p>']
    if "error" in cand:
        out += ['<p class="failed">Error:</p>', _pre([str(cand["error"])])]
    if cand.get("checks"):
        out += _html_table(["metric", "value", "threshold", "status"],
                           [row for check in cand["checks"] for row in _check_rows(check)], status_column=True)
    for check in cand.get("checks", []):
        if check["status"] == "failed" and check["details"]:
            out += [f"<p>{escape(check['name'])} failed at:</p>", _pre(check["details"])]
    if cand.get("kl_stats"):
        out += ["<p>llama-perplexity statistics:</p>", _pre(_kl_lines(cand))]
    histogram = cand.get("kld_histogram")
    if histogram:
        out.append(plots.histogram_svg(f"{title}: per-token KLD histogram", histogram["edges"], histogram["counts"],
                                       "per-token KL(reference || candidate), nats (log scale)",
                                       _histogram_caption(histogram)))
    for check in cand.get("checks", []):  # as report.write_layer_plots draws them
        extra = _numbers(check.get("extra", {}))
        if check["name"] == "layers" and extra.get("layers"):
            rows = extra["layers"]
            out.append(plots.rfn_svg(f"{title}: per-layer rfn", [row["name"] for row in rows],
                                     [float(row["rfn_mean"]) for row in rows], [row["threshold"] for row in rows],
                                     [row["isolated_rfn"] for row in rows]))
        if check["name"] == "layers" and (extra.get("attribution") or {}).get("units"):
            out += _html_attribution(extra["attribution"], title)
        if check["name"] == "long_context" and (extra.get("long_context") or {}).get("buckets"):
            probe = extra["long_context"]
            out += [f"<p>long-context probe: {probe['length']} tokens ({escape(str(probe['source']))}), mean KLD "
                    "by position bucket</p>",
                    *_html_table(["positions", "KLD mean", "KLD max"], _bucket_rows(probe)),
                    plots.bars_svg(f"{title}: KLD by position bucket", [f"{b['start']}-{b['stop'] - 1}"
                                                                        for b in probe["buckets"]],
                                   [b["kld_mean"] for b in probe["buckets"]], "mean KL(ref || cand) per bucket")]
        if check["name"] == "weights" and extra.get("weights", {}).get("layers"):
            per_layer = extra["weights"]["layers"]
            out.append(plots.bars_svg(f"{title}: weights per layer", list(per_layer), list(per_layer.values()),
                                      "mean ||d||/||ref|| of the layer's tensors"))
    return out


NUMBER = re.compile(r"[-+]?(\d|\.\d)[\d.]*(e[-+]?\d+)?( %)?$")


def _attribution_rows(table: dict) -> list[list[str]]:
    return [[u["name"], cell(u["kld"]), f"{100 * u['share']:.1f} %"] for u in table["units"]]


def _bucket_rows(probe: dict) -> list[list[str]]:
    return [[f"{b['start']}-{b['stop'] - 1}", cell(b["kld_mean"]), cell(b["kld_max"])] for b in probe["buckets"]]


def _html_attribution(table: dict, title: str) -> list[str]:
    """--modeldiff-attribution: the KLD each unit's candidate weights add alone, as a table and bars."""
    head = (f"<p>per-layer attribution ({escape(table['direction'])}; {table['positions']} positions, "
            f"{table['seconds']:.1f} s): sum {cell(table['sum_kld'])}, whole candidate {cell(table['total_kld'])}</p>")
    return [head, *_html_table(["unit", "KLD added alone", "share of the sum"], _attribution_rows(table)),
            plots.bars_svg(f"{title}: KLD added by each unit's weights alone", [u["name"] for u in table["units"]],
                           [u["kld"] for u in table["units"]], "mean KLD, the reference with that unit swapped")]


def _html_table(head: list[str], rows: list, status_column: bool = False) -> list[str]:
    """A table with a <thead> (hidden on phones, where each cell says its column: data-label);
    with ``status_column`` the last column is coloured by its word (ok/pass green, FAIL red)."""
    def td(text, column, last):
        text = str(text)
        css = [c for c in (STATUS_CLASS.get(text.split(":")[0]) if status_column and last else None,
                           "num" if NUMBER.match(text) else None) if c]
        attrs = f' class="{" ".join(css)}"' if css else ""
        return f'<td data-label="{escape(head[column])}"{attrs}>{escape(text)}</td>'
    body = ("<tr>" + "".join(td(c, i, i == len(r) - 1) for i, c in enumerate(r)) + "</tr>" for r in rows)
    heads = "".join(f'<th title="{escape(COLUMN_HELP[h])}">{escape(h)}</th>' if h in COLUMN_HELP
                    else f"<th>{escape(h)}</th>" for h in head)
    return ["<table>", f"<thead><tr>{heads}</tr></thead>", "<tbody>", *body, "</tbody>", "</table>"]


def _pre(text_lines: list[str]) -> str:
    return "<pre>" + escape("\n".join(text_lines)) + "</pre>"


def write_markdown(path: Path, report: dict) -> None:
    write_atomic(Path(path), markdown_report(report))


def write_html(path: Path, report: dict) -> None:
    write_atomic(Path(path), html_report(report))
