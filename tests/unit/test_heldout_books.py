"""The held-out rule on planted rows (a tolerance, or 1.5x the live runs' spread) and llama-server's
step books from two /metrics scrapes."""

from __future__ import annotations

import pytest

from harness.calibrate import books, heldout


@pytest.mark.parametrize("predicted, runs, passes", [
    pytest.param(109.0, [100.0] * 3, True, id="inside-tolerance"),
    pytest.param(112.0, [100.0] * 3, False, id="outside-tolerance"),
    pytest.param(112.0, [95.0, 100.0, 105.0], True, id="inside-1.5x-spread"),
    pytest.param(116.0, [95.0, 100.0, 105.0], False, id="outside-1.5x-spread"),
])
def test_the_rule_is_the_tolerance_or_one_and_a_half_spreads(predicted, runs, passes):
    row = heldout.row("aggregate_tok_s", predicted, runs)
    assert row["pass"] is passes and row["measured"] == 100.0, row


SCRAPE = {books.DECODES: 10, books.BUSY: 1.0, books.DRAFTS: 4, books.DRAFT_TOKENS: 12}


def test_server_books_undo_the_running_average_of_busy_slots():
    after = {books.DECODES: 30, books.BUSY: 2.0, books.DRAFTS: 24, books.DRAFT_TOKENS: 70}
    assert books.server_books(SCRAPE, after) == {"steps": 20, "busy_per_step": 2.5, "drafts": 20,
                                                 "draft_tokens": 58}


def test_a_server_without_the_counters_keeps_no_books():
    assert books.server_books(None, SCRAPE) is None
    assert books.server_books(SCRAPE, {k: v for k, v in SCRAPE.items() if k != books.BUSY}) is None


def test_the_live_books_are_the_runs_mean_and_none_when_a_run_had_none():
    runs = [{"steps": 10, "busy_per_step": 2.0, "drafts": 4, "draft_tokens": 12},
            {"steps": 20, "busy_per_step": None, "drafts": 6, "draft_tokens": 18}]
    assert books.mean_books(runs) == {"steps": 15.0, "busy_per_step": None, "drafts": 5.0, "draft_tokens": 15.0}
    assert books.mean_books([runs[0], None]) is None
