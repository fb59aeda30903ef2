"""The send-once rules of a script call (protocol.call, call_groups, call_replicated), driven by
scripted replies: what is sent again (NOSCRIPT, a missing function, MOVED, ASK, TRYAGAIN,
CLUSTERDOWN, a connection that could not be opened), what never is (a reply that may have been
lost), and how many times at most. Every test asserts the whole conversation: each operation
the protocol asked for, in order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    TryAgainError,
)

from django_redislua import protocol
from django_redislua.drivers import adrive, drive
from django_redislua.protocol import (
    CLUSTER_DOWN_PAUSE,
    CLUSTER_DOWN_SENDS,
    MOST_SENDS,
    TRY_AGAIN_PAUSE,
    Failed,
    Load,
    Pause,
    Refresh,
    Send,
    call,
    call_groups,
    call_replicated,
)
from tests.unit.scripted import AsyncScripted, FakeScript, Hang, Scripted, Unsent, command, names

SCRIPT = FakeScript()
LOAD = Load(SCRIPT.load_command())
ONE = command("k1", args=("a",))
TWO = command("k2", args=("b",))
FAILED = Failed(SCRIPT.name)


def sent(*groups: tuple[Any, tuple[Any, ...]], address: tuple[str, int] | None = None) -> Send:
    return Send(tuple(groups), address)


def run(proto: protocol.Protocol[Any], *script: Any) -> tuple[Any, Scripted]:
    transport = Scripted(list(script))
    result = drive(proto, transport)
    assert not transport.script, f"answers left unused: {transport.script}"
    return result, transport


def failing(proto: protocol.Protocol[Any], *script: Any) -> tuple[BaseException, Scripted]:
    transport = Scripted(list(script))
    with pytest.raises(BaseException) as raised:
        drive(proto, transport)
    assert not transport.script, f"answers left unused: {transport.script}"
    return raised.value, transport


# -- one server ---------------------------------------------------------------------------------

def test_a_call_is_one_send_of_its_command_routed_by_its_first_key() -> None:
    result, transport = run(call(SCRIPT, ONE), [[b"ok"]])
    assert result == b"ok"
    assert transport.log == [sent(("k1", (ONE,)))]


def test_a_call_without_keys_is_routed_anywhere() -> None:
    keyless = command()
    result, transport = run(call(SCRIPT, keyless), [[7]])
    assert result == 7
    assert transport.log == [sent((None, (keyless,)))]


def test_an_error_reply_is_raised_counted_and_not_sent_again() -> None:
    error = ResponseError("ERR user_script:1: boom")
    raised, transport = failing(call(SCRIPT, ONE), [[error]])
    assert raised is error
    assert transport.log == [sent(("k1", (ONE,))), FAILED]


def test_noscript_loads_the_script_then_sends_it_again_once() -> None:
    result, transport = run(call(SCRIPT, ONE), [[NoScriptError("No matching script")]], None,
                            [[b"ok"]])
    assert result == b"ok"
    assert transport.log == [sent(("k1", (ONE,))), LOAD, sent(("k1", (ONE,)))]


def test_a_missing_function_loads_the_library_then_sends_again() -> None:
    result, transport = run(call(SCRIPT, ONE), [[ResponseError("ERR Function not found")]],
                            None, [[b"ok"]])
    assert result == b"ok"
    assert names(transport.log) == ["Send", "Load", "Send"]


def test_a_call_that_found_the_script_missing_already_loads_it_first() -> None:
    result, transport = run(call(SCRIPT, ONE, loaded_first=True), None, [[b"ok"]])
    assert result == b"ok"
    assert transport.log == [LOAD, sent(("k1", (ONE,)))]


def test_a_failed_load_is_raised_and_counted_before_anything_is_sent_again() -> None:
    refused = ResponseError("ERR Error compiling script")
    raised, transport = failing(call(SCRIPT, ONE), [[NoScriptError("x")]], refused)
    assert raised is refused
    assert transport.log == [sent(("k1", (ONE,))), LOAD, FAILED]


def test_a_script_that_stays_missing_is_sent_at_most_most_sends_times() -> None:
    script = [item for _ in range(MOST_SENDS) for item in ([[NoScriptError("x")]], None)]
    raised, transport = failing(call(SCRIPT, ONE), *script[:-1])
    assert isinstance(raised, NoScriptError)
    assert names(transport.log) == ["Send", "Load"] * (MOST_SENDS - 1) + ["Send", "Failed"]


# -- lost replies: never sent again --------------------------------------------------------------

@pytest.mark.parametrize("lost", [redis.ConnectionError("Connection reset by peer"),
                                  redis.TimeoutError("Timeout reading from socket"),
                                  OSError("broken pipe")])
def test_a_reply_that_may_have_been_lost_raises_and_is_never_sent_again(
        lost: BaseException) -> None:
    raised, transport = failing(call(SCRIPT, ONE), lost, True)
    assert raised is lost
    # The slot table is read again (the next call finds a server that took over), nothing resent.
    assert transport.log == [sent(("k1", (ONE,))), Refresh(), FAILED]


def test_a_lost_reply_is_raised_even_when_reading_the_slot_table_fails_too() -> None:
    lost = redis.TimeoutError("Timeout reading from socket")
    raised, transport = failing(call(SCRIPT, ONE), lost, redis.ConnectionError("down"))
    assert raised is lost
    assert transport.log == [sent(("k1", (ONE,))), Refresh(), FAILED]


def test_a_connection_that_could_not_be_opened_is_tried_once_more_after_a_refresh() -> None:
    result, transport = run(call(SCRIPT, ONE), Unsent(redis.ConnectionError("refused")), True,
                            [[b"ok"]])
    assert result == b"ok"
    assert transport.log == [sent(("k1", (ONE,))), Refresh(), sent(("k1", (ONE,)))]


def test_a_refused_connection_to_a_single_server_is_not_tried_again() -> None:
    refused = redis.ConnectionError("Connection refused")
    raised, transport = failing(call(SCRIPT, ONE), Unsent(refused), False)
    assert raised is refused
    assert transport.log == [sent(("k1", (ONE,))), Refresh(), FAILED]


def test_a_connection_refused_twice_is_raised_without_a_third_try() -> None:
    second = redis.ConnectionError("refused again")
    raised, transport = failing(call(SCRIPT, ONE), Unsent(redis.ConnectionError("refused")),
                                True, Unsent(second))
    assert raised is second
    assert names(transport.log) == ["Send", "Refresh", "Send", "Failed"]


def test_an_interrupted_send_is_neither_counted_nor_sent_again() -> None:
    raised, transport = failing(call(SCRIPT, ONE), KeyboardInterrupt())
    assert isinstance(raised, KeyboardInterrupt)
    assert transport.log == [sent(("k1", (ONE,)))]


async def test_a_cancelled_send_is_neither_counted_nor_sent_again() -> None:
    transport = AsyncScripted([Hang()])
    task = asyncio.ensure_future(adrive(call(SCRIPT, ONE), transport))
    await transport.reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert transport.log == [sent(("k1", (ONE,)))]


# -- a cluster: redirects -----------------------------------------------------------------------

def test_moved_reads_the_slot_table_again_and_sends_again() -> None:
    result, transport = run(call(SCRIPT, ONE), [[MovedError("3999 127.0.0.1:7002")]], True,
                            [[b"ok"]])
    assert result == b"ok"
    assert transport.log == [sent(("k1", (ONE,))), Refresh(), sent(("k1", (ONE,)))]


def test_moved_then_noscript_loads_and_sends_once_more() -> None:
    result, transport = run(call(SCRIPT, ONE), [[MovedError("3999 127.0.0.1:7002")]], True,
                            [[NoScriptError("x")]], None, [[b"ok"]])
    assert result == b"ok"
    assert names(transport.log) == ["Send", "Refresh", "Send", "Load", "Send"]


def test_a_slot_that_keeps_moving_is_sent_at_most_most_sends_times() -> None:
    moved = [[MovedError("3999 127.0.0.1:7002")]]
    script = [item for _ in range(MOST_SENDS) for item in (moved, True)]
    raised, transport = failing(call(SCRIPT, ONE), *script[:-1])
    assert isinstance(raised, MovedError)
    assert names(transport.log) == ["Send", "Refresh"] * (MOST_SENDS - 1) + ["Send", "Failed"]


def test_ask_sends_asking_and_the_call_to_the_node_it_names_once() -> None:
    result, transport = run(call(SCRIPT, ONE), [[AskError("3999 127.0.0.1:7003")]],
                            [[b"OK", b"ok"]])
    assert result == b"ok"
    assert transport.log == [sent(("k1", (ONE,))),
                             sent((None, (("ASKING",), ONE)), address=("127.0.0.1", 7003))]


def test_ask_to_a_node_without_the_script_loads_it_and_asks_again() -> None:
    asked = sent((None, (("ASKING",), ONE)), address=("127.0.0.1", 7003))
    result, transport = run(call(SCRIPT, ONE), [[AskError("3999 127.0.0.1:7003")]],
                            [[b"OK", NoScriptError("x")]], None, [[b"OK", b"ok"]])
    assert result == b"ok"
    assert transport.log == [sent(("k1", (ONE,))), asked, LOAD, asked]


def test_ask_to_a_node_that_still_lacks_the_script_raises_after_two_asks() -> None:
    raised, transport = failing(call(SCRIPT, ONE), [[AskError("3999 127.0.0.1:7003")]],
                                [[b"OK", NoScriptError("x")]], None,
                                [[b"OK", NoScriptError("still")]])
    assert isinstance(raised, NoScriptError) and str(raised) == "still"
    assert names(transport.log) == ["Send", "Send", "Load", "Send", "Failed"]


def test_an_error_reply_of_the_asked_node_is_raised() -> None:
    error = ResponseError("ERR boom")
    raised, transport = failing(call(SCRIPT, ONE), [[AskError("3999 127.0.0.1:7003")]],
                                [[b"OK", error]])
    assert raised is error
    assert names(transport.log) == ["Send", "Send", "Failed"]


def test_tryagain_pauses_then_sends_again_without_reading_the_slot_table() -> None:
    transport = Scripted([[[TryAgainError("Multiple keys request during rehashing")]],
                          [[b"ok"]]])
    started = transport.clock.now
    assert drive(call(SCRIPT, ONE), transport) == b"ok"
    assert transport.log == [sent(("k1", (ONE,))), Pause(TRY_AGAIN_PAUSE), sent(("k1", (ONE,)))]
    assert transport.clock.now - started == pytest.approx(TRY_AGAIN_PAUSE)


def test_clusterdown_pauses_reads_the_slot_table_and_sends_again() -> None:
    result, transport = run(call(SCRIPT, ONE), [[ClusterDownError("The cluster is down")]],
                            True, [[b"ok"]])
    assert result == b"ok"
    assert transport.log == [sent(("k1", (ONE,))), Pause(CLUSTER_DOWN_PAUSE), Refresh(),
                             sent(("k1", (ONE,)))]


def test_a_cluster_that_stays_down_is_given_cluster_down_sends_then_raised() -> None:
    down = [[ClusterDownError("The cluster is down")]]
    script = [item for _ in range(CLUSTER_DOWN_SENDS) for item in (down, True)]
    transport = Scripted(script[:-1])
    started = transport.clock.now
    with pytest.raises(ClusterDownError):
        drive(call(SCRIPT, ONE), transport)
    assert not transport.script
    assert names(transport.log) == (["Send", "Pause", "Refresh"] * (CLUSTER_DOWN_SENDS - 1)
                                    + ["Send", "Failed"])
    # The failover's window the call waits out, in virtual time: 9 pauses of a quarter second.
    assert transport.clock.now - started == pytest.approx(
        (CLUSTER_DOWN_SENDS - 1) * CLUSTER_DOWN_PAUSE)


def test_clusterdown_sends_do_not_count_against_the_redirect_limit() -> None:
    down = [[ClusterDownError("The cluster is down")]]
    moved = [[MovedError("3999 127.0.0.1:7002")]]
    # MOST_SENDS - 1 moves with downs between them: every send is allowed, the last one lands.
    script = [down, True, *(item for _ in range(MOST_SENDS - 1) for item in (moved, True)),
              [[b"ok"]]]
    result, transport = run(call(SCRIPT, ONE), *script)
    assert result == b"ok"
    assert names(transport.log).count("Send") == MOST_SENDS + 1


# -- several calls in one send (a rule of several policies; one per slot on a cluster) ----------

def test_calls_are_grouped_by_first_key_and_all_written_in_one_send() -> None:
    same = command("k1", args=("c",))
    result, transport = run(call_groups(SCRIPT, [ONE, TWO, same]), [[b"r1", b"r3"], [b"r2"]])
    assert result == [b"r1", b"r2", b"r3"]
    assert transport.log == [sent(("k1", (ONE, same)), ("k2", (TWO,)))]


def test_only_the_calls_that_did_not_run_are_sent_again() -> None:
    result, transport = run(call_groups(SCRIPT, [ONE, TWO]),
                            [[b"r1"], [MovedError("3999 127.0.0.1:7002")]], True, [[b"r2"]])
    assert result == [b"r1", b"r2"]
    assert transport.log == [sent(("k1", (ONE,)), ("k2", (TWO,))), Refresh(),
                             sent(("k2", (TWO,)))]


def test_a_call_asked_elsewhere_is_sent_there_while_the_others_landed() -> None:
    result, transport = run(call_groups(SCRIPT, [ONE, TWO]),
                            [[b"r1"], [AskError("3999 127.0.0.1:7003")]], [[b"OK", b"r2"]])
    assert result == [b"r1", b"r2"]
    assert names(transport.log) == ["Send", "Send"]


def test_an_ask_and_a_move_in_one_send_are_each_followed() -> None:
    result, transport = run(call_groups(SCRIPT, [ONE, TWO]),
                            [[AskError("3999 127.0.0.1:7003")],
                             [MovedError("3999 127.0.0.1:7002")]],
                            [[b"OK", b"r1"]], True, [[b"r2"]])
    assert result == [b"r1", b"r2"]
    assert transport.log[1] == sent((None, (("ASKING",), ONE)), address=("127.0.0.1", 7003))
    assert transport.log[2:] == [Refresh(), sent(("k2", (TWO,)))]


def test_a_down_cluster_pauses_the_quarter_second_even_when_a_slot_says_tryagain() -> None:
    result, transport = run(call_groups(SCRIPT, [ONE, TWO]),
                            [[TryAgainError("x")], [ClusterDownError("down")]], True,
                            [[b"r1"], [b"r2"]])
    assert result == [b"r1", b"r2"]
    assert transport.log[1:3] == [Pause(CLUSTER_DOWN_PAUSE), Refresh()]


def test_the_first_error_is_raised_once_every_call_was_answered() -> None:
    first, second = ResponseError("ERR one"), ResponseError("ERR two")
    raised, transport = failing(call_groups(SCRIPT, [ONE, TWO]), [[first], [second]])
    assert raised is first
    assert names(transport.log) == ["Send", "Failed"]


def test_only_the_calls_that_found_the_script_missing_are_sent_again() -> None:
    result, transport = run(call_groups(SCRIPT, [ONE, TWO]), [[NoScriptError("x")], [b"r2"]],
                            None, [[b"r1"]])
    assert result == [b"r1", b"r2"]
    assert transport.log == [sent(("k1", (ONE,)), ("k2", (TWO,))), LOAD, sent(("k1", (ONE,)))]


# -- with WAIT after the call (call_replicated) --------------------------------------------------

WAIT = ("WAIT", 1, 100)


def test_a_replicated_call_is_followed_by_wait_on_the_same_connection() -> None:
    result, transport = run(call_replicated(SCRIPT, ONE, 1, 100), [[b"ok", 1]])
    assert result == (b"ok", 1)
    assert transport.log == [sent(("k1", (ONE, WAIT)))]


def test_a_failed_wait_is_raised() -> None:
    error = ResponseError("ERR WAIT cannot be used with replica instances")
    raised, _transport = failing(call_replicated(SCRIPT, ONE, 1, 100), [[b"ok", error]])
    assert raised is error


def test_a_replicated_call_that_failed_raises_its_error_not_wait_s_reply() -> None:
    error = ResponseError("ERR boom")
    raised, _transport = failing(call_replicated(SCRIPT, ONE, 1, 100), [[error, 0]])
    assert raised is error


def test_a_replicated_call_without_its_script_loads_it_and_sends_both_again() -> None:
    result, transport = run(call_replicated(SCRIPT, ONE, 1, 100), [[NoScriptError("x"), 0]],
                            None, [[b"ok", 1]])
    assert result == (b"ok", 1)
    assert transport.log == [sent(("k1", (ONE, WAIT))), LOAD, sent(("k1", (ONE, WAIT)))]


def test_a_replicated_call_asked_elsewhere_waits_there() -> None:
    result, transport = run(call_replicated(SCRIPT, ONE, 1, 100),
                            [[AskError("3999 127.0.0.1:7003"), 0]], [[b"OK", b"ok", 1]])
    assert result == (b"ok", 1)
    assert transport.log[1] == sent((None, (("ASKING",), ONE, WAIT)),
                                    address=("127.0.0.1", 7003))


def test_a_replicated_call_asked_elsewhere_raises_the_error_it_met_there() -> None:
    error = ResponseError("ERR boom")
    raised, _transport = failing(call_replicated(SCRIPT, ONE, 1, 100),
                                 [[AskError("3999 127.0.0.1:7003"), 0]], [[b"OK", error, 0]])
    assert raised is error


# -- the predicates ------------------------------------------------------------------------------

@pytest.mark.parametrize(("reply", "expected"), [
    (protocol.MISSING, True),
    (NoScriptError("No matching script"), True),
    (ResponseError("ERR Function not found"), True),
    (ResponseError("ERR boom"), False),
    (MovedError("1 127.0.0.1:1"), False),
    (b"function not found", False),
    (None, False),
])
def test_missing(reply: object, expected: bool) -> None:
    assert protocol.missing(reply) is expected
