"""The drivers (drive, adrive, drive_step, stepped, adrive_step, keep_running) on a scripted
transport: a failure is thrown into the protocol where it waits; on asyncio a cancellation is
too, and the clean-up the protocol yields then runs to its end, shielded, before the caller sees
the cancellation (a second one leaves it running in the background)."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from django_redislua import drivers
from django_redislua.drivers import adrive, adrive_step, drive, drive_step, keep_running, stepped
from django_redislua.protocol import Call, Execute, Failed, Invoke, Protocol, Send
from tests.unit.scripted import (
    AsyncScripted,
    FakeScript,
    Held,
    Scripted,
    Swallowed,
    command,
    names,
)

GET = Execute(("GET", "k"))
UNDO = Execute(("DEL", "k"))


def guarded() -> Protocol[Any]:
    """Reads, and on any failure there gives back (one more operation), then re-raises."""
    try:
        return (yield GET)
    except BaseException:
        yield UNDO
        raise


def recovering() -> Protocol[Any]:
    """A failure thrown in is caught: the protocol goes on and returns what it read next."""
    try:
        yield GET
    except redis.ConnectionError:
        return (yield GET)
    return None


# -- sync ---------------------------------------------------------------------------------------

def test_drive_returns_what_the_protocol_returns() -> None:
    transport = Scripted([b"v"])
    assert drive(guarded(), transport) == b"v"
    assert transport.log == [GET]


def test_drive_throws_a_failure_in_where_the_protocol_waits() -> None:
    transport = Scripted([redis.ConnectionError("lost"), b"v"])
    assert drive(recovering(), transport) == b"v"
    assert transport.log == [GET, GET]


def test_drive_runs_the_clean_up_a_failure_leads_to_before_raising_it() -> None:
    transport = Scripted([KeyboardInterrupt(), 1])
    with pytest.raises(KeyboardInterrupt):
        drive(guarded(), transport)
    assert transport.log == [GET, UNDO]


def test_drive_throws_a_given_failure_in_first() -> None:
    started = guarded()
    transport = Scripted([1])
    assert started.send(None) == GET  # the protocol waits at its first operation
    with pytest.raises(TimeoutError):
        drive(started, transport, TimeoutError("from the caller"))
    assert transport.log == [UNDO]


@dataclass
class OneCall:
    """A drivers.Step: a decision with its script call, or ``decided`` without one."""

    decided: Any = None
    script: Any = field(default_factory=FakeScript)
    command: tuple[Any, ...] = field(default_factory=lambda: command("k"))
    failures: list[BaseException] = field(default_factory=list)

    def result(self, reply: Any) -> Any:
        return ("decided by", reply)

    def failed(self, failure: BaseException) -> Protocol[Any]:
        self.failures.append(failure)
        yield Failed(self.script.name)
        raise failure


def test_drive_step_without_a_call_sends_nothing() -> None:
    transport = Scripted()
    assert drive_step(OneCall(decided="cached"), transport) == "cached"
    assert transport.log == []


def test_drive_step_makes_one_call_and_reads_its_reply() -> None:
    step = OneCall()
    transport = Scripted([[[b"r"]]])
    assert drive_step(step, transport) == ("decided by", b"r")
    assert names(transport.log) == ["Call", "Send"]
    assert transport.log[0] == Call(step.script, step.command)


def test_drive_step_hands_a_failure_to_the_step_s_protocol() -> None:
    step = OneCall()
    lost = redis.TimeoutError("lost")
    transport = Scripted([lost, True])
    with pytest.raises(redis.TimeoutError):
        drive_step(step, transport)
    assert step.failures == [lost]
    assert names(transport.log) == ["Call", "Send", "Refresh", "Failed", "Failed"]


# -- asyncio ------------------------------------------------------------------------------------

async def test_adrive_returns_what_the_protocol_returns() -> None:
    transport = AsyncScripted([b"v"])
    assert await adrive(guarded(), transport) == b"v"


async def test_adrive_throws_a_failure_in_where_the_protocol_waits() -> None:
    transport = AsyncScripted([redis.ConnectionError("lost"), b"v"])
    assert await adrive(recovering(), transport) == b"v"
    assert transport.log == [GET, GET]


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), ValueError("x")])
async def test_adrive_runs_the_clean_up_a_failure_leads_to_before_raising_it(
        failure: BaseException) -> None:
    transport = AsyncScripted([failure, 1])
    with pytest.raises(type(failure)):
        await adrive(guarded(), transport)
    assert transport.log == [GET, UNDO]


async def test_a_cancellation_is_thrown_in_and_the_clean_up_runs_before_it_is_raised() -> None:
    transport = AsyncScripted([1], cancel_at=0)
    task = asyncio.ensure_future(adrive(guarded(), transport))
    await transport.reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert transport.log == [GET, UNDO]
    assert not transport.script


async def cancelled_again(task: asyncio.Future[Any], transport: AsyncScripted,
                          release: asyncio.Event) -> None:
    """``task``, whose clean-up waits for ``release``, cancelled again: it ends at once, and
    its clean-up is held in the background until it ends."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    kept = [held for held in drivers._background if not held.done()]
    assert len(kept) == 1  # held until it ends
    release.set()
    await asyncio.wait(kept)
    assert not transport.script and kept[0] not in drivers._background


