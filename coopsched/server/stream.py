"""Token ids -> text deltas for streaming: one delta per token, stop strings cut off.

Tokens are decoded in small pending groups (a group that ends inside a UTF-8
sequence waits for the rest); text that could still be the start of a stop
string is held back until it cannot, so the stop string itself is never sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, detokenize: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._detokenize = detokenize
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending: list[int] = []
        self.text = ""          # decoded so far
        self.num_sent = 0       # characters of `text` already handed out

    def push(self, token_ids: Sequence[int]) -> list[str]:
        """One text delta per token (possibly empty while held back)."""
        deltas = []
        for token in token_ids:
            self._pending.append(token)
            piece = self._detokenize(self._pending)
            if not piece.endswith("\ufffd"):
                self.text += piece
                self._pending.clear()
            deltas.append(self._release(min(len(self.text) - self._hold, self._stop_at())))
        return deltas

    def finish(self, finish_reason: str | None) -> str:
        """The rest of the text; a stop string and whatever follows it are dropped."""
        if self._pending:
            self.text += self._detokenize(self._pending)
            self._pending.clear()
        end = min(len(self.text), self._stop_at())
        self.text = self.text[:end]
        return self._release(end)

    def _stop_at(self) -> int:
        """Where the first stop string in the unsent text starts (the text's length if none)."""
        hits = [i for i in (self.text.find(s, self.num_sent) for s in self._stop) if i >= 0]
        return min(hits, default=len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.num_sent:
            return ""
        delta = self.text[self.num_sent:upto]
        self.num_sent = upto
        return delta
