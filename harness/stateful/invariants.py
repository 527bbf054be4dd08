"""The invariant catalogue: every rule the fuzz machine checks, by a stable name.

Replay files, failures and the pytest replay items carry these names, so a name here is
an interface: rename one and old replay files stop explaining themselves.
"""

from __future__ import annotations

INVARIANTS: dict[str, str] = {
    "no_empty_abort": "an ABORT frame always carries at least one request id",
    "abort_exactly_once": "each dropped or aborted live request is aborted exactly once",
    "abort_at_owner": "an ABORT goes to the engine that received the request's ADD",
    "no_abort_after_finish": "no ABORT for an id whose final output the frontend had seen",
    "no_abort_for_unknown_ids": "no ABORT for ids the frontend never sent",
    "no_unrequested_abort": "no ABORT for a live request nobody dropped or aborted",
    "abort_coalesced": "one abort pass sends at most one ABORT frame per engine",
    "routing": "ADDs go to a known engine; an explicit data_parallel_rank is honoured, "
               "an invalid one rejected",
    "stream_state": "a live stream stays open; a finished one ends with the right reason",
    "stream_tokens": "a stream carries exactly the tokens its engine sent while it was live",
    "stream_text": "a stream's text is its tokens detokenized, cut before a matched stop string",
    "config_aggregation": "max_model_len is the engines' minimum, num_gpu_blocks their sum, "
                          "block_size theirs",
    "stream_ends_once": "a stream ends exactly once and gets no output after its end",
    "utility_aggregation": "is_sleeping is the engines' consensus, reset_prefix_cache their "
                           "AND; a failing engine fails the call",
    "fail_fast_after_death": "after ENGINE_CORE_DEAD no new work is sent and calls fail",
    "no_spurious_errors": "a call on a healthy frontend with valid arguments succeeds",
    "no_call_hangs": "every call returns, and the system quiesces, within a bound",
    "valid_frames": "every frame the frontend sends decodes under the protocol profile",
    "startup": "the frontend registers every engine",
    "unexpected_exception": "the frontend raised something other than FrontendError",
}


class InvariantViolation(AssertionError):
    """A protocol invariant broke; `invariant` is its stable name (see INVARIANTS)."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"invariant {invariant!r} violated: {detail}")
        self.invariant = invariant
        self.detail = detail
        self.failed_step: int | str | None = None  # step index, or "teardown"