async def test_a_second_cancellation_leaves_the_clean_up_running_in_the_background() -> None:
    release = asyncio.Event()
    transport = AsyncScripted([Held(release, 1)], cancel_at=0)
    task = asyncio.ensure_future(adrive(guarded(), transport))
    await transport.reached.wait()
    task.cancel()
    for _ in range(5):  # the clean-up starts and waits for its reply
        await asyncio.sleep(0)
    assert transport.log == [GET, UNDO]
    await cancelled_again(task, transport, release)


async def test_a_cancellation_lost_on_its_way_is_raised_after_the_operation() -> None:
    transport = AsyncScripted([Swallowed(b"v"), 1])
    task = asyncio.ensure_future(adrive(guarded(), transport))
    with pytest.raises(asyncio.CancelledError):
        await task
    # GET's reply came, but the task was cancelled meanwhile: the protocol sees the
    # cancellation there and gives back.
    assert transport.log == [GET, UNDO]


async def test_a_task_that_cancels_itself_in_an_operation_is_cancelled_right_after_it() -> None:
    def cancelling_itself() -> Protocol[Any]:
        try:
            yield Invoke(lambda: None, (), cancel_own_task)  # application code
        except asyncio.CancelledError:
            yield UNDO
            raise
        yield GET  # never: the cancellation is thrown in where the Invoke was

    async def cancel_own_task() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # requested while the task runs: delivered at its next suspension

    transport = AsyncScripted([1])
    task = asyncio.ensure_future(adrive(cancelling_itself(), transport))
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(5):  # the clean-up, left running apart (its shield met the request again)
        await asyncio.sleep(0)
    assert names(transport.log) == ["Invoke", "Execute"] and transport.log[1] == UNDO


async def test_a_protocol_cannot_swallow_a_cancellation() -> None:
    def swallowing() -> Protocol[Any]:
        try:
            yield GET
        except asyncio.CancelledError:
            return (yield UNDO)
        return None

    transport = AsyncScripted([1], cancel_at=0)
    task = asyncio.ensure_future(adrive(swallowing(), transport))
    await transport.reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert transport.log == [GET, UNDO]


def test_adrive_outside_a_task_cannot_count_cancellations_and_still_runs() -> None:
    loop = asyncio.new_event_loop()
    try:
        transport = AsyncScripted([b"v"])
        outcome: list[Any] = []

        def step_by_hand() -> None:  # a loop callback: no current task
            coroutine = adrive(guarded(), transport)
            with pytest.raises(StopIteration) as ended:
                coroutine.send(None)  # every scripted operation completes without suspending
            outcome.append(ended.value.value)

        loop.call_soon(step_by_hand)
        loop.call_soon(loop.stop)
        loop.run_forever()
    finally:
        loop.close()
    assert outcome == [b"v"]


async def test_adrive_step_and_stepped_are_drive_step_s_twins() -> None:
    assert await adrive_step(OneCall(decided="cached"), AsyncScripted()) == "cached"
    step = OneCall()
    transport = AsyncScripted([[[b"r"]]])
    assert await adrive_step(step, transport) == ("decided by", b"r")
    assert names(transport.log) == ["Call", "Send"]
    lost = redis.TimeoutError("lost")
    transport = AsyncScripted([lost, True])
    with pytest.raises(redis.TimeoutError):
        await adrive(stepped(step), transport)
    assert step.failures == [lost]
    assert names(transport.log) == ["Call", "Send", "Refresh", "Failed", "Failed"]


