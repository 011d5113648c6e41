"""`coopsched judge FILE`: the per-token SLO applied to per-request token timings other tools recorded.

Readers turn each format into RequestTiming records (TTFT and every token gap, ms);
harness/run/slo.py judges them. Exit 0 iff the attainment reaches --attainment, 1 if
not, 2 when the file, its format or an option cannot be used (one line saying why).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from harness.run import metrics
from harness.run import slo as slo_module
from harness.run.slo import RequestTiming, Slo, SloError
from harness.verdict.slo import slo_check

FORMATS = ("auto", "aiperf", "locust", "trace")
ACCEPTED = ("accepted: aiperf's per-request profile_export.jsonl, a coopsched trace (coopsched run --json), "
            "a coopsched locust report (locust -f scenarios/concurrency2.py --report-json)")
GUIDELLM = ("guidellm's output keeps only the first and last token time of each request (a mean ITL), "
            "not every gap, so the per-token SLO cannot be judged from it")
AIPERF_SUMMARY = ("aiperf's profile_export_aiperf.json holds aggregate statistics only; judge the per-request "
                  "profile_export.jsonl next to it")
TIME_UNITS_MS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}
EPILOG = """formats:
  aiperf   profile_export.jsonl: per record metrics.time_to_first_token and metrics.inter_chunk_latency
           (values with their unit: ns, us, ms or s); a chunk of n tokens (output_sequence_length says
           how many) is one arrival: n - 1 zero gaps; records with an error miss the SLO; warm-up skipped
  trace    coopsched run --json (also --target): requests[].token_times_ms and arrival_ms, per run
  locust   the concurrency2 locust report (--report-json): its per_request list; requests cut by
           the end of the run are left out
  guidellm not accepted: its per-request stats keep only the first and last token times (a mean
           ITL), not every gap, so the per-token SLO cannot be judged from them
A request meets the SLO iff TTFT <= ttft_ms and EVERY gap <= itl_ms (never a mean); failed
requests miss it. Exit 0 iff the attainment >= --attainment, 1 if below, 2 on an unusable file or option."""


class FormatError(Exception):
    """The file cannot be judged; the message says why (the caller adds the file name)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("file", type=Path, metavar="FILE", help="per-request token timings from a load tool")
    parser.add_argument("--format", choices=FORMATS, default="auto", help="the file's format (default: sniffed)")
    parser.add_argument("--slo", type=_arg(slo_module.parse_slo), default=slo_module.parse_slo(slo_module.DEFAULT_SLO),
                        metavar="itl_ms=X,ttft_ms=Y", help=f"the per-token SLO (default {slo_module.DEFAULT_SLO})")
    parser.add_argument("--attainment", type=_arg(slo_module.parse_attainment), default=slo_module.DEFAULT_ATTAINMENT,
                        metavar="F", help="the share of requests that must meet the SLO (default 0.9)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the verdict as JSON here")


def _arg(parse: Callable):
    def convert(text: str):
        try:
            return parse(text)
        except SloError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


# -- readers ----------------------------------------------------------------------------
def _timing(rid: str, arrival_ms: float, times_ms, error=None, group=None) -> RequestTiming:
    times = list(times_ms or ())
    return RequestTiming(rid, float(times[0] - arrival_ms) if times else None, tuple(metrics.itl(times)),
                         str(error) if error else None, group)


def read_trace(data) -> tuple[list[RequestTiming], int]:
    if not (isinstance(data, list) and data and all(isinstance(r, dict) and "requests" in r for r in data)):
        raise FormatError("not a coopsched trace (want a list of runs, each with requests)")
    out = []
    for run in data:
        group = f"{run.get('scenario')}/{run.get('mode')}"
        for r in run["requests"]:
            rid = f"{group}/{r['id']}" if len(data) > 1 else str(r["id"])
            out.append(_timing(rid, r.get("arrival_ms", 0.0), r.get("token_times_ms"), r.get("error"), group))
    return out, 0


def read_locust(data) -> tuple[list[RequestTiming], int]:
    if not (isinstance(data, dict) and "samples" in data and "classic_itl_p99_ms" in data):
        raise FormatError("not a coopsched locust report (want its ok, samples, classic_itl_p99_ms keys)")
    if "per_request" not in data:
        raise FormatError("this locust report has no per-request timings (written by an older "
                          "scenarios/concurrency2.py); run locust again")
    kept = [r for r in data["per_request"] if not r.get("cut_by_stop")]
    return ([_timing(r["id"], r["arrival_ms"], r["token_times_ms"], r.get("error"), r.get("kind")) for r in kept],
            len(data["per_request"]) - len(kept))


def _ms(metric, what: str, line: int):
    """A {value, unit} metric in ms (a number or a list); None when absent."""
    if metric is None:
        return None
    if not isinstance(metric, dict) or "value" not in metric:
        raise FormatError(f"line {line}: metrics.{what} is not a {{value, unit}} record")
    unit = metric.get("unit", "ms")
    if unit not in TIME_UNITS_MS:
        raise FormatError(f"line {line}: metrics.{what} has unit {unit!r}; accepted: {', '.join(TIME_UNITS_MS)}")
    scale, value = TIME_UNITS_MS[unit], metric["value"]
    return [v * scale for v in value] if isinstance(value, list) else value * scale


