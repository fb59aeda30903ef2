from django_redislua import Policy


def test_hit_is_one_evalsha(recorder):
    policy = Policy("smoke", rate="5/m", algorithm="gcra")
    policy.hit("warm")  # the first call after SCRIPT FLUSH loads the script
    with recorder:
        policy.hit("k")
    assert recorder.commands == ["EVALSHA"]
    assert "GET" in recorder.script_commands
