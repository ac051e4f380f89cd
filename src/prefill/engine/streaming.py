"""Text out of generated token ids, as it streams: incremental detokenization that never sends what it might
have to take back (half of a UTF-8 character, or the start of a stop string). The engine and the server share it."""

from __future__ import annotations

from prefill.loading.tokenizer import Tokenizer


class TextStream:
    """Feed token ids one at a time; get back the text that is safe to send."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] | list[str] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.sent = ""  # text already handed out

    def add(self, token_id: int) -> tuple[str, bool]:
        """Append a token; return the newly safe text and whether a stop string was met (the text ends before it)."""
        self.ids.append(token_id)
        full = self.tokenizer.decode(self.ids)
        for s in self.stop:
            at = full.find(s, max(0, len(self.sent) - len(s)))
            if at >= 0:
                return self._send(full[:at]), True
        return self._send(full[: safe_length(full, self.stop)]), False

    def flush(self) -> str:
        """Everything not sent yet: at the end of a generation (EOS or the token limit) nothing is held back."""
        return self._send(self.tokenizer.decode(self.ids))

    def _send(self, upto: str) -> str:
        if len(upto) <= len(self.sent) or not upto.startswith(self.sent):
            return ""  # only ever forwards
        delta, self.sent = upto[len(self.sent) :], upto
        return delta


def safe_length(text: str, stops: tuple[str, ...]) -> int:
    """How much of `text` can be sent: hold back a partial character and any tail that may begin a stop."""
    end = len(text)
    while end and text[end - 1] == "\ufffd":  # an incomplete UTF-8 sequence: wait for its remaining bytes
        end -= 1
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, end), 0, -1):
            if text[end - n : end] == s[:n]:
                hold = max(hold, n)
                break
    return end - hold
