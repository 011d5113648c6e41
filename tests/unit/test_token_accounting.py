"""Token accounting of streamed arrivals (harness/run/metrics.py) and SSE event decoding (harness/live/client.py).

The rule: an event's token ids give its count; text-only events share the final
usage; a multi-token event is one arrival of n tokens with zero gaps inside it, so
no estimate can ever add a gap the client did not see.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.live.client import DONE, StreamError, decode_line, token_counts
from harness.run import metrics


@pytest.mark.parametrize("counts, text_lengths, usage, expected", [
    ([1, 1, 1], [1, 1, 1], None, [1, 1, 1]),
    ([3, 2, 0], [6, 4, 0], 99, [3, 2, 0]),  # ids win over any usage
    ([None, None, None, 0], [6, 6, 1, 0], 10, [4, 4, 2, 0]),  # 1 each + 7 by text: 3.2, 3.2, 0.5
    ([None, None], [3, 1], None, [1, 1]),
    ([None, None, None], [5, 5, 5], 2, [1, 1, 1]),
    ([2, None, None], [2, 3, 1], 6, [2, 3, 1]),
    ([None, None], [0, 0], 5, [3, 2]),
], ids=["one-per-event", "ids-known", "text-shares-usage", "text-no-usage", "usage-too-small", "ids-and-text",
        "empty-texts"])
def test_token_counts(counts, text_lengths, usage, expected):
    assert metrics.token_counts(counts, text_lengths, usage) == expected


def test_text_only_events_share_the_usage_by_text_length():
    assert metrics.token_counts([None, None, None, None], [6, 6, 6, 1], 10) == [3, 3, 3, 1]


def test_a_multi_token_arrival_has_zero_gaps_inside_it():
    times, counts = [10.0, 30.0, 31.0], [3, 1, 0]
    assert metrics.token_times(times, counts) == [10.0, 10.0, 10.0, 30.0]
    assert metrics.token_gaps(times, counts) == [0.0, 0.0, 20.0]
    assert metrics.arrival_gaps(times, counts) == [20.0]  # the 0-token event (usage) is no arrival


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 20)), min_size=1, max_size=30),
       st.integers(0, 400))
def test_no_estimate_creates_a_gap_the_client_did_not_see(events, usage):
    """Whatever the usage says, every non-zero token gap is a gap between two arrivals."""
    times = sorted(float(t) for t, _ in events)
    lengths = [n for _, n in events]
    counts = metrics.token_counts([None if n else 0 for n in lengths], lengths, usage)
    text_events = sum(1 for n in lengths if n)
    assert all(c >= 1 for c, n in zip(counts, lengths) if n)
    if usage >= text_events > 0:  # (with no text event there is nowhere to put the usage's tokens)
        assert sum(counts) == usage
    seen = set(metrics.arrival_gaps(times, counts))
    assert {g for g in metrics.token_gaps(times, counts) if g > 0} <= seen


# -- SSE decoding -------------------------------------------------------------------------------
def data(event: dict) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n"


@pytest.mark.parametrize("line, n_tokens, text, finish", [
    (data({"choices": [{"text": "abc", "token_ids": [1, 2, 3], "finish_reason": None}]}), 3, "abc", None),
    (data({"choices": [{"text": "abc", "finish_reason": "length"}]}), None, "abc", "length"),
    (data({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}), None, "hi", None),
    (data({"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]}), 0, "", None),
    (data({"choices": [], "usage": {"completion_tokens": 7}}), 0, "", None),
    ("data:{\"choices\": [{\"text\": \"\", \"token_ids\": [9]}]}", 1, "", None),
], ids=["ids", "text-only", "chat-delta", "chat-role-only", "usage-chunk", "held-back-text-with-ids"])
def test_decode_line(line, n_tokens, text, finish):
    arrival = decode_line(line, 123)
    assert (arrival.time_ns, arrival.n_tokens, arrival.text, arrival.finish_reason) == (123, n_tokens, text, finish)


def test_decode_line_done_error_and_other_lines():
    assert decode_line(b"data: [DONE]\n", 0) is DONE
    assert decode_line(b": keep-alive\n", 0) is None and decode_line(b"\n", 0) is None
    with pytest.raises(StreamError, match="model_error") as info:
        decode_line(data({"error": {"message": "boom", "code": "model_error"}}), 0)
    assert info.value.error["code"] == "model_error"


def test_token_counts_of_a_text_only_stream_come_from_its_final_usage():
    lines = [data({"choices": [{"text": "ab"}]}), data({"choices": [{"text": "abcd", "finish_reason": "length"}]}),
             data({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}})]
    arrivals = [decode_line(line, i) for i, line in enumerate(lines)]
    assert token_counts(arrivals) == [2, 4, 0]
