"""Whose fault is a long wait: a stream running ahead, or the machine? One rule for locust and --target.

A wait (classic gap, TTFT) over its limit is a head-of-line block iff some stream (the waiting
one too: a reply sent in one lump) received more than A = rounds x R + admissions tokens in it
beyond what the waiting stream itself caught up on in the lump that ended the wait; else it is
noise (a frozen machine adds no tokens, a frozen reader or frontend delivers every stream's backlog
at once) and counts at its limit. Read on the server's tick-end stamps when every event has one,
else on client arrivals with slack (README: the stall rule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.live import client
from harness.run import metrics

LUMP_MS = 0.5  # client timeline: arrivals closer than this are one lump (a backlog read at once)
SERVER, CLIENT = "server tick ends", "client arrivals"
SPEC_KIND = "spec"  # a speculative stream's gaps are not the question (a classic stall): never capped
LUMP_SHARE = 0.4  # client timeline: a lump beyond a stream's pace, in a classic gap, may hold this share of its reply


@dataclass(frozen=True)
class Stream:
    """One request's tokens: when each arrived and (if the server says) its tick end, perf_counter ns."""
    id: str
    kind: str
    sent_ns: int
    arrivals_ns: tuple[int, ...]
    ticks_ns: tuple[int, ...] | None = None

    @classmethod
    def of(cls, id: str, kind: str, got: client.Collected) -> Stream:
        counts = got.counts
        arrivals = metrics.token_times([a.time_ns for a in got.arrivals], counts)
        stamps = [(a.event.get("coopsched") or {}).get("tick_end_ns") for a in got.arrivals]
        ticks = None
        if all(isinstance(s, int) for s, n in zip(stamps, counts) if n):  # (an empty stream has nothing to stamp)
            ticks = tuple(metrics.token_times([s for s, n in zip(stamps, counts) if n], [n for n in counts if n]))
        return cls(id, kind, got.sent_ns, tuple(arrivals), ticks)

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "sent_ns": self.sent_ns, "arrivals_ns": list(self.arrivals_ns),
                "ticks_ns": None if self.ticks_ns is None else list(self.ticks_ns)}

    @classmethod
    def from_json(cls, d: dict) -> Stream:
        ticks = d.get("ticks_ns")
        return cls(d["id"], d["kind"], d["sent_ns"], tuple(d["arrivals_ns"]), None if ticks is None else tuple(ticks))