async def test_adrive_step_hands_a_failure_to_the_step_s_protocol() -> None:
    step = OneCall()
    lost = redis.TimeoutError("lost")
    transport = AsyncScripted([lost, True])
    with pytest.raises(redis.TimeoutError):
        await adrive_step(step, transport)
    assert step.failures == [lost]
    assert names(transport.log) == ["Call", "Send", "Refresh", "Failed", "Failed"]


async def test_adrive_step_cancelled_in_its_call_runs_the_step_s_clean_up_first() -> None:
    step = OneCall()
    transport = AsyncScripted([True], cancel_at=0)
    task = asyncio.ensure_future(adrive_step(step, transport))
    await transport.reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [type(failure) for failure in step.failures] == [asyncio.CancelledError]
    assert names(transport.log) == ["Call", "Failed"]


@dataclass
class UndoingCall(OneCall):
    """A step whose failure gives something back in Redis (a concurrency lease's ZREM)."""

    def failed(self, failure: BaseException) -> Protocol[Any]:
        self.failures.append(failure)
        yield UNDO
        raise failure


async def test_adrive_step_cancelled_again_leaves_the_clean_up_running() -> None:
    release = asyncio.Event()
    step = UndoingCall()
    transport = AsyncScripted([Held(release, 1)], cancel_at=0)
    task = asyncio.ensure_future(adrive_step(step, transport))
    await transport.reached.wait()
    task.cancel()
    for _ in range(5):  # the clean-up starts and waits for its reply
        await asyncio.sleep(0)
    assert transport.log[1:] == [UNDO]
    await cancelled_again(task, transport, release)


class DirectCall(AsyncScripted):
    """A server's asyncio transport: ``call`` awaits its exchange itself (no protocol inside
    it, whose own driver would notice a lost cancellation first)."""

    async def call(self, script: Any, command: tuple[Any, ...]) -> Any:
        return (await self.perform(Send(((None, (command,)),))))[0][0]


async def test_adrive_step_raises_a_cancellation_lost_in_its_call_after_it() -> None:
    step = OneCall()
    transport = DirectCall([Swallowed([[b"r"]]), True])
    with pytest.raises(asyncio.CancelledError):
        await asyncio.ensure_future(adrive_step(step, transport))
    # The reply came, but the task was cancelled meanwhile: the step is not decided by it,
    # its clean-up runs (a concurrency slot the call took is given back).
    assert [type(failure) for failure in step.failures] == [asyncio.CancelledError]
    assert names(transport.log) == ["Send", "Failed"]


async def test_invoke_awaits_the_asynchronous_twin_on_asyncio() -> None:
    async def fetched(x: int) -> int:
        return x + 1

    def invoking() -> Protocol[Any]:
        return (yield Invoke(lambda x: x - 1, (41,), fetched))

    assert await adrive(invoking(), AsyncScripted()) == 42
    assert drive(invoking(), Scripted()) == 40


# -- keep_running --------------------------------------------------------------------------------

def test_a_task_of_a_closed_loop_is_let_go() -> None:
    async def never() -> None:
        await asyncio.Event().wait()

    old = asyncio.new_event_loop()
    stale = old.create_task(never())
    keep_running(stale)
    assert stale in drivers._background
    old.run_until_complete(asyncio.sleep(0))
    old.close()  # the task never ends: its loop is gone

    async def another() -> None:
        keep_running(asyncio.ensure_future(asyncio.sleep(0)))

    asyncio.run(another())
    assert stale not in drivers._background
    del stale
    gc.collect()


async def test_a_kept_task_s_outcome_is_consumed_whatever_it_is() -> None:
    async def failing() -> None:
        raise ValueError("nobody awaits this")

    async def hanging() -> None:
        await asyncio.Event().wait()

    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(
        context))
    failed = asyncio.ensure_future(failing())
    cancelled = asyncio.ensure_future(hanging())
    keep_running(failed)
    keep_running(cancelled)
    cancelled.cancel()
    await asyncio.wait([failed, cancelled])
    await asyncio.sleep(0)  # the done callbacks run
    assert failed not in drivers._background and cancelled not in drivers._background
    del failed, cancelled
    gc.collect()  # an unconsumed exception would be reported as the task is collected
    assert reported == []
