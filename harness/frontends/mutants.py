"""The registry of deliberately broken reference frontends: each violates exactly one rule.

A conformance case that no broken frontend can fail proves nothing, so the self-test
(tests/test_mutants.py) runs the suites against every mutant, asserts each one is caught,
and reports the kill matrix. Each mutant core overrides one rule of the reference core;
the cores live in their area's module (mutants_<area>.py), this module only names them.

`HISTORY_MUTANTS` are bug classes taken from vLLM's own history (mutants_history.py,
docs/mutation-history.md): runnable as `mutant:NAME` like the others, but not in the kill
matrix until a case catches each one (then its row moves to `MUTANTS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.frontends import mutants_abort as ma
from harness.frontends import mutants_coordinator as mc
from harness.frontends import mutants_dp as dp
from harness.frontends import mutants_edges_a as ea
from harness.frontends import mutants_edges_b as eb
from harness.frontends import mutants_edges_c as ec
from harness.frontends import mutants_edges_d as ed
from harness.frontends import mutants_edges_e as ee
from harness.frontends import mutants_history as mh
from harness.frontends import mutants_inputs as mi
from harness.frontends import mutants_sampling as mz
from harness.frontends import mutants_streaming as ms
from harness.frontends import mutants_utility as mu
from harness.frontends.reference.core import ReferenceFrontendCore
from harness.frontends.reference.driver import ReferenceDriver
from harness.frontends.reference.frontend import CoreFactory, ReferenceFrontend


@dataclass(frozen=True)
class Mutant:
    name: str
    rule: str  # the one rule it breaks
    core: CoreFactory
    frontend_kwargs: dict[str, Any] | None = None
    frontend_class: type[ReferenceFrontend] = ReferenceFrontend  # for bugs in the I/O layer
    source: str = ""  # where the bug comes from (history mutants: the vLLM issue / PR)


def _by_name(mutants: list[Mutant]) -> dict[str, Mutant]:
    """The registry keyed by name; a name given twice is refused (the second entry would
    silently replace the first, and the kill matrix is keyed by name)."""
    registry: dict[str, Mutant] = {}
    for mutant in mutants:
        if mutant.name in registry:
            raise ValueError(f"mutant {mutant.name!r} is registered twice")
        registry[mutant.name] = mutant
    return registry


MUTANTS: dict[str, Mutant] = _by_name([
    Mutant("sleeping_first_engine", "is_sleeping taken from the first engine only",
           mu.SleepingFirstEngine),
    Mutant("reset_or", "reset_prefix_cache ORed instead of ANDed", mu.ResetPrefixCacheOr),
    Mutant("abort_wrong_engine", "ABORT sent to the wrong engine", ma.AbortWrongEngine),
    Mutant("abort_one_frame_per_id", "one ABORT frame per id (no coalescing)",
           ma.AbortOneFramePerId),
    Mutant("abort_finished_ids", "finished ids aborted on drop", ma.AbortFinishedIds),
    Mutant("empty_abort_frame", "an empty ABORT frame when nothing is live",
           ma.EmptyAbortFrame),
    Mutant("duplicate_abort", "every ABORT frame sent twice", ma.DuplicateAbort),
    Mutant("block_size_ignored", "block_size from the ready response ignored",
           dp.BlockSizeIgnored),
    Mutant("block_size_last_wins", "disagreeing block_size not detected (last wins)",
           dp.BlockSizeLastWins),
    Mutant("max_model_len_max", "max_model_len = max instead of min", dp.MaxModelLenMax),
    Mutant("gpu_blocks_last_wins", "num_gpu_blocks last-wins instead of summed",
           dp.GpuBlocksLastWins),
    Mutant("engine_dead_ignored", "ENGINE_CORE_DEAD (and lost engines) ignored",
           ms.EngineDeadIgnored),
    Mutant("error_kills_all", "a per-request ERROR ends every stream", ms.ErrorKillsAllStreams),
    Mutant("utility_first_reply_wins", "utility results paired by arrival, not call id",
           mu.UtilityFirstReplyWins),
    Mutant("utility_unbounded", "no bound on a missing utility reply", ReferenceFrontendCore,
           {"utility_timeout": math.inf}),
    Mutant("explicit_rank_ignored", "data_parallel_rank not honoured", dp.ExplicitRankIgnored),
    Mutant("stop_string_not_aborted", "stop-string match not aborted at the engine",
           ma.StopStringNotAborted),
    Mutant("startup_accepts_anything", "malformed ready frames accepted",
           dp.StartupAcceptsAnything),
    Mutant("unknown_output_fatal", "an output for an unknown id kills the client",
           ms.UnknownOutputFatal),
    Mutant("tokens_reordered", "tokens within a chunk reordered", ms.TokensReordered),
    Mutant("finish_reasons_conflated", "every finish reported as length",
           ms.FinishReasonsConflated),
    Mutant("all_to_first_engine", "no load balancing: everything to engine 0",
           dp.AllToFirstEngine),
    Mutant("sleeping_always_false", "is_sleeping always false", mu.SleepingAlwaysFalse),
    Mutant("sleeping_always_true", "is_sleeping always true", mu.SleepingAlwaysTrue),
    Mutant("reset_always_true", "reset_prefix_cache always true", mu.ResetAlwaysTrue),
    Mutant("reset_always_false", "reset_prefix_cache always false", mu.ResetAlwaysFalse),
    Mutant("utility_engine_zero_only", "utilities sent to the first engine only",
           mu.UtilityEngineZeroOnly),
    Mutant("unsolicited_reply_fatal", "a reply with an unknown call id kills the client",
           mu.UnsolicitedReplyFatal),
    Mutant("utility_reply_to_latest_call", "replies handed to the newest call",
           mu.UtilityReplyToLatestCall),
    Mutant("utility_extra_arg", "utility args carry an extra element", mu.UtilityExtraArg),
    Mutant("utility_timeout_too_short", "utility calls time out after 0.2 s",
           ReferenceFrontendCore, {"utility_timeout": 0.2}),
    Mutant("dead_leaves_calls_pending", "engine death does not fail pending utility calls",
           ReferenceFrontendCore, {"fail_calls_on_death": False}),
    Mutant("first_output_deadline", "requests fail without output within 0.5 s",
           ReferenceFrontendCore, {"first_output_deadline": 0.5}),
    Mutant("error_after_tokens_is_success", "ERROR after some tokens reported as length",
           ms.ErrorAfterTokensIsSuccess),
    Mutant("first_output_only", "only the first output of a batched message is read",
           ms.FirstOutputOnly),
    Mutant("empty_delta_finishes", "an output without tokens ends the stream",
           ms.EmptyDeltaFinishes),
    Mutant("length_reported_as_stop", "LENGTH reported as stop", ms.LengthReportedAsStop),
    Mutant("no_text", "no detokenized text", ms.NoText),
    Mutant("engine_one_unreachable", "every request sent to the first engine's identity",
           dp.EngineOneUnreachable),
    Mutant("serves_with_missing_engines", "serves before every engine registered",
           dp.ServesWithMissingEngines),
    Mutant("startup_error_unnamed", "startup timeout error does not name the engine",
           dp.StartupErrorUnnamed),
    Mutant("scheduler_stats_fatal", "scheduler stats on a message kill the client",
           ms.SchedulerStatsFatal),
    Mutant("ready_forbids_unknown_keys", "ready responses with unknown keys rejected",
           dp.ReadyForbidsUnknownKeys),
    # -- abort (cores in mutants_abort.py) --
    Mutant("abort_stop_token_finished", "requests finished by an engine STOP aborted anyway",
           ma.AbortStopTokenFinished),
    Mutant("abort_unstarted_at_first_engine",
           "requests without output yet aborted at engine 0", ma.AbortUnstartedAtFirstEngine),
    Mutant("abort_across_engines_one_frame", "one ABORT frame for all engines' ids",
           ma.AbortAcrossEnginesOneFrame),
    Mutant("abort_batch_limit_loses_ids", "ids past 8 per drain pass forgotten",
           ma.AbortBatchLimitLosesIds),
    Mutant("abort_rerouted", "drops aborted at the engine the router picks now",
           ma.AbortRerouted),
    Mutant("explicit_abort_uses_history",
           "explicit abort sends finished, dropped and aborted ids again",
           ma.ExplicitAbortUsesHistory),
    # -- dp, ready, handshake (cores in mutants_dp.py) --
    Mutant("rank_indexes_engine_list", "data_parallel_rank used as a list index (-1 = last)",
           dp.RankIndexesEngineList),
    Mutant("rank_wraps_modulo", "data_parallel_rank wrapped modulo the engine count",
           dp.RankWrapsModulo),
    Mutant("rank_off_by_one", "the last engine's rank refused (off-by-one range check)",
           dp.RankOffByOne),
    Mutant("rank_unchecked", "out-of-range data_parallel_rank sent to a missing identity",
           dp.RankUnchecked),
    Mutant("round_robin_routing", "unpinned requests rotate, ignoring in-flight load",
           dp.RoundRobinRouting),
    Mutant("snapshot_resets_inflight", "a coordinator publication resets the in-flight "
           "counts, ties to the lowest rank", dp.SnapshotResetsInflight),
    Mutant("legacy_wakeup_sent", "a FIRST_REQ wake-up sent to the DP coordinator with "
           "each request", ReferenceFrontendCore, frontend_class=dp.LegacyWakeupFrontend),
    Mutant("pinned_not_counted", "pinned requests not counted as in flight",
           dp.PinnedNotCounted),
    Mutant("inflight_never_released", "in-flight count not released when a request ends",
           dp.InflightNeverReleased),
    Mutant("wave_never_stamped", "ADDs always carry current_wave 0", dp.WaveNeverStamped),
    Mutant("wave_first_only", "the first published wave is cached forever", dp.WaveFirstOnly),
    Mutant("wave_only_while_running", "the wave moves only while engines run",
           dp.WaveFromWaveCompleteOnly),
    Mutant("dp_control_ignored", "DP control on the main output path ignored",
           dp.DpControlIgnored),
    Mutant("max_model_len_last_wins", "max_model_len from the last ready response",
           dp.ReadyMaxModelLenLastWins),
    Mutant("max_model_len_first_wins", "max_model_len from the first ready response",
           dp.ReadyMaxModelLenFirstWins),
    Mutant("gpu_blocks_engine_zero_times_n", "num_gpu_blocks = engine 0's value x count",
           dp.ReadyGpuBlocksEngineZero),
    Mutant("init_without_outputs", "INIT carries no output address", dp.InitWithoutOutputs),
    Mutant("serves_before_handshake_ready", "READY of the handshake not awaited",
           dp.ServesBeforeHandshakeReady),
    Mutant("serves_with_hello_quorum", "handshake counts engines that said HELLO only",
           dp.ServesWithHelloQuorum),
    Mutant("hello_identity_unchecked", "engines matched by arrival at HELLO and registration",
           dp.HelloIdentityUnchecked),
    Mutant("ready_sync_only_with_dp", "a single engine's ready response not applied",
           dp.ReadySyncOnlyWithDp),
    Mutant("identities_from_zero", "engine identities 0..n-1, start index ignored",
           dp.IdentitiesFromZero),
    Mutant("reported_load_ignored", "engines' reported load ignored by routing",
           dp.ReportedLoadIgnored),
    Mutant("client_index_on_add_wrong", "ADDs carry client_index 1", dp.ClientIndexOnAddOnly),
    Mutant("identity_by_arrival", "ready frames matched to engines by arrival order",
           dp.IdentityByArrival),
    # -- streaming, failure (cores in mutants_streaming.py) --
    Mutant("final_tokens_dropped", "tokens of a final output dropped",
           ms.FinalTokensDropped),
    Mutant("engine_abort_ignored", "engine-side ABORT leaves the stream open",
           ms.EngineAbortIgnored),
    Mutant("error_without_payload_is_abort", "ERROR without a RequestError reported as abort",
           ms.ErrorWithoutPayloadIsAbort),
    Mutant("eos_reported_as_length", "STOP without stop_reason (EOS) reported as length",
           ms.EosReportedAsLength),
    Mutant("stop_token_hidden", "the stop token id removed from the stream",
           ms.StopTokenHidden),
    Mutant("first_engine_outputs_only", "outputs of engines other than the first ignored",
           ms.FirstEngineOutputsOnly),
    Mutant("stop_string_per_chunk", "stop strings searched per chunk, not across chunks",
           ms.StopStringPerChunk),
    Mutant("stop_tokens_not_trimmed", "tokens after a stop string in the same chunk delivered",
           ms.StopTokensNotTrimmed),
    Mutant("stop_unchecked_on_final_output", "no stop-string check on a final output",
           ms.StopUncheckedOnFinalOutput),
    Mutant("stop_unchecked_on_first_output", "no stop-string check on the first output",
           ms.StopUncheckedOnFirstOutput),
    Mutant("unknown_id_ends_batch", "an unknown id ends the reading of a batched message",
           ms.UnknownIdEndsBatch),
    Mutant("late_outputs_appended", "outputs after a final one appended to the ended stream",
           ms.LateOutputsAppended),
    Mutant("empty_outputs_skipped", "outputs without tokens skipped, final ones too",
           ms.EmptyOutputsSkipped),
    Mutant("finished_requests_ignored", "finished_requests never read",
           ms.FinishedRequestsIgnored),
    Mutant("finished_requests_before_outputs", "finished_requests applied before the outputs",
           ms.FinishedRequestsBeforeOutputs),
    Mutant("aux_frames_dropped", "only the first frame of a message decoded",
           ms.AuxFramesDropped),
    Mutant("stats_only_is_protocol_error", "a message without outputs is fatal",
           ms.StatsOnlyIsProtocolError),
    Mutant("protocol_error_not_sticky", "undecodable message: streams fail, client serves on",
           ms.ProtocolErrorNotSticky),
    Mutant("protocol_error_skipped", "an undecodable message skipped",
           ms.ProtocolErrorSkipped),
    Mutant("death_not_recorded", "death fails in-flight work but later calls are accepted",
           ms.DeathNotRecorded),
    # -- coordinator (cores in mutants_coordinator.py) --
    Mutant("coordinator_start_wave_wakes_everyone", "START_DP_WAVE published with exclude "
           "None instead of the sender's index", mc.StartWaveWakesEveryone),
    Mutant("coordinator_exclude_rank_zero", "START_DP_WAVE always excludes rank 0",
           mc.StartWaveExcludesRankZero),
    Mutant("coordinator_duplicate_start_wave", "a start_wave for the running wave is "
           "rebroadcast again", mc.DuplicateStartWaveRebroadcast),
    Mutant("coordinator_wave_not_advanced", "wave_complete(w) leaves the wave at w",
           mc.WaveCompleteNotAdvanced),
    Mutant("coordinator_stale_wave_complete_rewinds", "a stale wave_complete(w) moves the "
           "wave back to w + 1", mc.StaleWaveCompleteRewinds),
    Mutant("coordinator_stats_only_fatal", "a stats-only coordinator message kills the "
           "coordinator", mc.StatsOnlyFatal),
    Mutant("coordinator_frontend_starts_wave", "a request sent while paused makes the "
           "coordinator publish START_DP_WAVE", mc.FrontendStartsWave),
    Mutant("coordinator_init_without_addresses", "INIT leaves out the coordinator's "
           "addresses", mc.InitWithoutCoordinator),
    Mutant("init_names_absent_coordinator", "INIT names coordinator addresses though the "
           "frontend runs no coordinator", mc.InitNamesAbsentCoordinator),
    # -- utility (cores in mutants_utility.py) --
    Mutant("utility_bool_from_engine_zero", "add_lora/remove_lora/pin_lora/wake_up answered "
           "by engine 0, not ANDed", mu.BoolAnswersFromEngineZero),
    Mutant("utility_consensus_from_engine_zero", "is_scheduler_paused/get_weight_version "
           "taken from engine 0 unchecked", mu.ConsensusFromEngineZero),
    Mutant("collective_rpc_engine_zero", "collective_rpc returns engine 0's results only",
           mu.CollectiveRpcEngineZero),
    Mutant("utility_results_arrival_order", "per-engine results in reply arrival order",
           mu.ResultsInArrivalOrder),
    Mutant("flatten_drops_nulls", "null worker results skipped while flattening",
           mu.FlattenDropsNulls),
    Mutant("flatten_recursive", "a worker's own list result spliced into the flat list",
           mu.FlattenRecursive),
    Mutant("utility_map_nulls_omitted", "null-valued map entries dropped from results",
           mu.UtilityMapNullsOmitted),
    Mutant("utility_numbers_as_double", "integers in utility results turned into floats",
           mu.UtilityNumbersAsDouble),
    Mutant("weight_checksums_engine_zero", "compute_weight_checksums from engine 0 only",
           mu.WeightChecksumsEngineZero),
    Mutant("utility_failure_ignored", "an engine's failure ignored when others answered",
           mu.FailureIgnoredWhenOthersAnswer),
    Mutant("negative_call_id_fatal", "utility replies with call id -1/-2 kill the client",
           mu.NegativeCallIdFatal),
    Mutant("duplicate_refusal_aborts_first", "refusing a live duplicate id aborts the "
           "live request with that id", mu.DuplicateRefusalAbortsFirst),
    Mutant("wake_up_tags_dropped", "wake_up's tags never reach the engines",
           mu.WakeUpTagsDropped),
    Mutant("optional_utility_args_defaulted", "optional utility arguments sent as their "
           "defaults", mu.OptionalUtilityArgsDefaulted),
    Mutant("retired_request_dropped", "a request retired without a final output is "
           "dropped and aborted", ms.RetiredRequestDropped),
    Mutant("duplicate_request_id_sent", "a live duplicate client id is sent to the engine",
           mu.DuplicateIdNotChecked),
    Mutant("request_id_never_reusable", "a finished request's client id is refused",
           mu.RequestIdNeverReusable),
    Mutant("pass_through_kv_only", "ec_transfer_params and cache_salt not forwarded",
           mu.PassThroughKvOnly),
    Mutant("kv_params_falsy_dropped", "kv_transfer_params loses its false/empty values",
           mu.KvParamsFalsyDropped),
    # -- inputs (cores in mutants_inputs.py) --
    Mutant("session_abort_owner_only", "a session's abort goes to its owner only",
           mi.SessionAbortOwnerOnly),
    Mutant("session_drop_left_to_engine", "a dropped session gets no ABORT at all",
           mi.SessionDropLeftToEngine),
    Mutant("segment_finish_ends_session", "a segment's finish ends the session's stream",
           mi.SegmentFinishEndsSession),
    Mutant("continuation_new_id", "a continuation goes out under a fresh request id",
           mi.ContinuationNewId),
    Mutant("continuation_not_resumable", "continuations are not marked resumable",
           mi.ContinuationNotResumable),
    Mutant("continuation_routed_fresh", "a continuation is routed away from its session",
           mi.ContinuationRoutedFresh),
    Mutant("close_ends_at_once", "closing the input ends the stream before the running "
           "segment finishes", mi.CloseEndsAtOnce),
    Mutant("tensors_inline", "large input tensors inlined (no aux frame)", mi.TensorsInline),
    Mutant("tensors_always_aux", "small input tensors sent as aux frames",
           mi.TensorsAlwaysAux),
    # -- mutation survivors A (cores in mutants_edges_a.py) --
    Mutant("reset_connector_flag_dropped", "reset_prefix_cache always sends "
           "reset_connector=false", ea.ResetConnectorFlagDropped),
    Mutant("reset_flags_swapped", "reset_prefix_cache sends its two flags in the wrong "
           "order", ea.ResetFlagsSwapped),
    Mutant("consensus_answers_agreement", "consensus methods answer 'engines agree' (true) "
           "instead of the value", ea.ConsensusAnswersAgreement),
    Mutant("bool_answers_as_unit", "add_lora/wake_up answer None instead of the engines' "
           "true", ea.BoolAnswersAsUnit),
    Mutant("list_loras_as_unit", "list_loras answers None", ea.ListLorasAsUnit),
    Mutant("consensus_against_engine_one", "consensus compares with engine 1's answer "
           "(fails with one engine)", ea.ConsensusAgainstEngineOne),
    Mutant("utility_failure_message_dropped", "a failed utility call's error drops the "
           "engine's message", ea.FailureMessageDropped),
    Mutant("is_sleeping_untyped", "is_sleeping passes on a non-boolean answer",
           ea.IsSleepingUntyped),
    Mutant("utility_timeout_names_every_engine", "a utility timeout names every engine, "
           "not just the silent one", ea.UtilityTimeoutNamesEveryEngine),
    Mutant("coordinator_counts_ignored", "the coordinator's load counts are ignored "
           "(scheduler_stats only)", ea.CoordinatorCountsIgnored),
    Mutant("first_publication_kept", "load counts from the first coordinator publication "
           "only", ea.FirstPublicationKept),
    Mutant("death_error_text_dropped", "engine death ends streams with no error text",
           ea.DeathErrorTextDropped),
    Mutant("disagreement_unexplained", "a consensus disagreement error shows no values",
           ea.DisagreementUnexplained),
    Mutant("unlisted_method_unit", "a utility method without a folding rule answers None",
           ea.UnlistedMethodUnit),
    Mutant("hello_twice_answered", "a repeated HELLO gets a second INIT",
           ea.HelloTwiceAnswered),
    Mutant("ready_order_unchecked", "READY accepted before HELLO or twice",
           ea.ReadyOrderUnchecked),
    Mutant("undecodable_handshake_skipped", "an undecodable handshake message is dropped, "
           "startup waits for the bound", ea.UndecodableHandshakeSkipped),
    Mutant("unexpected_identity_vague", "the unexpected-identity error names no identity",
           ea.UnexpectedIdentityVague),
    Mutant("handshake_timeout_unnamed", "a handshake timeout names no engine or stage",
           ea.HandshakeTimeoutUnnamed),
    # -- mutation survivors B (cores in mutants_edges_b.py) --
    Mutant("stop_found_by_truthiness", "a stop string at character 0 is not a match",
           eb.StopFoundByTruthiness),
    Mutant("stop_found_last", "text truncated at the last occurrence of a stop string",
           eb.StopFoundLast),
    Mutant("stop_buffer_one_short", "stop-string hold-back one character too short",
           eb.StopBufferOneShort),
    Mutant("stop_buffer_one_long", "stop-string hold-back one character too long",
           eb.StopBufferOneLong),
    Mutant("final_chunk_released_early", "held text of a final output released at its "
           "first token", eb.FinalChunkReleasedAtFirstToken),
    Mutant("unmatched_final_output_swallowed", "a final output without a stop match never "
           "ends the stream", eb.UnmatchedFinalOutputSwallowed),
    Mutant("retired_stream_closed_silently", "a request retired without a final output ends "
           "with no reason and no error", eb.RetiredStreamClosedSilently),
    Mutant("abort_stops_at_unknown_id", "explicit abort stops at the first unknown id",
           eb.AbortStopsAtUnknownId),
    Mutant("abort_list_forwarded_whole", "explicit abort forwards unknown ids to an engine",
           eb.AbortListForwardedWhole),
    Mutant("explicit_abort_no_reason", "explicitly aborted streams end without a finish "
           "reason", eb.ExplicitAbortEndsWithoutReason),
    Mutant("session_max_tokens_dropped", "session ADDs carry a default max_tokens",
           eb.SessionMaxTokensDropped),
    Mutant("session_rank_ignored", "a session's data_parallel_rank ignored",
           eb.SessionRankIgnored),
    Mutant("continuation_default_sampling", "continuations carry default sampling params",
           eb.ContinuationDefaultSampling),
    Mutant("continuation_without_external_id", "continuations carry no external_req_id",
           eb.ContinuationWithoutExternalId),
    Mutant("continuation_wave_unstamped", "continuations carry current_wave 0",
           eb.ContinuationWaveUnstamped),
    Mutant("session_failure_is_segment_boundary", "an engine ABORT/ERROR of a session's "
           "segment keeps its stream open", eb.SessionFailureIsSegmentBoundary),
    Mutant("segments_in_flight_not_counted", "a session's running segments tracked as a "
           "flag, not a count", eb.SegmentsInFlightNotCounted),
    Mutant("continuation_after_close_sent", "a continuation after the input's close is "
           "sent", eb.ContinuationAfterCloseSent),
    Mutant("continuation_of_any_live_request", "a continuation accepted for a plain "
           "request", eb.ContinuationOfAnyLiveRequest),
    Mutant("ended_session_still_continuable", "a continuation of an ended session is sent",
           eb.EndedSessionStillContinuable),
    # -- mutation survivors C (coordinator, DP) --
    Mutant("coordinator_load_ignored", "stats-only messages on the coordinator path carry "
           "no load to routing", ec.CoordinatorLoadIgnored),
    Mutant("coordinator_waiting_ignored", "only running requests count as load on the "
           "coordinator path", ec.CoordinatorWaitingIgnored),
    Mutant("coordinator_miswiring_tolerated", "request outputs / utility replies / finished "
           "ids on the coordinator path are dropped", ec.CoordinatorMiswiringTolerated),
    Mutant("coordinator_error_without_cause", "a coordinator-path failure names neither "
           "the engine nor what it sent", ec.CoordinatorErrorWithoutCause),
    Mutant("coordinator_ready_one_early", "READY published one subscription early",
           ec.CoordinatorReadyOneEarly),
    Mutant("coordinator_late_subscription_ignored", "a re-subscribing engine gets no READY",
           ec.CoordinatorLateSubscriptionIgnored),
    Mutant("rank_refusal_unexplained", "an out-of-range data_parallel_rank is refused "
           "without naming it", ec.RankRefusalUnexplained),
    Mutant("dp_control_unexplained", "DP control on the main output path fails the client "
           "with no cause", ec.DpControlUnexplained),
    # -- mutation survivors D (outputs, requests) --
    Mutant("add_without_eos", "ADDs carry no EOS token id", ed.AddWithoutEos),
    Mutant("add_default_temperature", "ADDs carry temperature 1.0 for a greedy request",
           ed.AddDefaultTemperature),
    Mutant("add_without_external_id", "ADDs carry no external_req_id",
           ed.AddWithoutExternalId),
    # -- the ADD's sampling and scheduling keys, the text of an engine STOP --
    Mutant("sampling_values_dropped", "top_p, top_k, min_p and seed never reach the ADD",
           mz.SamplingValuesDropped),
    Mutant("seed_zero_dropped", "a seed of 0 sent as no seed", mz.SeedZeroDropped),
    Mutant("sampling_of_first_request", "every non-greedy request carries the first one's "
           "sampling", mz.SamplingOfFirstRequest),
    Mutant("ignore_eos_still_stops", "ignore_eos requests still carry the EOS id",
           mz.IgnoreEosStillStops),
    Mutant("stop_ids_not_among_all_stop", "the client's stop token ids left out of "
           "_all_stop_token_ids", mz.StopIdsNotAmongAllStop),
    Mutant("min_tokens_dropped", "min_tokens never reaches the ADD", mz.MinTokensDropped),
    Mutant("stop_min_tokens_by_match_start", "with min_tokens, a stop string must start "
           "after the first min_tokens tokens", mz.StopMinTokensByMatchStart),
    Mutant("stop_min_tokens_off_by_one", "stop strings checked from token min_tokens, not "
           "min_tokens + 1", mz.StopMinTokensOffByOne),
    Mutant("prompt_limit_of_largest_engine", "a prompt checked against the largest "
           "max_model_len, not the agreed minimum", mz.PromptLimitOfLargestEngine),
    Mutant("prompt_filling_context_sent", "a prompt exactly max_model_len long is sent "
           "(no room left for one output token)", mz.PromptFillingContextSent),
    Mutant("min_tokens_equal_max_refused", "min_tokens equal to max_tokens refused",
           mz.MinTokensEqualMaxRefused),
    Mutant("continuation_greedy", "continuations built greedy whatever the session asked",
           mz.ContinuationGreedy),
    Mutant("plain_adds_resumable", "every ADD marked resumable", mz.PlainAddsResumable),
    Mutant("arrival_time_milliseconds", "arrival_time in milliseconds",
           mz.ArrivalTimeMilliseconds),
    Mutant("arrival_time_monotonic", "arrival_time from the monotonic clock",
           mz.ArrivalTimeMonotonic),
    Mutant("stop_token_text_shown", "the stop token of an engine STOP shown in the text",
           mz.StopTokenTextShown),
    Mutant("continuation_first_max_tokens", "continuations carry the session's first "
           "max_tokens", mz.ContinuationFirstMaxTokens),
    Mutant("death_spares_unstarted", "engine death fails only streams that had output",
           ee.DeathSparesUnstarted),
    Mutant("repeated_abort_id_fails", "an explicit abort naming an id twice fails, "
           "nothing aborted", ma.RepeatedAbortIdFails),
    Mutant("engine_abort_keeps_routing_slot", "requests the engine ends with ABORT or "
           "REPETITION keep their routing slots", ed.EngineAbortKeepsRoutingSlot),
    Mutant("drop_finished_by_client_id", "dropping a finished stream aborts the request "
           "now using its client id", ReferenceFrontendCore,
           frontend_class=ma.DropFinishedByClientId),
    Mutant("output_id_matched_by_prefix", "an output's id matched to a live request by "
           "prefix", ms.OutputIdMatchedByPrefix),
    Mutant("abort_matches_id_prefix", "an explicit abort also aborts live ids it is a "
           "prefix of", ma.AbortMatchesIdPrefix),
    Mutant("nil_counts_skipped", "a wave-only coordinator publication (counts nil) skipped",
           dp.NilCountsSkipped),
    Mutant("pinned_rank_not_stamped", "a pinned ADD does not carry its data_parallel_rank",
           ed.PinnedRankNotStamped),
    Mutant("request_error_message_dropped", "an engine's RequestError message never "
           "reaches the client", ed.RequestErrorMessageDropped),
    Mutant("inflight_reset_when_one_ends", "an engine's in-flight count reset when one of "
           "its requests ends", ed.InflightResetWhenOneEnds),
    Mutant("abort_keeps_routing_slot", "explicitly aborted requests keep counting for "
           "routing", ed.AbortKeepsRoutingSlot),
    Mutant("stop_end_keeps_routing_slot", "requests ended at a stop string keep counting "
           "for routing", ed.StopEndKeepsRoutingSlot),
    Mutant("embeds_copied_into_extra_args", "prompt_embeds also copied into extra_args",
           ed.EmbedsCopiedIntoExtraArgs),
    Mutant("load_report_waiting_ignored", "waiting requests in load reports ignored",
           ed.LoadReportWaitingIgnored),
    Mutant("scheduler_stats_not_routed", "scheduler_stats never count for routing",
           ed.SchedulerStatsNotRouted),
    Mutant("aborts_batched_over_one_second", "dropped streams aborted after a 1 s "
           "batching window", ed.AbortsBatchedOverOneSecond),
    Mutant("held_text_lost_at_finish", "stop-string hold-back text dropped when the "
           "engine ends the stream without a token", ed.HeldTextLostAtFinish),
    Mutant("load_reports_only_rise", "load reports never lower an engine's load",
           ed.LoadReportsOnlyRise),
    # -- mutation survivors E (utility, handshake, sessions) --
    Mutant("later_calls_refused_vaguely", "after engine death later calls are refused "
           "without the cause", ee.LaterCallsRefusedVaguely),
    Mutant("death_cause_not_recorded", "every failure recorded as a generic engine death "
           "(an undecodable frame or a lost connection is not named)",
           ee.DeathCauseNotRecorded),
    Mutant("utility_failure_without_method", "a failed utility call's error does not name "
           "the method", ee.UtilityFailureWithoutMethod),
    Mutant("block_size_disagreement_unexplained", "a block_size disagreement is refused "
           "without the values", ee.BlockSizeDisagreementUnexplained),
    Mutant("registration_refusals_unnamed", "an unusable or repeated registration is "
           "refused without naming the engine", ee.RegistrationRefusalsUnnamed),
    Mutant("ready_bound_hard_coded", "registrations accepted only within a fixed 4.5 s, "
           "not the configured startup bound", ee.ReadyBoundHardCoded),
    Mutant("coordinator_path_misuse_ignored", "request outputs or utility replies on the "
           "coordinator path are dropped; the client serves on",
           ee.CoordinatorPathMisuseIgnored),
    Mutant("session_refusals_unexplained", "a refused continuation or close does not say "
           "why (no session vs. closing)", ee.SessionRefusalsUnexplained),
])


_VLLM = "https://github.com/vllm-project/vllm/"

# Bug classes from vLLM's own history (docs/mutation-history.md). Not in the kill matrix:
# they measure the suite before cases are written for them; a row moves to MUTANTS once a
# case catches its mutant (and `make mutants KILL_MATRIX_ARGS=--incremental` records it).
HISTORY_MUTANTS: dict[str, Mutant] = _by_name([
    Mutant("hist_lb_first_engine_until_stats", "unpinned requests all go to the first "
           "engine until the first load report arrives", mh.FirstEngineUntilStats,
           source=_VLLM + "pull/22910"),
    Mutant("hist_lb_fixed_tie_break", "load ties always go to the lowest rank (no "
           "rotating scan start)", mh.FixedTieBreak, source=_VLLM + "pull/47420"),
    Mutant("hist_stop_first_listed", "of two stop strings completing in one token, the "
           "first listed wins, not the earliest in the text", mh.StopFirstListed,
           source=_VLLM + "pull/50200"),
    Mutant("hist_stop_at_token_end_only", "a stop string matches only where the text ends "
           "(aligned to a token end)", mh.StopAtTokenEndOnly, source=_VLLM + "pull/3672"),
    Mutant("hist_stop_no_holdback", "no text held back for stop strings: the start of one "
           "spanning tokens is streamed", mh.StopNoHoldback, source=_VLLM + "pull/3672"),
    Mutant("hist_prompt_text_leaked", "the prompt's text leaks into the first streamed "
           "delta", mh.PromptTextLeaked, source=_VLLM + "issues/48853"),
    Mutant("hist_id_freed_before_abort", "a dropped stream's id is freed before its ABORT "
           "is sent; a reuse of the id is aborted instead", mh.IdFreedBeforeAbort,
           source=_VLLM + "pull/24382"),
    Mutant("hist_abort_by_external_id", "engine-side ids suffixed, ABORTs sent with the "
           "client's id", mh.AbortByExternalId, source=_VLLM + "pull/27987"),
    Mutant("hist_abort_before_tracked_lost", "an explicit abort before the request's first "
           "output is lost", mh.AbortBeforeTrackedLost, source=_VLLM + "pull/47173"),
    Mutant("hist_rank_checked_against_count", "a pinned rank is checked against the engine "
           "count and addressed as a global index", mh.RankCheckedAgainstCount,
           source=_VLLM + "pull/51178"),
    Mutant("hist_stale_start_wave_rewinds", "a stale start_wave while paused rewinds the "
           "coordinator's wave", mh.StaleStartWaveRewinds, source=_VLLM + "pull/46833"),
    Mutant("hist_utility_engine_zero_answer", "every utility answered with engine 0's "
           "result", mh.UtilityEngineZeroAnswer, source=_VLLM + "pull/43429"),
    Mutant("hist_calls_pending_after_receiver_stop", "pending utility calls fail only on "
           "ENGINE_CORE_DEAD, not when the output path breaks otherwise",
           ReferenceFrontendCore, frontend_class=mh.CallsPendingAfterReceiverStop,
           source=_VLLM + "pull/56416"),
    Mutant("hist_late_reply_after_cancel_fatal", "a reply to a cancelled or timed-out "
           "utility call kills the client", mh.LateReplyAfterCancelFatal,
           source=_VLLM + "pull/56416"),
    Mutant("hist_connection_loss_not_death", "a lost engine connection is not engine "
           "death", mh.ConnectionLossNotDeath, source=_VLLM + "pull/21728"),
    Mutant("hist_kv_params_not_forwarded", "kv_transfer_params never reaches the ADD",
           mh.KvParamsNotForwarded, source=_VLLM + "pull/42644"),
    Mutant("hist_session_abort_is_boundary", "an engine ABORT of a session's segment is "
           "taken as a segment boundary", mh.SessionAbortIsBoundary,
           source=_VLLM + "pull/53861"),
    Mutant("hist_stop_within_min_tokens", "a stop string within the first min_tokens "
           "tokens ends the request", mh.StopWithinMinTokens, source=_VLLM + "pull/22014"),
    Mutant("hist_empty_prompt_sent", "an empty prompt is sent to the engine",
           mh.EmptyPromptSent, source=_VLLM + "pull/7746"),
    Mutant("hist_prompt_over_context_sent", "a prompt longer than max_model_len is sent "
           "to the engine", mh.PromptOverContextSent, source=_VLLM + "pull/45035"),
    Mutant("hist_min_tokens_over_max_sent", "a request with min_tokens above max_tokens is "
           "sent to the engine", mh.MinTokensOverMaxSent, source=_VLLM + "issues/4365"),
])


def _runnable(*tables: dict[str, Mutant]) -> dict[str, Mutant]:
    """Every mutant `mutant:NAME` can name; a name in two tables is refused."""
    return _by_name([mutant for table in tables for mutant in table.values()])


# What `--frontend mutant:NAME` resolves against: the kill matrix's and the history ones.
RUNNABLE_MUTANTS: dict[str, Mutant] = _runnable(MUTANTS, HISTORY_MUTANTS)


# Cases that no mutant is expected to fail, with the reason (reported in the kill matrix).
JUSTIFIED_IDLE_CASES: dict[str, str] = {
    "handshake.ready.empty_payload": "INFO case: it records what the frontend does with an "
                                     "empty ready payload and has no requirement to break",
    # INFO since the grounds audit: with one engine no engine reads current_wave
    # (core.py:518), so 0 is an unread default (the mutant that numbered waves from 1 went
    # with the requirement).
    "streaming.sessions_edges.single_engine_add_carries_wave_0":
        "INFO case: with one engine no engine relies on current_wave",
    "streaming.sessions_edges.single_engine_session_adds_carry_wave_0":
        "INFO case: with one engine no engine relies on current_wave",
}


def make_mutant_driver(name: str) -> ReferenceDriver:
    try:
        mutant = RUNNABLE_MUTANTS[name]
    except KeyError:
        raise ValueError(f"unknown mutant {name!r}; known: {sorted(RUNNABLE_MUTANTS)}"
                         ) from None
    return ReferenceDriver(mutant.core, name=f"mutant:{name}",
                           frontend_kwargs=mutant.frontend_kwargs,
                           frontend_class=mutant.frontend_class)