@dataclass(frozen=True)
class Rule:
    """How many tokens of one stream a wait may hold before it is charged to a head-of-line block."""
    tokens_per_round: int          # R
    rounds: int = 1                # rounds of other work a wait may hold (the bound's spec actions)
    admissions: int = 1            # first tokens (slice 0, a prefill) a wait may hold
    pace_ms: float | None = None   # client timeline: ms per token alone (the fastest kind's, see pace_ms)
    paces: tuple[tuple[str, float], ...] = ()  # per stream kind, when known: wins over pace_ms

    def pace_of(self, kind: str | None) -> float | None:
        return dict(self.paces).get(kind, self.pace_ms) if kind is not None else self.pace_ms

    def allowance(self, timeline: str, rounds: int = 0, admissions: int = 0, limit_ms: float = 0.0,
                  kind: str | None = None, pace: float | None = None) -> int:
        """A; `rounds` and `admissions` add a wait's own extra (requests pending in it). On client
        arrivals another stream may also stream at its own pace (of its `kind`) for `limit_ms` (judge
        passes a gap's length, a TTFT's limit): the client cannot tell a frozen reader or a stalled
        connection from a server ahead. What it can tell is a lump (lump_allowance). `pace` (ms a
        token) wins over the kind's."""
        extra = 0
        pace = pace or self.pace_of(kind)
        if timeline == CLIENT:
            extra = self.tokens_per_round  # a round read out of order
            if pace:
                extra += math.ceil(limit_ms / pace)
        return (self.rounds + rounds) * self.tokens_per_round + self.admissions + admissions + extra

    def lump_allowance(self, rounds: int, admissions: int, num_tokens: int) -> int:
        """Client arrivals, a classic gap: how many tokens of a stream's one lump may lie beyond its
        pace: A without the pace, + LUMP_SHARE of its reply (a backlog a stalled reader let build up)."""
        return self.allowance(CLIENT, rounds, admissions) + math.ceil(LUMP_SHARE * num_tokens)

    def describe(self, timeline: str) -> str:
        a = self.allowance(timeline)
        where = "on the server's tick timeline (each event carries its tick end)"
        paced = self.pace_ms or self.paces
        if timeline == CLIENT:
            paces = ", ".join(f"{k} {v:.2f}" for k, v in self.paces) or f"{self.pace_ms or 0:.2f}"
            where = (f"on the client's arrivals (no tick stamps; a lump, arrivals under {LUMP_MS:g} ms apart, counts "
                     f"in the share of the time since its stream's previous arrival that lies in the wait, and one "
                     f"more round is allowed for reordering"
                     + (f"; plus one token per pace interval (ms per token alone, sent to last token: {paces}, or "
                        f"the stream's own pace in the run when faster) of the wait in a gap and of the limit in a "
                        f"TTFT; and in a classic gap, a stream's one lump (a run of arrivals from inside the gap, "
                        f"read on for half the gap past its end) may hold at most A + {LUMP_SHARE:.0%} of that "
                        f"stream's reply beyond its pace" if paced else "") + ")")
        plus = f" + {self.tokens_per_round}" if timeline == CLIENT else ""
        return (f"a wait over its limit is a head-of-line block iff a stream (the waiting one included) received "
                f"more than A = {self.rounds} x R {self.tokens_per_round} + {self.admissions}{plus} = {a}"
                f"{' (+ pace)' if timeline == CLIENT and paced else ''} tokens made during it, "
                f"{where}, beyond the tokens the waiting stream caught up on in the lump that ended the wait; "
                f"otherwise it is noise (every stream waited alike) and counts at its limit")


@dataclass
class Wait:
    """One wait of one stream: token `index` - 1 -> `index` (index 0: sent -> first token)."""
    stream: Stream
    index: int
    limit_ms: float
    rounds: int = 0              # extra rounds and admissions this wait may hold (pending requests)
    admissions: int = 0
    ms: float = 0.0
    evidence: int = 0            # the most tokens one stream (this one included) received during it, net
    caught_up: int = 0           # tokens this stream received in the lump that ended it (1: its next token)
    by: str | None = None        # that stream's id
    allowance: int = 0
    measure: str = "count"       # what evidence counts: "count" (tokens made in it) or "lump" (beyond pace)
    charged_ms: float = 0.0      # ms, or the limit when it is over the limit but noise
    verdict: str = "ok"          # ok | noise | hol

    def to_json(self) -> dict:
        return {"stream": self.stream.id, "kind": self.stream.kind, "token": self.index, "ms": round(self.ms, 3),
                "limit_ms": round(self.limit_ms, 3), "evidence_tokens": self.evidence, "by": self.by,
                "caught_up_tokens": self.caught_up, "allowance_tokens": self.allowance, "measure": self.measure,
                "verdict": self.verdict}


def pace_ms(streams: Sequence[Stream]) -> float | None:
    """The fastest stream's ms per token over its whole life, sent to last token. Not first to last
    token: a reply that arrives in one lump (a burst) would pace at ~0 and excuse thousands of tokens;
    its tokens were made between its sending and its arrival, and no faster. Nor a median over its
    lumps: under load a lump arrives split in many, each of which would pace at ~0 again."""
    paces = [(s.arrivals_ns[-1] - s.sent_ns) / 1e6 / len(s.arrivals_ns) for s in streams
             if len(s.arrivals_ns) > 1 and s.arrivals_ns[-1] > s.sent_ns]
    return min(paces, default=None)


