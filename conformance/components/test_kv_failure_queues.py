"""KV-load failures at the connector worker (seed PR #40364, semantics.md (d)).

The contract the scheduler's `kv_load_failure_policy` relies on: every failed receive --
handshake (raised on the background handshake thread), transfer setup, transfer state "ERR",
transfer exception -- is reported in `finished_recving` exactly once, only after all of its
transfer handles are released (a handle whose release fails is kept), without KV
post-processing, and with its block ids among the load errors no later than that pass.
Successful neighbours are unaffected. None of this is on the frontend wire, so these cases
drive the worker directly (harness.components); they start no engines and ignore --frontend.
The worker under test: $COREWIRE_KV_WORKER (reference | vllm-nixl | mutant:NAME).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conformance.components.helpers import require_none
from harness.cases.authoring import CaseContext, Level, case
from harness.components import (
    FakeTransport,
    KVWorkerRig,
    Outcome,
    RecvSpec,
    kv_worker_factory,
)

try:  # imported here: under pytest's assertion rewriting it takes seconds, not for a case
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
except ImportError:  # a runtime install without the dev extras: seeded random plans instead
    st = None  # type: ignore[assignment]

PR = "PR #40364"
OK_ENGINE = "prefill-ok"
BAD_ENGINE = "prefill-bad"
SETTLE = 2.0  # seconds (scaled) for every loaded request to be reported
EXTRA_PASSES = 5  # passes after that in which nothing may be reported again

def _rig(ctx: CaseContext, *, handshake_delay: float = 0.0) -> KVWorkerRig:
    name = ctx.config.component_unit("kv")
    ctx.note(f"KV worker under test: {name}")
    return KVWorkerRig(kv_worker_factory(name), FakeTransport(handshake_delay=handshake_delay))


def _spec(req_id: str, i: int, engine: str = OK_ENGINE, reads: int = 1) -> RecvSpec:
    """Request `i` owns blocks 4i+1..4i+3 (disjoint across requests)."""
    blocks = tuple(range(4 * i + 1, 4 * i + 4))
    return RecvSpec(req_id, blocks, blocks, engine, reads)


async def _settle(ctx: CaseContext, rig: KVWorkerRig, specs: Sequence[RecvSpec],
                  since: int = 0) -> None:
    """Passes until every request is reported (bounded), then a few more for duplicates."""
    ids = [s.req_id for s in specs]
    done = await rig.step_until(rig.all_reported(ids, since), ctx.t(SETTLE))
    for _ in range(EXTRA_PASSES):
        rig.step()
        await asyncio.sleep(0.001)
    missing = sorted(set(ids) - rig.reported_ids(since))
    ctx.require(done and not missing,
                expected=f"every request in finished_recving within {ctx.t(SETTLE):.1f}s",
                observed=f"never reported: {missing} after {len(rig.passes)} passes")


def _once_violations(rig: KVWorkerRig, specs: Sequence[RecvSpec], since: int = 0) -> list[str]:
    """Reported in exactly one pass, with none of its handles still held by the transport."""
    out: list[str] = []
    for s in specs:
        passes = rig.reported(s.req_id, since)
        if len(passes) != 1:
            out.append(f"{s.req_id} in finished_recving of passes {passes} (expected one)")
        elif held := rig.passes[passes[0]].outstanding.get(s.req_id, 0):
            out.append(f"{s.req_id} reported in pass {passes[0]} with {held} handle(s) "
                       "not released")
    return out


def _skip_violations(rig: KVWorkerRig, failed: Sequence[RecvSpec]) -> list[str]:
    return [f"{s.req_id} (failed) post-processed in passes {pp}"
            for s in failed if (pp := rig.post_processed(s.req_id))]


def _block_violations(rig: KVWorkerRig, failed: Sequence[RecvSpec], ok: Sequence[RecvSpec],
                      since: int = 0) -> list[str]:
    """Failed blocks among the load errors by the report pass; successful blocks never."""
    out: list[str] = []
    for s in failed:
        passes = rig.reported(s.req_id, since)
        if passes:
            missing = set(s.local_block_ids) - rig.invalid_through(passes[0], since)
            if missing:
                out.append(f"{s.req_id} reported in pass {passes[0]} but blocks "
                           f"{sorted(missing)} not among load errors by then")
    everything = rig.invalid_through(len(rig.passes), since)
    for s in ok:
        if wrong := set(s.local_block_ids) & everything:
            out.append(f"{s.req_id} (successful) blocks {sorted(wrong)} reported as errors")
    return out


def _ok_violations(rig: KVWorkerRig, ok: Sequence[RecvSpec], since: int = 0) -> list[str]:
    """Successful: reported once and post-processed exactly once, in that pass."""
    out = _once_violations(rig, ok, since)
    for s in ok:
        passes, pp = rig.reported(s.req_id, since), rig.post_processed(s.req_id)
        if len(pp) != 1 or pp[0] not in passes:
            out.append(f"{s.req_id} (successful) reported in passes {passes}, "
                       f"post-processed in passes {pp}")
    return out


async def _fail_one(ctx: CaseContext, rig: KVWorkerRig, flag: str) -> RecvSpec:
    """One request under a FailingNixlWrapper-style global flag, settled."""
    spec = _spec("r-fail", 0)
    setattr(rig.transport, flag, True)
    rig.load(spec)
    await _settle(ctx, rig, [spec])
    return spec


def _mixed_failures() -> tuple[list[RecvSpec], list[RecvSpec], Callable[[FakeTransport], None]]:
    """One request per failure mode (per-request faults) plus two successful ones."""
    failed = [_spec("f-handshake", 0, BAD_ENGINE), _spec("f-setup", 1), _spec("f-err", 2),
              _spec("f-raise", 3)]
    ok = [_spec("ok-a", 4), _spec("ok-b", 5)]

    def arm(t: FakeTransport) -> None:
        t.fail_handshake_for(BAD_ENGINE)
        t.script("f-setup", Outcome.SETUP_FAIL)
        t.script("f-err", Outcome.ERR)
        t.script("f-raise", Outcome.RAISE)

    return failed, ok, arm


# ---------------------------------------------------------------------------------------------
# Each failure mode, reported exactly once (FailingNixlWrapper's global flags).


@case("components.kv_failure.handshake_failure_reported_once", Level.MUST,
      "A request whose NIXL handshake fails (add_remote_agent raises on the background "
      "handshake thread) is handed to the main thread and reported in finished_recving "
      "exactly once, with no transfer handle left.",
      source=PR)
async def handshake_failure_reported_once(ctx: CaseContext) -> None:
    with _rig(ctx, handshake_delay=0.02) as rig:
        spec = await _fail_one(ctx, rig, "fail_handshake")
        require_none(ctx, _once_violations(rig, [spec]), "reported exactly once")
        threads = rig.transport.handshake_threads(OK_ENGINE)
        ctx.require(bool(threads) and threading.get_ident() not in threads,
                    expected="the handshake (and its failure) ran off the caller's thread, "
                             "so the thread hand-off was exercised",
                    observed=f"add_remote_agent threads {threads}, caller "
                             f"{threading.get_ident()}")
        ctx.note(f"reported in pass {rig.reported('r-fail')} of {len(rig.passes)}")


@case("components.kv_failure.transfer_setup_failure_reported_once", Level.MUST,
      "A request whose transfer setup fails (make_prepped_xfer raises) is reported in "
      "finished_recving exactly once, with no transfer handle left.",
      source=PR)
async def transfer_setup_failure_reported_once(ctx: CaseContext) -> None:
    with _rig(ctx) as rig:
        spec = await _fail_one(ctx, rig, "fail_transfer_setup")
        require_none(ctx, _once_violations(rig, [spec]), "reported exactly once")


@case("components.kv_failure.transfer_failed_reported_once", Level.MUST,
      "A request whose transfer ends in a bad state (check_xfer_state returns \"ERR\") is "
      "reported in finished_recving exactly once, after its handle is released.",
      source=PR)
async def transfer_failed_reported_once(ctx: CaseContext) -> None:
    with _rig(ctx) as rig:
        spec = await _fail_one(ctx, rig, "fail_transfer_state")
        require_none(ctx, _once_violations(rig, [spec]), "reported exactly once, handle released")


@case("components.kv_failure.transfer_exception_reported_once", Level.MUST,
      "A request whose transfer status check raises is reported in finished_recving exactly "
      "once, after its handle is released.",
      source=PR)
async def transfer_exception_reported_once(ctx: CaseContext) -> None:
    with _rig(ctx) as rig:
        spec = await _fail_one(ctx, rig, "fail_transfer_exception")
        require_none(ctx, _once_violations(rig, [spec]), "reported exactly once, handle released")


# ---------------------------------------------------------------------------------------------
# What a failed request must (not) do, all four modes side by side.


@case("components.kv_failure.failed_requests_skip_post_processing", Level.MUST,
      "Failed receives (handshake, transfer setup, \"ERR\" state, status exception) are still "
      "reported in finished_recving but their KV post-processing (host->device sync, layout "
      "conversion) is skipped.",
      source=PR)
async def failed_requests_skip_post_processing(ctx: CaseContext) -> None:
    failed, ok, arm = _mixed_failures()
    with _rig(ctx) as rig:
        arm(rig.transport)
        rig.load(*failed, *ok)
        await _settle(ctx, rig, [*failed, *ok])
        require_none(ctx, _skip_violations(rig, failed),
                     "no post-processing for any failed request")
        ctx.note(f"post-processed: {sorted(r for _, r in rig.hooks.calls())}")


@case("components.kv_failure.invalid_blocks_by_report_pass", Level.MUST,
      "The block ids of a failed receive are returned by get_block_ids_with_load_errors() no "
      "later than the pass whose get_finished() reports the request; blocks of successful "
      "requests never are.",
      source=f"{PR}; KVConnectorBase_V1.get_block_ids_with_load_errors")
async def invalid_blocks_by_report_pass(ctx: CaseContext) -> None:
    failed, ok, arm = _mixed_failures()
    with _rig(ctx) as rig:
        arm(rig.transport)
        rig.load(*failed, *ok)
        await _settle(ctx, rig, [*failed, *ok])
        require_none(ctx, _block_violations(rig, failed, ok),
                     "failed blocks reported by the report pass, no others")
        ctx.note("load errors by pass: " + ", ".join(
            f"{p.index}:{sorted(p.invalid_block_ids)}" for p in rig.passes if p.invalid_block_ids))


@case("components.kv_failure.not_reported_while_handle_outstanding", Level.MUST,
      "A request with several transfers, one of which fails (\"ERR\", status exception, or "
      "setup of a later read), is not reported while another of its handles is still in "
      "flight; once that one finishes it is reported exactly once, as failed.",
      source=f"{PR} (review: multi-rank race)")
async def not_reported_while_handle_outstanding(ctx: CaseContext) -> None:
    specs = [_spec("multi-err", 0, reads=2), _spec("multi-raise", 1, reads=2),
             _spec("multi-setup", 2, reads=2)]
    with _rig(ctx) as rig:
        rig.transport.script("multi-err", Outcome.HOLD, Outcome.ERR)
        rig.transport.script("multi-raise", Outcome.HOLD, Outcome.RAISE)
        rig.transport.script("multi-setup", Outcome.HOLD, Outcome.SETUP_FAIL)
        rig.load(*specs)
        posted = await rig.step_until(
            lambda: all(len(rig.transport.handles_of(s.req_id)) >= 1 for s in specs),
            ctx.t(SETTLE))
        ctx.require(posted, expected="the first read of each request posted",
                    observed={s.req_id: rig.transport.handles_of(s.req_id) for s in specs})
        for _ in range(2 * EXTRA_PASSES):  # the second reads fail in these passes
            rig.step()
            await asyncio.sleep(0.001)
        early = {s.req_id: rig.reported(s.req_id) for s in specs if rig.reported(s.req_id)}
        ctx.require(not early,
                    expected="no request reported while one of its handles is in flight",
                    observed=f"reported early (pass indices): {early}")
        held = {s.req_id: len(rig.transport.outstanding(s.req_id)) for s in specs}
        ctx.require(all(held.values()), expected="the in-flight handle is still held",
                    observed=f"outstanding handles: {held}")
        since = len(rig.passes)
        for s in specs:
            rig.transport.resolve(s.req_id, Outcome.DONE)
        await _settle(ctx, rig, specs, since)
        require_none(ctx, _once_violations(rig, specs, since) + _skip_violations(rig, specs)
                     + _block_violations(rig, specs, [], since),
                     "each reported once, as failed, after its last handle finished")


@case("components.kv_failure.release_failure_retains_handle", Level.MUST,
      "When releasing a failed transfer's handle fails, the handle is kept and its release "
      "retried; the request is reported (once, as failed) only after the release succeeds.",
      source=f"{PR}; 0.33 transfer_release_failed")
async def release_failure_retains_handle(ctx: CaseContext) -> None:
    spec, failures = _spec("r-release", 0), 3
    with _rig(ctx) as rig:
        rig.transport.script(spec.req_id, Outcome.ERR)
        rig.transport.fail_releases(spec.req_id, failures)
        rig.load(spec)
        retried = await rig.step_until(
            lambda: rig.transport.release_attempts(spec.req_id) >= failures
            or bool(rig.reported(spec.req_id)), ctx.t(SETTLE))
        early = rig.reported(spec.req_id)
        ctx.require(not early, expected="not reported while its handle cannot be released",
                    observed=f"reported in passes {early} after "
                             f"{rig.transport.release_attempts(spec.req_id)} release attempts")
        ctx.require(retried and bool(rig.transport.outstanding(spec.req_id)),
                    expected=f"{failures} failed release attempts, the handle still held",
                    observed=f"{rig.transport.release_attempts(spec.req_id)} attempts, "
                             f"outstanding {rig.transport.outstanding(spec.req_id)}")
        await _settle(ctx, rig, [spec])
        require_none(ctx, _once_violations(rig, [spec]) + _skip_violations(rig, [spec]),
                     "reported once, after the release succeeded")
        misuse = rig.transport.misuse()
        ctx.require(not misuse, expected="no double release or use after release",
                    observed=misuse)
        ctx.note(f"{rig.transport.release_attempts(spec.req_id)} release attempts; reported "
                 f"in pass {rig.reported(spec.req_id)}")


@case("components.kv_failure.successful_neighbours_post_processed", Level.MUST,
      "Requests whose KV arrived are reported once and post-processed exactly once, in the "
      "pass that reports them, also when failed requests finish in the same pass.",
      source=PR)
async def successful_neighbours_post_processed(ctx: CaseContext) -> None:
    failed, ok, arm = _mixed_failures()
    pair_ok, pair_err = _spec("pair-ok", 6), _spec("pair-err", 7)
    with _rig(ctx) as rig:
        arm(rig.transport)
        rig.transport.script(pair_ok.req_id, Outcome.HOLD)
        rig.transport.script(pair_err.req_id, Outcome.HOLD)
        rig.load(*failed, *ok, pair_ok, pair_err)
        await rig.step_until(
            lambda: bool(rig.transport.handles_of(pair_ok.req_id))
            and bool(rig.transport.handles_of(pair_err.req_id)), ctx.t(SETTLE))
        rig.transport.resolve(pair_ok.req_id, Outcome.DONE)  # both settle in the same pass
        rig.transport.resolve(pair_err.req_id, Outcome.ERR)
        all_failed, all_ok = [*failed, pair_err], [*ok, pair_ok]
        await _settle(ctx, rig, [*all_failed, *all_ok])
        require_none(ctx, _ok_violations(rig, all_ok), "successful requests post-processed")
        fail_ids = {s.req_id for s in all_failed}
        mixed = [p.index for p in rig.passes
                 if p.finished_recving & fail_ids and p.finished_recving - fail_ids]
        ctx.require(bool(mixed), expected="a pass reporting failed and successful requests "
                                          "together (else the case proves nothing)",
                    observed=[sorted(p.finished_recving) for p in rig.passes
                              if p.finished_recving])
        ctx.note(f"mixed passes: {mixed}")


# ---------------------------------------------------------------------------------------------
# Random mixes, failures injected concurrently from threads.

MODES = ("ok", "handshake", "setup", "err", "raise", "release", "held_ok", "held_err",
         "held_raise")
SUCCEEDS = {"ok", "held_ok"}
LAST_READ = {"ok": Outcome.DONE, "setup": Outcome.SETUP_FAIL, "err": Outcome.ERR,
             "raise": Outcome.RAISE, "release": Outcome.ERR, "handshake": Outcome.DONE}
RESOLUTION = {"held_ok": Outcome.DONE, "held_err": Outcome.ERR, "held_raise": Outcome.RAISE}
BUDGET = 1.5  # seconds of generated examples (unscaled: a runtime bound, not a wait)
EXAMPLE_SETTLE = 0.75  # seconds (scaled) for one example's requests to be reported


@dataclass(frozen=True)
class _Req:
    mode: str
    reads: int
    delay_ms: int  # injector delay before resolving a held transfer


@dataclass(frozen=True)
class _Plan:
    reqs: tuple[_Req, ...]
    batches: int  # start_load_kv calls the requests are spread over
    injectors: int  # threads resolving held transfers

    def brief(self) -> str:
        reqs = " ".join(f"{r.mode}x{r.reads}@{r.delay_ms}ms" for r in self.reqs)
        return f"{len(self.reqs)} reqs in {self.batches} batches, {self.injectors} " \
               f"injector threads: {reqs}"


def _random_plan(rnd: random.Random) -> _Plan:
    reqs = tuple(_Req(rnd.choice(MODES), rnd.randint(1, 2), rnd.randint(0, 4))
                 for _ in range(rnd.randint(1, 24)))
    return _Plan(reqs, rnd.randint(1, 3), rnd.randint(1, 4))


def _run_plan(rig: KVWorkerRig, plan: _Plan, n: int, settle: float) -> list[str]:
    """One example: load in batches while threads resolve held transfers; check everything."""
    since, t = len(rig.passes), rig.transport
    failed: list[RecvSpec] = []
    ok: list[RecvSpec] = []
    held: list[tuple[str, Outcome, float]] = []
    for i, r in enumerate(plan.reqs):
        rid, engine = f"mix{n}-{i}", OK_ENGINE
        if r.mode == "handshake":
            engine = f"{BAD_ENGINE}-{n}-{i}"
            t.fail_handshake_for(engine)
        if r.mode in RESOLUTION:
            t.script(rid, *[Outcome.HOLD] * r.reads)
            held.append((rid, RESOLUTION[r.mode], r.delay_ms / 1000))
        else:
            t.script(rid, *[Outcome.DONE] * (r.reads - 1), LAST_READ[r.mode])
        if r.mode == "release":
            t.fail_releases(rid, 1 + i % 2)
        blocks = tuple(range(100 * (n % 4) + 4 * i + 1, 100 * (n % 4) + 4 * i + 4))
        spec = RecvSpec(rid, blocks, blocks, engine, r.reads)
        (ok if r.mode in SUCCEEDS else failed).append(spec)
    specs = [*failed, *ok]
    random.Random(n).shuffle(specs)
    lanes = [held[k::plan.injectors] for k in range(plan.injectors)]

    def inject(lane: list[tuple[str, Outcome, float]]) -> None:
        for rid, outcome, delay in lane:
            time.sleep(delay)
            t.resolve(rid, outcome)

    threads = [threading.Thread(target=inject, args=(lane,), daemon=True) for lane in lanes]
    for k in range(plan.batches):
        rig.load(*specs[k::plan.batches])
        rig.step()
        if k == 0:
            for th in threads:
                th.start()
    done = rig.step_until_sync(rig.all_reported([s.req_id for s in specs], since), settle)
    for _ in range(3):
        rig.step()
    for th in threads:
        th.join(timeout=1.0)
    out: list[str] = []
    if not done:
        out.append(f"never reported: {sorted({s.req_id for s in specs} - rig.reported_ids())}")
    out += _once_violations(rig, specs, since) + _skip_violations(rig, failed)
    out += _block_violations(rig, failed, ok, since) + _ok_violations(rig, ok, since)
    leaked = {s.req_id: k for s in specs if (k := len(t.outstanding(s.req_id)))}
    if leaked:
        out.append(f"handles never released: {leaked}")
    return out


@case("components.kv_failure.concurrent_failure_mix", Level.MUST,
      "Under random mixes of successes and all failure modes across many requests, with "
      "handshake failures raised on the handshake thread and transfer outcomes injected from "
      "other threads, every request is reported exactly once, exactly the failed ones skip "
      "post-processing and have their blocks reported by their report pass, and no handle "
      "is leaked.",
      source=PR)
async def concurrent_failure_mix(ctx: CaseContext) -> None:
    start = time.monotonic()
    with _rig(ctx, handshake_delay=0.001) as rig:
        deadline: list[float] = []  # set by the first example: generator setup is not budgeted
        counter = itertools.count()
        ran: list[_Plan] = []
        failures: list[tuple[_Plan, list[str]]] = []

        def check(plan: _Plan) -> None:
            if not deadline:
                deadline.append(time.monotonic() + BUDGET)
            elif time.monotonic() > deadline[0]:
                return  # budget spent: further (and shrinking) examples are no-ops
            ran.append(plan)
            try:
                violations = _run_plan(rig, plan, next(counter), ctx.t(EXAMPLE_SETTLE))
            except Exception as exc:  # the worker itself blew up: that mix fails too
                violations = [f"worker raised {type(exc).__name__}: {exc}"]
            if violations:
                failures.append((plan, violations))
                raise AssertionError("; ".join(violations))

        generator = await asyncio.to_thread(_explore, check, lambda: bool(failures))
        elapsed = time.monotonic() - start
        total = sum(len(p.reqs) for p in ran)
        failing = sum(r.mode not in SUCCEEDS for p in ran for r in p.reqs)
        ctx.note(f"{len(ran)} mixes ({generator}), {total} requests, {failing} failing, "
                 f"{len(rig.passes)} passes, {elapsed:.2f}s")
        ctx.require(bool(ran), expected="at least one mix explored", observed="none")
        if failures:
            plan, violations = min(failures, key=lambda f: len(f[0].reqs))
            ctx.fail(expected="every mix honours the contract",
                     observed=f"{len(failures)} failing mix(es); smallest: {plan.brief()} "
                              f"-> {'; '.join(violations[:4])}")


def _explore(check: Callable[[_Plan], None], failures_seen: Callable[[], bool]) -> str:
    """Run `check` over generated plans: hypothesis where installed, else seeded random."""
    if st is None:
        rnd = random.Random(40364)
        for _ in range(200):
            try:
                check(_random_plan(rnd))
            except AssertionError:
                break
        return "seeded random"
    reqs = st.builds(_Req, st.sampled_from(MODES), st.integers(1, 2), st.integers(0, 4))
    plans = st.builds(_Plan, st.lists(reqs, min_size=1, max_size=24).map(tuple),
                      st.integers(1, 3), st.integers(1, 4))
    run = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                   print_blob=False, phases=(Phase.explicit, Phase.generate, Phase.shrink)
                   )(given(plans)(check))
    try:
        run()
    except Exception:
        if not failures_seen():  # not a contract failure: a harness or hypothesis error
            raise
    return "hypothesis"
