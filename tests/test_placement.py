"""Placement: parsing --placement, narrowing it down the tree, and where a child runs (pure)."""

from __future__ import annotations

import pytest

import spawn


def policy(text: str) -> spawn.PlacementPolicy:
    return spawn.parse_policy(text)


def test_parse_accepts_the_four_placements() -> None:
    assert [str(policy(t)) for t in ("local", "inprocess", "auto", "ray:10.0.0.1:6379")] == [
        "local",
        "inprocess",
        "auto",
        "ray:10.0.0.1:6379",
    ]
    assert policy(" ray:auto ").address == "auto"


@pytest.mark.parametrize("text", ["", "remote", "ray", "ray:", "ray: ", "local:x", "inprocess:1", "ray:a b", "LOCAL"])
def test_parse_refuses_anything_else_with_what_to_use(text: str) -> None:
    with pytest.raises(spawn.PlacementError) as caught:
        policy(text)
    assert caught.value.exit_code == spawn.ExitCode.USAGE
    assert "ray:" in caught.value.message


def test_a_root_gets_what_it_asks_for_and_local_by_default() -> None:
    assert spawn.narrow_policy(None, None) == (policy("local"), None)
    assert spawn.narrow_policy(policy("ray:h:1"), None) == (policy("ray:h:1"), None)


ORDER = ["inprocess", "auto", "local", "ray:h:1"]


@pytest.mark.parametrize("parent", ORDER)
@pytest.mark.parametrize("child", ORDER)
def test_a_child_only_narrows(parent: str, child: str) -> None:
    got, warning = spawn.narrow_policy(policy(child), policy(parent))
    if ORDER.index(child) <= ORDER.index(parent):
        assert (got, warning) == (policy(child), None)
    else:
        assert got == policy(parent) and warning is not None and "lowered" in warning


def test_a_child_inherits_without_asking_and_never_moves_to_another_cluster() -> None:
    assert spawn.narrow_policy(None, policy("inprocess")) == (policy("inprocess"), None)
    assert spawn.narrow_policy(policy("ray:h:1"), policy("ray:h:1"))[0] == policy("ray:h:1")
    with pytest.raises(spawn.PlacementError, match="never move to another"):
        spawn.narrow_policy(policy("ray:other:2"), policy("ray:h:1"))


def test_auto_gives_a_process_to_a_child_that_needs_one_and_says_why() -> None:
    needs = spawn.process_needs(sandbox=True, deadline=True)
    decision = spawn.decide_placement(policy("auto"), needs, by_agent_tool=False, is_root=False)
    assert decision.backend == "local" and "its own sandbox" in decision.reason and "a hard deadline" in decision.reason
    assert decision.as_record() == {"backend": "local", "reason": decision.reason, "policy": "auto"}
    with pytest.raises(spawn.PlacementError, match="needs a process"):
        spawn.decide_placement(policy("auto"), needs, by_agent_tool=True, is_root=False)
    inside = spawn.decide_placement(policy("auto"), [], by_agent_tool=True, is_root=False)
    assert inside.backend == "inprocess" and "nothing it needs requires a process" in inside.reason


def test_needs_name_each_thing_only_a_process_gives() -> None:
    assert spawn.process_needs() == []
    assert spawn.process_needs(own_cwd=True, budget=True, kind="a2a", cluster=True) == [
        "its own working directory", "a hard budget", "another kind of node (a2a)", "a cluster placement"
    ]  # fmt: skip


def test_inprocess_keeps_its_children_in_process() -> None:
    assert spawn.decide_placement(policy("inprocess"), [], by_agent_tool=True, is_root=False).backend == "inprocess"
    with pytest.raises(spawn.PlacementError, match="Agent tool"):
        spawn.decide_placement(policy("inprocess"), [], by_agent_tool=False, is_root=False)
    assert spawn.decide_placement(policy("inprocess"), [], by_agent_tool=False, is_root=True).backend == "local"
    with pytest.raises(spawn.PlacementError, match="not as a process"):
        spawn.decide_placement(policy("local"), [], by_agent_tool=True, is_root=False)


def test_ray_is_parsed_and_decided() -> None:
    decision = spawn.decide_placement(policy("ray:h:1"), [], by_agent_tool=False, is_root=True)
    assert decision.backend == "ray" and decision.policy == "ray:h:1"


def test_subagent_depth_limit_counts_the_levels_left() -> None:
    assert spawn.subagent_depth_limit(0, 3) == 3
    assert spawn.subagent_depth_limit(1, 3) == 2
    assert spawn.subagent_depth_limit(3, 3) == 0
    assert spawn.subagent_depth_limit(4, 3) == 0


def test_an_in_process_agent_is_alive_with_its_host_and_never_signalled() -> None:
    import os
    import signal

    import psutil

    me = psutil.Process()
    hosted = spawn.Supervised(os.getpid(), me.create_time(), hosted=True)
    assert hosted.alive() and hosted.process() is None and hosted.signal(signal.SIGTERM) is None
    assert not spawn.Supervised(os.getpid(), me.create_time() - 10, hosted=True).alive()


def test_a_subagents_answer_is_its_last_message_as_json() -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    assert spawn.checked_answer(schema, '```json\n{"n": 1}\n```') == ({"n": 1}, [])
    assert spawn.checked_answer(schema, "n is one") == (None, ["(root): the answer is not JSON"])
    output, errors = spawn.checked_answer(schema, '{"n": "one"}')
    assert output == {"n": "one"} and errors


def test_a_subagents_tools_are_within_its_parents_and_lose_agent_at_the_limit() -> None:
    assert spawn.narrowed_tools(["Agent", "Read", "Bash"], None, 1, 3) == ["Agent", "Read", "Bash"]
    assert spawn.narrowed_tools(["Agent", "Read"], ["Read", "Write"], 1, 3) == ["Read"]
    assert spawn.narrowed_tools(["Agent", "Read"], None, 3, 3) == ["Read"]
