"""What spawn.py sets in its agents' CLI environment to make them cheaper, and what the user keeps."""

from __future__ import annotations

import spawn


def test_telemetry_is_off_for_agents_unless_the_user_chose() -> None:
    assert spawn.quiet_cli_environment({}) == {"DISABLE_TELEMETRY": "1"}
    # The user's own choice, either way, is left as it is.
    assert spawn.quiet_cli_environment({"DISABLE_TELEMETRY": "0"}) == {}
    assert spawn.quiet_cli_environment({"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "0"}) == {}