def own_pace_ms(stream: Stream, alone_ms: float | None) -> float | None:
    """A stream's pace on client arrivals: the faster of its kind's pace alone and its own in this run
    (sent to last token): a solo figure measured on a busier moment would call its normal pace a lump.
    None without a pace alone (bounds from costs need none)."""
    own = pace_ms([stream])
    return None if alone_ms is None else min(alone_ms, own or alone_ms)


def paces_by_kind(streams: Sequence[Stream]) -> tuple[tuple[str, float], ...]:
    """pace_ms of each kind's streams (solo runs: each kind's own pace)."""
    kinds = sorted({s.kind for s in streams})
    return tuple((k, p) for k in kinds if (p := pace_ms([s for s in streams if s.kind == k])) is not None)


def timeline(streams: Sequence[Stream]) -> str:
    return SERVER if streams and all(s.ticks_ns is not None for s in streams) else CLIENT


def waits_of(stream: Stream, gap_limit_ms: float, ttft_limit_ms: float | None = None) -> list[Wait]:
    """Every gap of a stream with one limit (and its TTFT, when given a limit for it)."""
    out = [Wait(stream, 0, ttft_limit_ms)] if ttft_limit_ms is not None and stream.arrivals_ns else []
    out += [Wait(stream, i, gap_limit_ms) for i in range(1, len(stream.arrivals_ns))]
    return out


