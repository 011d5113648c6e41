"""Token ids -> text deltas for streaming: one delta per token, stop strings cut off.

Tokens are decoded in small pending groups (a group that ends inside a UTF-8
sequence waits for the rest); text that could still be the start of a stop
string is held back until it cannot, so the stop string itself is never sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """A request's text, released as its tokens arrive; the stop string that ended it is cut off.

    The scheduler ends a request on the token that completes a stop string (once it has
    min_tokens tokens, as in vLLM), so the only stop string to cut is one that ends in the
    newest token's text: the last `len(longest stop) - 1` characters, and such a stop string,
    are held back until the next token shows the request goes on (a stop string seen before
    min_tokens is then text like any other) or the finish cuts it.
    """

    def __init__(self, detokenize: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._detokenize = detokenize
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending: list[int] = []
        self._last_start = 0    # where the newest token's text begins
        self.text = ""          # decoded so far
        self.num_sent = 0       # characters of `text` already handed out

    def push(self, token_ids: Sequence[int]) -> list[str]:
        """One text delta per token (possibly empty while held back)."""
        deltas = []
        for token in token_ids:
            self._pending.append(token)
            piece = self._detokenize(self._pending)
            if not piece.endswith("\ufffd"):
                self._last_start = len(self.text)
                self.text += piece
                self._pending.clear()
            deltas.append(self._release(min(len(self.text) - self._hold, self._stop_at())))
        return deltas

    def finish(self, finish_reason: str | None) -> str:
        """The rest of the text; a stop string ending in the newest token's text, and whatever
        follows it, are dropped."""
        if self._pending:
            self._last_start = len(self.text)
            self.text += self._detokenize(self._pending)
            self._pending.clear()
        end = min(len(self.text), self._stop_at()) if finish_reason == "stop" else len(self.text)
        self.text = self.text[:end]
        return self._release(end)

    def _stop_at(self) -> int:
        """Where a stop string that ends in the newest token's text starts (the text's length if none)."""
        hits = [self.text.find(s, max(self._last_start - len(s) + 1, self.num_sent)) for s in self._stop]
        return min((i for i in hits if i >= 0), default=len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.num_sent:
            return ""
        delta = self.text[self.num_sent:upto]
        self.num_sent = upto
        return delta
