"""How the reference frontend turns an engine's tokens into stream text, with stop strings.

vLLM's frontends, not the engine, match stop strings: text that could still be the start
of one is held back (the stop buffer), a match ends the stream at the token completing it
with the text before it, and the engine that still runs the request is owed an ABORT.
These rules are the `StopStringRules` mixin of the reference core (core.py), one small
method each, so a mutant frontend overrides exactly one; the core provides the
attributes and hooks below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.protocol.lifecycle import Event
from harness.protocol.vocab import detokenize
from harness.protocol.wire import messages as m

if TYPE_CHECKING:
    from harness.frontends.reference.state import RequestState


class StopStringRules:
    """Stop-string rules of `ReferenceFrontendCore` (which provides the attributes below)."""

    pending_drops: list[str]  # the core's drain queue

    def _finish(self, rid: str, event: Event, reason: str | None,
                error: str | None = None) -> None:
        raise NotImplementedError

    def hold_back(self, state: RequestState) -> int:
        raise NotImplementedError

    def deliver_until_stop(self, state: RequestState, output: m.EngineCoreOutput) -> bool:
        """Token by token: a stop string ends the stream at the token completing it, with
        the text before it; the rest of the chunk is dropped (vLLM's _trim_surplus_tokens).
        Returns True when a stop string ended the stream."""
        handle = state.handle
        keep = self.hold_back(state)
        tokens = output.new_token_ids
        for i, token in enumerate(tokens):
            state.held_text += self.token_text(output, i)
            pos = self.stop_position(state) if self.stop_checked(state) else -1
            if pos >= 0:
                # Held text covers every possible match start, so pos >= len(handle.text).
                text = (handle.text + state.held_text)[len(handle.text):pos]
                state.held_text = ""
                handle.add_tokens([token], text)
                self.end_at_stop(state, engine_finished=output.finished)
                return True
            last = self.releases_held_text(output, i)
            cut = len(state.held_text) if last else max(0, len(state.held_text) - keep)
            text, state.held_text = state.held_text[:cut], state.held_text[cut:]
            handle.add_tokens([token], text)
        return False

    def stop_checked(self, state: RequestState) -> bool:
        """Whether stop strings are checked at the stream's next token (the one just added
        to the held text): only from token min_tokens + 1 on, and then only matches ending
        past the text of the first min_tokens tokens (0.33.0 detokenizer.py:134-136, from
        PR #22014; Rust decoded.rs:196)."""
        count = len(state.handle.tokens) + 1  # this token's number in the stream
        if count < state.min_tokens:
            return False
        if count == state.min_tokens:
            state.stop_floor = len(state.handle.text) + len(state.held_text)
            return False
        return True

    def token_text(self, output: m.EngineCoreOutput, index: int) -> str:
        """The text the output's token at `index` adds to the stream: none for the last
        token of an output the engine finished with STOP (EOS or a stop token id), which
        vLLM's frontends keep among the tokens but leave out of the text (0.33.0
        detokenizer.py:107-112, Rust decoded.rs:181-187)."""
        if (output.finish_reason is m.FinishReason.STOP
                and index == len(output.new_token_ids) - 1):
            return ""
        return detokenize([output.new_token_ids[index]])

    def releases_held_text(self, output: m.EngineCoreOutput, index: int) -> bool:
        """Whether the token at `index` releases every held character: the last token of
        the engine's final output (no stop string can follow it)."""
        return output.finished and index == len(output.new_token_ids) - 1

    def stop_position(self, state: RequestState) -> int:
        """Where the stop string that completes earliest in the stream's text so far starts
        (ties: the first listed), else -1: vLLM 0.33.0's check_stop_strings and Rust
        matches_stop_string. A stop string inside another (" t12" with "t12" and "1")
        completes first, so it wins although it starts later."""
        text = state.handle.text + state.held_text
        found = [(pos + len(stop), i, pos) for i, stop in enumerate(state.stop)
                 if (pos := self.find_stop(text, stop, state.stop_floor)) >= 0]
        return min(found)[2] if found else -1

    def find_stop(self, text: str, stop: str, floor: int = 0) -> int:
        """Where one stop string first occurs in the text ending past `floor` (so where it
        first completes there), else -1."""
        return text.find(stop, max(0, floor - len(stop) + 1))

    def end_at_stop(self, state: RequestState, engine_finished: bool) -> None:
        """End the stream with 'stop' (later outputs are ignored) and, unless the engine
        already finished the request, owe its engine an ABORT (STOP_PENDING, queued)."""
        if engine_finished:
            self._finish(state.request_id, Event.FINAL_OUTPUT, "stop")
            return
        self._finish(state.request_id, Event.STOP_MATCHED, "stop")
        self.pending_drops.append(state.request_id)