class _Tokens:
    """One stream's tokens on a timeline, grouped into lumps (a round, or a backlog read at once)."""

    def __init__(self, times_ns: Sequence[int], sent_ns: int, lump_ns: int, exact: bool) -> None:
        self.t = np.asarray(times_ns, dtype=np.int64)
        self.exact = exact
        first = np.r_[True, np.diff(self.t) > lump_ns] if len(self.t) else np.zeros(0, dtype=bool)
        self.lump = np.flatnonzero(first)[np.cumsum(first) - 1]  # each token's lump: its first index
        # when a lump was made is unknown on the client: between the arrival before it and its own
        self.hi = self.t[self.lump]
        self.lo = np.where(self.lump > 0, self.t[np.maximum(self.lump - 1, 0)], sent_ns)

    def caught_up(self, index: int) -> int:
        """Tokens from `index` to the end of its lump."""
        return int(np.searchsorted(self.lump, self.lump[index], "right")) - index

    def read_with(self, start: int, end: int, after: bool = False) -> int:
        """Tokens read just before a wait (start, end] ended, within its last tenth (at least LUMP_MS),
        and with `after` as long after it: a frozen reader reads every stream's backlog at once, so only
        these can be offset by the waiting stream's catch-up; a lump read well before the end was not
        held back with it. Server stamps: all."""
        if self.exact:
            return len(self.t)
        window = max(int(LUMP_MS * 1e6), (end - start) // 10)
        upto = end + window if after else end
        return int(np.searchsorted(self.t, upto, "right") - np.searchsorted(self.t, end - window, "left"))

    def ahead(self, start: int, end: int, pace: float) -> int:
        """The most tokens one run of arrivals got ahead of `pace` (ms a token): max over i <= j of
        (j - i) - (t_j - t_i) / pace, token i arriving in the wait (start, end] or read just after it
        (the read_with window), j up to half the wait past its end (a lump released in the wait may
        be read out across its end). A round read at once is R - 1 ahead; tokens at their pace,
        about 0; a burst's reply, nearly all of it."""
        window = max(int(LUMP_MS * 1e6), (end - start) // 10)
        first, last = np.searchsorted(self.t, [start, end + window], "right")
        stop = int(np.searchsorted(self.t, end + max(window, (end - start) // 2), "right"))
        if first >= last:
            return 0
        u = np.arange(first, stop) - (self.t[first:stop] - self.t[first]) / (pace * 1e6)
        best_after = np.maximum.accumulate(u[::-1])[::-1]
        return int(np.floor((best_after - u)[: last - first].max() + 1e-9))

    def made_during(self, start: int, end: int) -> float:
        """Tokens made in (start, end]: counted on the server's stamps; on client arrivals each lump's
        tokens in proportion to the part of the interval they may have been made in that lies inside."""
        if self.exact:
            return float(np.searchsorted(self.t, end, "right") - np.searchsorted(self.t, start, "right"))
        span = self.hi - self.lo
        inside = np.clip(np.minimum(self.hi, end) - np.maximum(self.lo, start), 0, None)
        share = np.where(span > 0, inside / np.maximum(span, 1), (self.hi > start) & (self.hi <= end))
        return float(share.sum())


def lump_ns(pace: float | None) -> int:
    """Client arrivals closer than LUMP_MS are one lump, or than a quarter of the stream's pace alone
    when that is shorter: a fast stream's own next tokens (0.3 ms apart) are not a backlog read at once."""
    return int(min(LUMP_MS, pace / 4 if pace else LUMP_MS) * 1e6)


def judge(waits: list[Wait], streams: Sequence[Stream], rule: Rule) -> str:
    """Fill in each wait's length, evidence and verdict; returns the timeline the evidence was read on."""
    line = timeline(streams)
    exact = line == SERVER
    tokens = [_Tokens(s.ticks_ns if exact and s.ticks_ns is not None else s.arrivals_ns, s.sent_ns,
                      0 if exact else lump_ns(rule.pace_of(s.kind)), exact) for s in streams]
    index = {s.id: i for i, s in enumerate(streams)}
    # a stream can hold evidence only for waits its life overlaps: sent -> last token
    sent = np.array([s.sent_ns for s in streams], dtype=np.int64)
    last = np.array([t.t[-1] if len(t.t) else s.sent_ns for s, t in zip(streams, tokens)], dtype=np.int64)
    for w in waits:
        s = w.stream
        own = tokens[index[s.id]]
        end = int(own.t[w.index])
        start = s.sent_ns if w.index == 0 else int(own.t[w.index - 1])
        client_start = s.sent_ns if w.index == 0 else s.arrivals_ns[w.index - 1]
        w.ms = (s.arrivals_ns[w.index] - client_start) / 1e6
        # the lump that ended the wait was made while it waited: the server was serving this stream too
        # (on client arrivals: its tokens from there on that arrived ahead of its own pace, a backlog
        # read out in bunches under load)
        w.caught_up = own.caught_up(w.index)
        pace = None if exact else own_pace_ms(s, rule.pace_of(s.kind))
        if pace and w.index:
            w.caught_up = max(w.caught_up, 1 + own.ahead(start, end, pace))
        w.evidence, w.by, w.measure = 0, None, "count"
        w.allowance = rule.allowance(line, w.rounds, w.admissions, w.limit_ms)
        most_over = 0
        for i in np.flatnonzero((sent < end) & (last > start)):
            for measure, n, allowed in _evidence(w, streams[i], tokens[i], own, start, end, line, rule):
                # the stream most over its own allowance decides; while none is over, the one with most tokens
                if n - allowed > most_over or (most_over == 0 and n > w.evidence):
                    most_over = max(most_over, n - allowed)
                    w.evidence, w.by, w.allowance, w.measure = n, streams[i].id, allowed, measure
        if w.ms <= w.limit_ms:
            w.verdict, w.charged_ms = "ok", w.ms
        elif most_over > 0:
            w.verdict, w.charged_ms = "hol", w.ms
        else:
            w.verdict, w.charged_ms = "noise", w.limit_ms
    return line


def _evidence(w: Wait, other: Stream, theirs: _Tokens, own: _Tokens, start: int, end: int, line: str,
              rule: Rule) -> list[tuple[str, int, int]]:
    """What one stream shows against a wait, as (measure, tokens, allowed): the tokens made in it; on
    client arrivals, in a classic gap, also its one lump beyond its pace (a burst's reply)."""
    if other is w.stream:  # a reply held back and sent in one lump ran ahead of its own reader
        n = int(np.searchsorted(own.t, end, "right") - np.searchsorted(own.t, start, "right"))
        return [("count", n, rule.allowance(line, w.rounds, w.admissions, w.limit_ms, other.kind))]
    offset = min(w.caught_up - 1, theirs.read_with(start, end, after=line == CLIENT))
    pace = own_pace_ms(other, rule.pace_of(other.kind))
    # another stream may stream at its pace for a whole gap (one connection's delivery can stall
    # alone), in a TTFT for the limit (it holds the server's admission path too)
    paced_ms = max(w.ms, w.limit_ms) if w.index else w.limit_ms
    out = [("count", round(theirs.made_during(start, end)) - offset,
            rule.allowance(line, w.rounds, w.admissions, paced_ms, other.kind, pace))]
    # a catch-up that ends the waiting stream's reply: it was served in full during the wait, and
    # what another stream got after its last token was made is no block of it (a frozen reader, load 10:
    # the classic stream's last 4 tokens and a 64-token reply read at once after 198 ms)
    finished = w.caught_up > 1 and w.index + w.caught_up >= len(w.stream.arrivals_ns)
    if line == CLIENT and w.index and w.stream.kind != SPEC_KIND and pace and not finished:
        # ... but not in one lump: a burst's reply arrives at once, made while the classic stream got
        # nothing (a frozen reader's backlog is a lump too, read with the waiting stream's catch-up:
        # offset as above; what is left of a backlog is what LUMP_SHARE allows)
        out.append(("lump", theirs.ahead(start, end, pace) - offset,
                    rule.lump_allowance(w.rounds, w.admissions, len(other.arrivals_ns))))
    return out


@dataclass
class Summary:
    """What the waits of one check add up to, for the report and the printed rule."""
    timeline: str
    rule: str
    num_waits: int
    num_over: int
    num_noise: int
    num_hol: int
    worst_ms: float | None           # the longest wait (raw)
    worst_ratio: float | None        # the longest wait / its limit (the margin; > 1 is over)
    worst_hol: dict | None = None
    worst_noise: dict | None = None
    max_evidence: int = 0
    hol_waits: list = field(default_factory=list)   # the first few, for the report

    def to_json(self) -> dict:
        return {"timeline": self.timeline, "rule": self.rule, "waits": self.num_waits, "over_limit": self.num_over,
                "noise": self.num_noise, "hol": self.num_hol, "worst_ms": self.worst_ms,
                "worst_over_limit": self.worst_ratio, "worst_hol": self.worst_hol, "worst_noise": self.worst_noise,
                "max_evidence_tokens": self.max_evidence, "hol_waits": self.hol_waits}


def summarize(waits: list[Wait], line: str, rule: Rule) -> Summary:
    over = [w for w in waits if w.verdict != "ok"]
    hol = [w for w in over if w.verdict == "hol"]
    noise = [w for w in over if w.verdict == "noise"]
    worst = max(waits, key=lambda w: w.ms / w.limit_ms, default=None)
    pick = lambda ws: max(ws, key=lambda w: w.ms / w.limit_ms).to_json() if ws else None
    return Summary(line, rule.describe(line), len(waits), len(over), len(noise), len(hol),
                   None if worst is None else round(worst.ms, 3),
                   None if worst is None else round(worst.ms / worst.limit_ms, 4), pick(hol), pick(noise),
                   max((w.evidence for w in waits), default=0), [w.to_json() for w in hol[:10]])


def charged_percentile(waits: list[Wait], q: float) -> float | None:
    """The q-th percentile of the charged waits (noise counted at its limit)."""
    return float(np.percentile([w.charged_ms for w in waits], q)) if waits else None