def read_aiperf(lines: list[str]) -> tuple[list[RequestTiming], int]:
    out, skipped = [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise FormatError(f"line {number} is not JSON") from None
        if not isinstance(record, dict) or not ({"metrics", "metadata"} & set(record)):
            raise FormatError(f"line {number} is not an aiperf record (want metadata and metrics)")
        meta = record.get("metadata") or {}
        if (meta.get("benchmark_phase") or meta.get("credit_phase")) == "warmup":
            skipped += 1
            continue
        rid = str(meta.get("x_request_id") or record.get("record_id") or meta.get("session_num", f"line {number}"))
        error = record.get("error")
        if error:
            message = error.get("message") or error.get("type") if isinstance(error, dict) else error
            out.append(RequestTiming(rid, None, (), str(message or "error")))
            continue
        got = record.get("metrics") or {}
        ttft = _ms(got.get("time_to_first_token"), "time_to_first_token", number)
        chunks = _ms(got.get("inter_chunk_latency"), "inter_chunk_latency", number) or []
        tokens = (got.get("output_sequence_length") or {}).get("value")
        # a chunk of n tokens is one arrival: the tokens beyond one per chunk are zero gaps
        zeros = max(0, int(tokens) - len(chunks) - 1) if isinstance(tokens, (int, float)) else 0
        error = None if ttft is not None else "no time_to_first_token (not a streaming run?)"
        out.append(RequestTiming(rid, ttft, tuple(chunks) + (0.0,) * zeros, error))
    if not out and not skipped:
        raise FormatError("no aiperf records")
    return out, skipped


def sniff(text: str) -> tuple[str, object]:
    """(format, parsed content) of a file's text, or FormatError naming what it looks like."""
    try:
        data = json.loads(text)
    except ValueError:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            record = json.loads(first)
        except ValueError:
            raise FormatError("neither JSON nor JSON lines") from None
        if isinstance(record, dict) and {"metrics", "metadata"} & set(record):
            return "aiperf", text.splitlines()
        raise FormatError("JSON lines, but not aiperf records (want metadata and metrics)") from None
    if isinstance(data, list) and data and all(isinstance(r, dict) and "requests" in r for r in data):
        return "trace", data
    if isinstance(data, dict):
        if "samples" in data and "classic_itl_p99_ms" in data:
            return "locust", data
        if {"metrics", "metadata"} & set(data):
            return "aiperf", text.splitlines()
        if "benchmarks" in data:
            raise FormatError(GUIDELLM)
        if "input_config" in data or any(isinstance(v, dict) and {"unit", "avg"} <= set(v) for v in data.values()):
            raise FormatError(AIPERF_SUMMARY)
    raise FormatError("not a format coopsched judge reads")


def load(path: Path, fmt: str = "auto") -> tuple[str, list[RequestTiming], int]:
    """(format, requests, requests left out) of FILE; FormatError or OSError when it cannot be read."""
    text = path.read_bytes().decode("utf-8")
    if fmt == "auto":
        fmt, content = sniff(text)
    elif fmt == "aiperf":
        content = text.splitlines()
    else:
        try:
            content = json.loads(text)
        except ValueError:
            raise FormatError(f"not JSON, as a {fmt} file is") from None
    reader = {"aiperf": read_aiperf, "trace": read_trace, "locust": read_locust}[fmt]
    requests, left_out = reader(content)
    return fmt, requests, left_out


# -- the verdict ----------------------------------------------------------------------------
def verdict(path: Path, fmt: str, requests: list[RequestTiming], left_out: int, slo: Slo, target: float) -> dict:
    out = {"file": str(path), "format": fmt, **slo_module.evaluate(slo, requests), "attainment_target": target,
           "left_out": left_out}
    verdict_check = slo_check(out, target)
    out["ok"] = verdict_check.ok is True  # no request to judge: skipped, never a pass
    out["checks"] = [verdict_check.to_json()]
    groups = sorted({r.group for r in requests if r.group})
    if len(groups) > 1:
        out["groups"] = {g: {"requests": len(members), "slo_attainment": slo_module.attainment(slo, members)}
                         for g in groups for members in [[r for r in requests if r.group == g]]}
    return out


def print_verdict(v: dict, slo: Slo) -> None:
    fmt = lambda x: "-" if x is None else f"{x:.1f}"
    left = f" ({v['left_out']} left out)" if v["left_out"] else ""
    print(f"coopsched judge {v['file']} ({v['format']}): {_count(v['requests'], 'request')}{left}; "
          f"SLO: {slo.describe()}")
    print(f"  met {v['met']} of {v['requests']}: attainment {v['slo_attainment']:.3f} "
          f"(target {v['attainment_target']:g}) -> {'PASS' if v['ok'] else 'FAIL'}")
    g = v["gap_ms"]
    print(f"  gaps ms ({v['gap_samples']} per token): p50 {fmt(g['p50'])} p90 {fmt(g['p90'])} "
          f"p99 {fmt(g['p99'])} max {fmt(g['max'])}; TTFT ms p50 {fmt(v['ttft_ms']['p50'])} "
          f"max {fmt(v['ttft_ms']['max'])}")
    if v["worst_gaps"]:
        print("  worst gaps: " + ", ".join(f"{w['gap_ms']:.1f} ms ({w['request']})" for w in v["worst_gaps"]))
    for group, figures in v.get("groups", {}).items():
        print(f"  {group}: {_count(figures['requests'], 'request')}, attainment {figures['slo_attainment']:.3f}")
    for miss in v["misses"][:10]:
        print(f"  miss {miss['request']}: {miss['reason']}")
    if len(v["misses"]) > 10:
        print(f"  ... and {len(v['misses']) - 10} more misses")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def main(args: argparse.Namespace) -> int:
    try:
        fmt, requests, left_out = load(args.file, args.format)
        if not requests:
            raise FormatError("no request to judge")
    except (OSError, UnicodeDecodeError, FormatError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, UnicodeDecodeError):
            reason = "not UTF-8 text"
        print(f"error: {args.file}: {reason}; {ACCEPTED}", file=sys.stderr)
        return 2
    result = verdict(args.file, fmt, requests, left_out, args.slo, args.attainment)
    print_verdict(result, args.slo)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1
