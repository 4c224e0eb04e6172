"""run: one agent, from its flags to its committed outcome.

The runner, the plan from flags and environment, the executors (the claude
CLI through the SDK, A2A, command), in-process children, the fork server and
the broker of a sandboxed spawner. A module here imports only run/ and the
layers below it.
"""
