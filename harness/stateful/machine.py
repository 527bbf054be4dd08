"""The hypothesis state machine: random protocol sessions against one frontend core.

`FrontendMachine` drives a frontend core (the reference, or a mutant through
`core_factory`) against 1-3 mock engines with random interleavings of generate (optionally
with an explicit data_parallel_rank), drop, explicit abort, engine-side finish (scripted,
or triggered on a held request), utility calls with scripted per-engine answers, engine
death and, in the in-memory world, delivery itself. A suite that no random interleaving
can break proves little; this is where the conformance cases' hand-picked orderings get
company.

Every rule records itself (name and JSON arguments) and runs through `execute`, which is
also what replay (replay.py) calls, so a replay file re-runs exactly what hypothesis ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from harness.cases import helpers as case_helpers
from harness.frontends.api import FrontendError, StartupError
from harness.frontends.reference.core import ReferenceFrontendCore
from harness.frontends.reference.frontend import CoreFactory
from harness.protocol.timing import Timescale
from harness.protocol.vocab import token_text
from harness.protocol.wire import VLLM_0_33, codec_for
from harness.protocol.wire import messages as m
from harness.stateful.draws import (
    ANSWERS,
    CONFIG_SPACE,
    FINISH_REASONS,
    KILL_GATE,
    RECENT,
    SPEC_SPACE,
    UTILITIES,
    decode_answers,
    decode_config,
    decode_picks,
    decode_spec,
    expected_utility,
    finish_live,
    plan_steps,
)
from harness.stateful.invariants import InvariantViolation
from harness.stateful.model import RequestModel, WireModel
from harness.stateful.settings import stateful_timescale, stop_strings_enabled
from harness.stateful.worlds import TRANSPORTS, SansIOWorld, World, make_world
from mock_engines.script import EngineScript, Step, UtilityReply, default_ready, default_steps
from mock_engines.transcript import Record

RULES = ("init", "generate", "drop", "abort", "engine_finish", "kill_engine", "utility",
         "settle", "drain", "tick", "deliver")
# Engines with log_stats=True are drawn too (the busy-deadline bug this machine found in
# MockEngineCore is fixed and pinned by tests/test_stateful.py).
DRAW_LOG_STATS = True
PROFILE = VLLM_0_33  # the protocol the machine's worlds speak (frontend core, engines, model)


def _has_world(self: FrontendMachine) -> bool:
    return self.world is not None


def _sans_io(self: FrontendMachine) -> bool:
    return self.world is not None and self.world.sans_io


def _has_requests(self: FrontendMachine) -> bool:
    return self.model is not None and bool(self.model.order)


class FrontendMachine(RuleBasedStateMachine):
    """Random protocol sessions against a frontend core; see the module docstring.

    Every rule records itself (name and JSON arguments) and runs through `execute`, which
    is also what `replay()` calls, so a replay file re-runs exactly what hypothesis ran.
    """

    def __init__(self, core_factory: CoreFactory = ReferenceFrontendCore,
                 transport: str = "sansio", *, stop_strings: bool | None = None,
                 timescale: Timescale | None = None) -> None:
        super().__init__()
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; known: {TRANSPORTS}")
        self.core_factory = core_factory
        self.transport = transport
        self.timescale = stateful_timescale() if timescale is None else timescale
        # Whether generated requests may carry stop strings (recorded per request, so a
        # replay needs no flag). On by default: see STOP_STRINGS_ENV.
        self.stop_strings = stop_strings_enabled() if stop_strings is None else stop_strings
        self.steps: list[dict[str, Any]] = []
        self.world: World | None = None
        self.model: WireModel | None = None
        self.plan: dict[tuple[int, ...], list[Step]] = {}
        self.prompts = 0
        self.failure: InvariantViolation | None = None
        self.failed_step: int | str | None = None
        self.excerpt_records: list[Record] = []  # rendered only when a replay is written
        self.on_failure: Callable[[FrontendMachine], None] | None = None

    # ------------------------------------------------------------ execution

    def execute(self, rule_name: str, args: dict[str, Any]) -> None:
        """Run one recorded step and check every invariant after it."""
        if rule_name not in RULES:
            raise ValueError(f"unknown step {rule_name!r}; known: {RULES}")
        self.steps.append({"rule": rule_name, "args": args})
        self._guarded(len(self.steps) - 1, lambda: self._step(rule_name, args))

    def _step(self, rule_name: str, args: dict[str, Any]) -> None:
        getattr(self, f"_do_{rule_name}")(**args)
        self.check()

    def _guarded(self, where: int | str, action: Callable[[], None]) -> None:
        try:
            action()
        except InvariantViolation as exc:
            self._failed(exc, where)
            raise
        except StartupError as exc:
            violation = InvariantViolation("startup", str(exc))
            self._failed(violation, where)
            raise violation from exc
        except Exception as exc:
            violation = InvariantViolation("unexpected_exception",
                                           f"{type(exc).__name__}: {exc}")
            self._failed(violation, where)
            raise violation from exc

    def _failed(self, exc: InvariantViolation, where: int | str) -> None:
        if self.failure is not None:
            return
        self.failure, self.failed_step = exc, where
        exc.failed_step = where
        if self.world is not None:
            self.excerpt_records = self.world.records()[-60:]
        if self.on_failure is not None:
            self.on_failure(self)

    def check(self) -> None:
        """Raise the first invariant violation the probe or the stream checks found."""
        model = self.model
        if model is None:
            return
        if not model.violations:
            model.check_streams()
        if model.violations:
            raise model.violations[0]

    def _world(self) -> World:
        assert self.world is not None, "init has not run"
        return self.world

    def _model(self) -> WireModel:
        assert self.model is not None, "init has not run"
        return self.model

    def _pick(self, pick: int) -> RequestModel:
        order = self._model().order
        return order[-1 - pick % min(len(order), RECENT)]  # newest first; shrinks to newest

    # ------------------------------------------------------------ step bodies

    def _do_init(self, ranks: int, report_finished: bool,
                 ready: list[list[int]] | None = None, block_size: int = 16,
                 log_stats: bool = False) -> None:
        rank_list = list(range(ranks))
        ready = ready or [[1024, 1000] for _ in rank_list]
        self.model = model = WireModel(rank_list, codec=codec_for(PROFILE))
        scripts = [EngineScript(ready=default_ready(r, ranks, max_model_len=mml,
                                                    num_gpu_blocks=blocks,
                                                    block_size=block_size,
                                                    effective_attention_block_size=block_size),
                                default=self._steps_for, report_finished=report_finished,
                                log_stats=log_stats)
                   for r, (mml, blocks) in zip(rank_list, ready, strict=True)]
        self.world = world = make_world(self.transport, rank_list, self.core_factory, model,
                                        scripts, self.timescale)
        config = world.core.config
        want = (min(r[0] for r in ready), sum(r[1] for r in ready), block_size)
        got = (config.max_model_len, config.num_gpu_blocks, config.block_size)
        if got != want:
            model.fail("config_aggregation", f"engines sent [max_model_len, num_gpu_blocks] "
                       f"{ready} with block_size {block_size}: the frontend derived "
                       f"(max_model_len, num_gpu_blocks, block_size) = {got}, expected {want}")

    def _steps_for(self, request: m.EngineCoreRequest) -> list[Step]:
        key = tuple(request.prompt_token_ids or ())
        return list(self.plan[key]) if key in self.plan else default_steps(request)

    def _do_generate(self, requests: list[dict[str, Any]]) -> None:
        for spec in requests:
            self._generate_one(**spec)

    def _generate_one(self, kind: str, tokens: int, reason: str, interval_ms: int,
                      dp_rank: int | None, chunk: int = 1, stop_at: int | None = None) -> None:
        world, model = self._world(), self._model()
        n = self.prompts
        self.prompts += 1
        prompt = case_helpers.prompt(n)
        first = 100 + (n * 5) % 700  # three-digit ids: " tNNN" never prefixes another token
        self.plan[tuple(prompt)] = plan_steps(kind, tokens, reason, interval_ms / 1000, first,
                                              chunk)
        stop = None if stop_at is None else [" " + token_text(first + stop_at)]
        invalid = dp_rank is not None and dp_rank not in model.ranks
        try:
            world.generate(prompt, dp_rank, stop)
        except FrontendError as exc:
            if not (invalid or model.fe_dead):
                model.fail("no_spurious_errors", f"generate(dp_rank={dp_rank}) failed on a "
                           f"healthy frontend: {exc}")
            return
        # (accepting an invalid rank or a call after death is flagged by the probe)

    def _do_drop(self, picks: list[int]) -> None:
        if not self._model().order:
            return
        self._world().drop([self._pick(p).rid for p in picks])

    def _do_abort(self, picks: list[int], unknown: bool) -> None:
        model = self._model()
        ids = [self._pick(p).rid for p in picks] if model.order else []
        if unknown:
            ids.append(f"cw-unknown-{len(self.steps)}")
        try:
            self._world().abort(ids)
        except FrontendError as exc:
            if not model.fe_dead:
                model.fail("no_spurious_errors", f"abort({ids}) failed on a healthy "
                           f"frontend: {exc}")

    def _do_engine_finish(self, pick: int, reason: str) -> None:
        if not self._model().order:
            return
        rec = self._pick(pick)
        if rec.owner is None:
            return
        finish = FINISH_REASONS[reason]
        self._world().on_engine(rec.owner, lambda core, now: finish_live(core, rec.rid,
                                                                           finish, now))

    def _do_kill_engine(self, rank: int, gate: int) -> None:
        if gate != KILL_GATE:  # most draws are no-ops: death ends the interesting part
            return
        ranks = self._model().ranks
        self._world().on_engine(ranks[rank % len(ranks)],
                                lambda core, now: core.inject_dead(now))

    def _do_utility(self, method: str, answers: list[str]) -> None:
        world, model = self._world(), self._model()
        used = [answers[i % len(answers)] for i in range(len(model.ranks))]
        for rank, answer in zip(model.ranks, used, strict=True):
            world.script(rank).utilities[method] = (
                UtilityReply(failure=f"scripted {method} failure") if answer == "fail"
                else UtilityReply(answer == "true"))
        want_error, want = expected_utility(method, used)
        try:
            value = world.utility(method)
        except FrontendError as exc:
            if not want_error and not model.fe_dead:
                model.fail("no_spurious_errors", f"{method} failed although the engines "
                           f"answered {used}: {exc}")
            return
        if want_error:
            model.fail("utility_aggregation", f"{method} returned {value!r} although the "
                       f"engines answered {used} (expected an error)")
        elif value is not want:
            model.fail("utility_aggregation", f"{method} returned {value!r}; the engines "
                       f"answered {used}, so the answer is {want!r}")

    def _do_settle(self) -> None:
        world, model = self._world(), self._model()
        if not world.settle():
            model.fail("no_call_hangs", "the system did not quiesce within its bound")
            return
        model.check_settled(world.received_aborts(), world.protocol_errors())

    def _sans(self) -> SansIOWorld:
        world = self._world()
        assert isinstance(world, SansIOWorld), "a sans-IO-only step on a socket world"
        return world

    def _do_drain(self) -> None:
        self._sans().drain()

    def _do_tick(self, ms: int) -> None:
        self._sans().tick(ms / 1000)

    def _do_deliver(self, to: str, rank: int, count: int) -> None:
        """Deliver the next `count` frames queued between the frontend and one engine."""
        world = self._sans()
        target = world.ranks[rank % len(world.ranks)]
        if to == "engine":
            world.deliver_inputs(target, count)
        else:
            world.deliver_outputs(target, count)

    # ------------------------------------------------------------ rules

    @initialize(ranks=st.integers(1, 3), report_finished=st.booleans(),
                log_stats=st.booleans() if DRAW_LOG_STATS else st.just(False),
                config=st.integers(0, CONFIG_SPACE - 1))
    def init(self, ranks: int, report_finished: bool, log_stats: bool, config: int) -> None:
        ready, block_size = decode_config(config, ranks)
        self.execute("init", {"ranks": ranks, "report_finished": report_finished,
                              "log_stats": log_stats, "ready": ready,
                              "block_size": block_size})

    @precondition(_has_world)
    @rule(specs=st.lists(st.integers(0, SPEC_SPACE - 1), min_size=1, max_size=3))
    def generate(self, specs: list[int]) -> None:
        requests = [decode_spec(c) for c in specs]
        if not self.stop_strings:
            for spec in requests:
                spec["stop_at"] = None
        self.execute("generate", {"requests": requests})

    @precondition(_has_requests)
    @rule(picks=st.integers(1, 2 ** (RECENT + 1) - 1))
    def drop(self, picks: int) -> None:
        self.execute("drop", {"picks": decode_picks(picks) or [0]})

    @precondition(_has_world)
    @rule(picks=st.integers(0, 2 ** (RECENT + 2) - 1))
    def abort(self, picks: int) -> None:
        # bit 9: also abort an id the frontend never issued
        self.execute("abort", {"picks": decode_picks(picks), "unknown": bool(picks >> 9 & 1)})

    @precondition(_has_requests)
    @rule(pick=st.integers(0, RECENT - 1), reason=st.sampled_from(tuple(FINISH_REASONS)))
    def engine_finish(self, pick: int, reason: str) -> None:
        self.execute("engine_finish", {"pick": pick, "reason": reason})

    @precondition(_has_world)
    @rule(rank=st.integers(0, 2), gate=st.integers(0, KILL_GATE))
    def kill_engine(self, rank: int, gate: int) -> None:
        self.execute("kill_engine", {"rank": rank, "gate": gate})

    @precondition(_has_world)
    @rule(method=st.sampled_from(UTILITIES), answers=st.integers(0, len(ANSWERS) ** 3 - 1))
    def utility(self, method: str, answers: int) -> None:
        self.execute("utility", {"method": method, "answers": decode_answers(answers)})

    @precondition(_has_world)
    @rule()
    def settle(self) -> None:
        self.execute("settle", {})

    @precondition(_sans_io)
    @rule()
    def drain(self) -> None:
        self.execute("drain", {})

    @precondition(_sans_io)
    @rule(ms=st.sampled_from((0, 5, 10, 50)))
    def tick(self, ms: int) -> None:
        self.execute("tick", {"ms": ms})

    @precondition(_sans_io)
    @rule(to=st.sampled_from(("frontend", "engine")), rank=st.integers(0, 2),
          count=st.integers(1, 4))
    def deliver(self, to: str, rank: int, count: int) -> None:
        self.execute("deliver", {"to": to, "rank": rank, "count": count})

    def teardown(self) -> None:
        """Settle and run the settled checks (unless a step failed already), then close."""
        world = self.world
        if world is None:
            return
        try:
            if self.failure is None:
                self._guarded("teardown", self._final_checks)
        finally:
            self.world = None
            world.close()

    def _final_checks(self) -> None:
        self._do_settle()
        self.check()
